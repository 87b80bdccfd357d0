"""The generic stages, once, over every builtin tower (vision/224x224, vision/dynamic, text):
the export gate, FP16 and onnxsim variants, the calibration set, the ort engine (exact against the
one-model-per-op method, shardable) and the profile (met, built, re-measured independently)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from conftest import TOL_FP16, TOL_FP32, run_settings

from vlsens import variants
from vlsens.core.errors import ParityError
from vlsens.data.cases import Cases
from vlsens.data.samples import Samples
from vlsens.export import parity, stages
from vlsens.sensitivity.ranking import read_csv


def _logits(built) -> bool:
    """Text graphs (``logits`` out): KL and top-1 are measured too."""
    return built.tower.logits


def _record(folder):
    return json.loads((folder / "parity.json").read_text())


def test_export_gates_every_graph_file_of_the_tower(built):
    rec = _record(built.folder("fp32"))
    assert rec["passed"] and rec["variant"] == "fp32"
    assert rec["metrics"]["max_rel_error"] <= TOL_FP32["max_rel_error"]
    assert {p["graph"] for p in rec["per_input"]} == set(built.tower.files)  # no graph file ungated
    for f in built.tower.files:
        assert (built.folder("fp32") / f).is_file() and (built.folder("fp32") / f"{f}.data").is_file()
        assert {f, f"{f}.data"} <= set(rec["files"])  # hashed in the record consumers check
    cases = Cases.load(built.reference)
    assert [p["case"] for p in rec["per_input"]] == [c.name for c in cases]
    assert rec["reference"] == cases.source and "transformers" in rec["reference"]


def _sabotage(src_dir, dst_dir, graph):
    """Copy of a folder whose ``graph`` has one weight matrix changed after export."""
    from onnx import numpy_helper

    from vlsens.core.onnxutil import save_with_external_data

    shutil.copytree(src_dir, dst_dir)
    model = onnx.load(str(src_dir / graph), load_external_data=True)
    target = max(model.graph.initializer, key=lambda i: int(np.prod(i.dims)) if len(i.dims) == 2 else 0)
    arr = numpy_helper.to_array(target).copy()
    arr.flat[:: max(1, arr.size // 64)] += 20 * (np.abs(arr).max() + 1.0)
    target.CopyFrom(numpy_helper.from_array(arr, target.name))
    save_with_external_data(model, dst_dir / graph)


def test_sabotaged_graph_fails_the_gate(built, tmp_path):
    cases = Cases.load(built.reference)
    models = {f: built.folder("fp32") / f for f in built.tower.files}
    assert parity.check(models, cases, TOL_FP32, "fp32")["passed"]  # the unmodified folder passes
    for graph in built.tower.files:  # a change to any one graph file is caught
        bad = tmp_path / graph.replace(".", "_")
        _sabotage(built.folder("fp32"), bad, graph)
        with pytest.raises(ParityError) as e:
            parity.check({f: bad / f for f in built.tower.files}, cases, TOL_FP32, "fp32")
        assert e.value.record["passed"] is False and "No model was written" in str(e.value)
        failed = {p["graph"] for p in e.value.record["per_input"] if p["cosine"] < TOL_FP32["min_cosine"]}
        assert failed == {graph}


def test_failed_gate_leaves_nothing(built, tmp_path):
    out = tmp_path / "fp32"
    with pytest.raises(ParityError):
        stages.export(built.tower, built.ckpt, built.reference, out, {"min_cosine": 1.0, "max_rel_error": 1e-30},
                      built.tower.export_settings())
    assert not out.exists() or list(out.iterdir()) == []


def test_a_changed_graph_file_fails_its_reader_with_the_fix(built, tmp_path):
    """Every graph file of a folder is checked against parity.json when a job reads it; the fix
    names the folder's main graph (what Snakemake knows the folder by)."""
    from vlsens.core.artifacts import verify
    from vlsens.core.errors import ArtifactError

    for f in built.tower.files:
        copy = tmp_path / f.replace(".", "_")
        shutil.copytree(built.folder("fp32"), copy)
        assert verify(copy / f) == copy / f
        data = copy / f"{f}.data"
        data.write_bytes(data.read_bytes()[:-8])
        with pytest.raises(ArtifactError, match=rf"{f}\.data: .*bytes.*--forcerun {copy}/model\.onnx"):
            verify(copy / f)


@pytest.fixture(scope="module")
def built_variants(built):
    """fp16, fp32-sim and fp16-sim of the graph (once per tower)."""
    if not built.folder("fp16").exists():
        variants.fp16(built.folder("fp32"), built.reference, built.folder("fp16"), TOL_FP16, 512, 65504)
    if "fp32-sim" in built.tower.variants() and not built.folder("fp32-sim").exists():
        for base, tol in (("fp32", TOL_FP32), ("fp16", TOL_FP16)):
            variants.simplify(built.folder(base), built.reference, built.folder(f"{base}-sim"), tol, f"{base}-sim",
                              2_000_000_000)
    return built


def test_fp16_variant_converts_every_graph_file(built_variants):
    b = built_variants
    rec = _record(b.folder("fp16"))
    assert rec["passed"] and set(rec["extra"]["graphs"]) == set(b.tower.files)
    assert {p["graph"] for p in rec["per_input"]} == set(b.tower.files)
    for f in b.tower.files:
        m = onnx.load(str(b.folder("fp16") / f), load_external_data=False)
        assert all(i.type.tensor_type.elem_type != onnx.TensorProto.FLOAT16 for i in m.graph.input)  # I/O kept
        dt = [i.data_type for i in m.graph.initializer]
        assert dt.count(onnx.TensorProto.FLOAT16) > dt.count(onnx.TensorProto.FLOAT), f
        facts = rec["extra"]["graphs"][f]
        assert facts["observed_max_activation"] > 0 and "fp32_fallback" in facts


def test_simplified_variants_shrink_and_stay_general(built_variants):
    b = built_variants
    if "fp32-sim" not in b.tower.variants():
        pytest.skip(f"tower {b.tower.kind} builds no onnxsim variants")
    cases = [p["case"] for p in _record(b.folder("fp32"))["per_input"]]
    for v in ("fp32-sim", "fp16-sim"):
        rec = _record(b.folder(v))
        assert rec["passed"] and rec["variant"] == v
        # simplification must not have baked one input size: the gate ran every case through it
        assert [p["case"] for p in rec["per_input"]] == cases
        for f in b.tower.files:
            g = rec["extra"]["graphs"][f]
            assert g["nodes_after"] < g["nodes_before"]
            # onnxsim's own check runs on FP32 sources; FP16 ones are judged by the gate alone
            assert g["onnxsim_check"] == ("passed" if v == "fp32-sim" else "skipped: FP16 source (the gate judges)")
            assert (b.folder(v) / f"{f}.data").is_file()


def test_calibration_set(built):
    man = json.loads((built.calib / "manifest.json").read_text())
    assert man["graph"] == built.tower.graph
    by = {s: [e for e in man["samples"] if e["split"] == s] for s in ("calib", "eval")}
    assert man["counts"] == {s: len(v) for s, v in by.items()} and all(by.values())
    assert not {e["name"] for e in by["calib"]} & {e["name"] for e in by["eval"]}
    model = built.model(analysed=True)
    for s in ("calib", "eval"):
        samples = Samples.load(built.calib / f"{s}.npz", model)
        assert samples.count == man["counts"][s] and samples.names == [e["name"] for e in by[s]]
        sess_inputs = {i.name for i in onnx.load(str(model), load_external_data=False).graph.input}
        assert all(set(f) == sess_inputs for f in samples.feeds)
        if _logits(built):  # the positions a user reads count: real tokens not predicting an image placeholder
            assert all(v is not None and v.sum() == e["measured"] for v, e in zip(samples.valid, by[s]))
            assert all((e["measured"] < e["tokens"]) == bool(e["images"]) for e in by[s]), by[s]


@pytest.fixture(scope="module")
def engine(built, tmp_path_factory):
    from vlsens.sensitivity.stages import gather, prepare, run_shard

    root = tmp_path_factory.mktemp("engine")
    ev = built.calib / "eval.npz"
    prepare(built.model(analysed=True), built.calib / "calib.npz", ev, root / "engine", run_settings(),
            logits=built.tower.logits)
    shards = [root / f"ort.{i}-of-3.csv" for i in range(3)]
    for i, p in enumerate(shards):
        run_shard(root / "engine", ev, i, 3, p)
    gather(root / "engine", ev, shards, root / "ort.csv", root / "ort.json")
    return root


def test_engine_equals_one_model_per_op(built, engine, tmp_path):
    """The switch model's outputs equal quantize_static(nodes_to_quantize=[k]) + a fresh session,
    feed by feed, for every op of every tower; and so do the CSV's numbers."""
    from vlsens.sensitivity.baseline import straightforward_sensitivity
    from vlsens.sensitivity.engine import Engine

    eng = Engine(engine / "engine")
    evals = eng.samples(built.calib / "eval.npz")
    session = eng.session(evals)
    reference = eng.reference()
    rows, _, outs = straightforward_sensitivity(eng.float_model, eng.ops, eng.settings, eng.cache, evals,
                                                list(reference), tmp_path, logits=eng.logits)
    for op, expected in zip(eng.ops, outs):
        got = list(session.outputs([op.name]))
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e, err_msg=op.name)
    csv = {r["op"]: r for r in read_csv(engine / "ort.csv")}
    for row in rows:
        assert csv[row["op"]]["mse"] == pytest.approx(row["mse"], rel=1e-6), row["op"]
    assert len(csv) == len(eng.ops) > 10


def test_suffix_engine_equals_the_full_graph_on_every_op(built, engine, tmp_path):
    """Starting each op at its cut, from the cached float state, gives the full-graph switch
    model's outputs, bit for bit, for every op (and for op sets, and for no op at all); and the
    prepared engine really has several cuts that skip a prefix."""
    import random

    from vlsens.sensitivity.engine import Engine

    eng = Engine(engine / "engine")
    sp = eng.suffix_plan
    assert sp is not None and len(sp.cuts) > 1 and sp.skips[-1] > 0, sp
    evals = eng.samples(built.calib / "eval.npz")
    full = eng.session(evals)
    suffix = eng.session(evals, cache_dir=tmp_path / "cache")
    assert suffix.suffix is not None and full.suffix is None
    names = [o.name for o in eng.ops]
    rng = random.Random(1)
    sets = [[n] for n in names] + [[], rng.sample(names, 3), names[len(names) // 2:]]
    skipped = 0
    for ops in sets:
        skipped += sp.skips[sp.group_of(ops)] > 0
        for a, b in zip(full.outputs(ops), suffix.outputs(ops), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=str(ops[:3]))
    assert skipped > len(names) // 2  # most ops really start past a skipped prefix
    # The CSV (written by shards that ran the suffix engine) holds the full graph's numbers.
    csv = {r["op"]: r for r in read_csv(engine / "ort.csv")}
    ref = eng.reference()
    for n in names[:: max(1, len(names) // 5)]:
        assert csv[n]["mse"] == pytest.approx(full.evaluate([n], ref)["mse"], rel=1e-6), n
    timing = json.loads((engine / "ort.0-of-3.json").read_text())
    assert timing["suffix"] is True


def test_estimate_of_an_op_set_equals_the_built_model(built, engine, tmp_path):
    """What the profile search sees for a *set* of INT8 ops (the switch model) is what
    quantize_static builds for that set, output for output, in the same fake-quant (basic
    optimizations) session: random sets, every tower."""
    import random

    from vlsens.core.onnxutil import make_session
    from vlsens.quantize.qdq import quantize
    from vlsens.sensitivity.engine import Engine

    eng = Engine(engine / "engine")
    evals = eng.samples(built.calib / "eval.npz")
    session = eng.session(evals)
    names = [o.name for o in eng.ops]
    rng = random.Random(0)
    for trial in range(3):
        chosen = rng.sample(names, rng.randint(2, len(names)))
        built_model = quantize(eng.float_model, tmp_path / f"set{trial}" / "model.onnx", chosen, eng.settings,
                               eng.cache)
        fake_quant = make_session(built_model, basic=True)
        for est, feed in zip(session.outputs(chosen), evals.feeds):
            np.testing.assert_array_equal(est, fake_quant.run(None, feed)[0], err_msg=f"{len(chosen)} ops")


def test_sharded_equals_unsharded(built, engine, tmp_path):
    from vlsens.sensitivity.stages import gather, run_shard

    ev = built.calib / "eval.npz"
    one = tmp_path / "ort.0-of-1.csv"
    run_shard(engine / "engine", ev, 0, 1, one)
    gather(engine / "engine", ev, [one], tmp_path / "ort.csv", tmp_path / "ort.json")
    a, b = read_csv(engine / "ort.csv"), read_csv(tmp_path / "ort.csv")
    assert [(r["op"], r["rank"], r["mse"]) for r in a] == [(r["op"], r["rank"], r["mse"]) for r in b]
    side = json.loads((engine / "ort.json").read_text())
    assert side["ops"] == len(a) and side["shards"] == 3 and 1e-5 < side["seconds_per_op"] < 60 \
        and 1e-5 < side["floor_seconds"] < 600
    assert list(a[0])[-2:] == (["kl", "top1"] if _logits(built) else ["cosine", "sqnr_db"])


def test_profile_meets_its_target_and_is_remeasured(built, engine, tmp_path):
    """The tower's own target (vision: cosine, text: KL per token); the written model, measured
    here with fresh sessions against the float graph, is what eval.json says."""
    import onnxruntime as ort

    from vlsens.core.metrics import Metrics
    from vlsens.precision.int8 import ProfileSettings, build_profile

    s = built.tower.profile_settings()
    out = tmp_path / "profile"
    rec = build_profile(engine / "engine", engine / "ort.csv", built.calib / "eval.npz",
                        {"fp32": built.model(analysed=True)}, out, ProfileSettings(s["metric"], s["target"]))
    assert rec["status"] == "met" and rec["meets_target"] and rec["int8_ops"] > 0
    evals = Samples.load(built.calib / "eval.npz", built.model(analysed=True))
    q = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    f = ort.InferenceSession(str(built.model(analysed=True)), providers=["CPUExecutionProvider"])
    acc = Metrics(logits=_logits(built))
    for feed, valid in zip(evals.feeds, evals.valid):
        acc.add(q.run(None, feed)[0], f.run(None, feed)[0], valid)
    got = acc.result()
    assert got[s["metric"]] == pytest.approx(rec["measured"][s["metric"]], rel=1e-3, abs=1e-9)
    assert json.loads((out / "eval.json").read_text())["files"]["model.onnx"]["bytes"] == (out / "model.onnx").stat().st_size
