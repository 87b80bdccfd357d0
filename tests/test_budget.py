"""The whole-VLM byte budget: plans rebuild their folder exactly, the front is the Pareto set of
the parts' combinations, and on the tiny decoder the searched curve, the plans and the built
decoders agree with the engine."""

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from vlsens.budget import front as fr
from vlsens.budget.plan import Plan, build_decoder
from vlsens.core.errors import ConfigError, VlsensError
from vlsens.core.onnxutil import model_bytes
from vlsens.quantize.nbits import NBitsSettings, quantized_nodes, weight_matmuls
from vlsens.sensitivity import nbits as nb


def _plan(**changes) -> Plan:
    d = {"name": "p1", "vision": "int8-mixed", "embedding": "int4",
         "decoder": {"/a/MatMul": 4, "/b/MatMul": 8, "/c/MatMul": 0, "/lm_head/MatMul": 8},
         "settings": NBitsSettings().as_dict(), "estimate": {"bytes": 1234, "kl": 0.01}}
    return Plan(**{**d, **changes})


def test_plan_round_trip_and_digest(tmp_path):
    p = _plan()
    path = p.save(tmp_path / "p1.yaml")
    text = path.read_text()
    assert text.startswith("# ") and "Rebuild" in text
    assert Plan.load(path) == p
    assert Plan.load(path).digest() == p.digest()
    assert p.bits_summary() == {"int4": 1, "int8": 2, "float": 1}
    # the name and the estimate do not change what is built
    assert _plan(name="other", estimate={"kl": 9.0}).digest() == p.digest()
    # settings completed: the defaults given or left out are the same folder
    assert _plan(settings={}).digest() == p.digest()
    # one bit, one format or one setting is another folder
    assert _plan(decoder={**p.decoder, "/c/MatMul": 4}).digest() != p.digest()
    assert _plan(vision="fp16").digest() != p.digest()
    assert _plan(settings={**p.settings, "block_size": 64}).digest() != p.digest()


@pytest.mark.parametrize("change, key", [
    (lambda d: d["decoder"].update({"/b/MatMul": 3}), "decoder"),
    (lambda d: d.update(vision="int2"), "vision"),
    (lambda d: d.update(embedding="fp8"), "embedding"),
    (lambda d: d.pop("decoder"), "decoder"),
    (lambda d: d["settings"].update(block_size=24), "settings"),
])
def test_a_bad_plan_file_names_the_file_and_the_key(tmp_path, change, key):
    path = _plan().save(tmp_path / "bad.yaml")
    d = yaml.safe_load(path.read_text())
    change(d)
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match=key) as e:
        Plan.load(path)
    assert str(path) in str(e.value)


def _curve():
    """Decoder points (bytes, KL); the third is dominated by the second."""
    pts = [(100, 1.0), (200, 0.3), (250, 0.35), (400, 0.1), (800, 0.0)]
    return [{"budget": b, "bytes": b, "kl": k, "bits": {"op": i}} for i, (b, k) in enumerate(pts)]


COMPONENTS = {"vision": {"fp16": {"bytes": 300, "kl": 0.0}, "int4": {"bytes": 80, "kl": 0.2}},
              "embedding": {"fp32": {"bytes": 200, "kl": 0.0}, "int4": {"bytes": 30, "kl": 0.05}}}


def _brute_pareto(points):
    return sorted((p for p in points if not any(q["bytes"] <= p["bytes"] and q["kl"] <= p["kl"] and
                                                (q["bytes"] < p["bytes"] or q["kl"] < p["kl"]) for q in points)),
                  key=lambda p: p["bytes"])


def test_combine_is_the_pareto_set_of_the_additive_estimates():
    front = fr.combine(_curve(), COMPONENTS, other_bytes=10)
    every = [{"bytes": d["bytes"] + 10 + v["bytes"] + e["bytes"], "kl": d["kl"] + v["kl"] + e["kl"]}
             for d in _curve() for v in COMPONENTS["vision"].values() for e in COMPONENTS["embedding"].values()]
    want = _brute_pareto(every)
    assert [(p["bytes"], p["kl"]) for p in front] == [(p["bytes"], p["kl"]) for p in want]
    assert all(p["decoder"] != 2 for p in front)  # the dominated decoder point is in no front point
    assert len(front) < len(every)
    one = front[0]
    assert (one["vision"], one["embedding"], one["decoder"]) == ("int4", "int4", 0)
    assert one["bytes"] == sum(part["bytes"] for part in one["parts"].values())
    assert front[-1]["kl"] == 0.0 and [p["bytes"] for p in front] == sorted(p["bytes"] for p in front)
    with pytest.raises(ConfigError, match="vision"):
        fr.combine(_curve(), {**COMPONENTS, "vision": {"int3": {"bytes": 1, "kl": 0.0}}}, 0)


def test_pick_spreads_distinct_points_over_the_front():
    front = [{"bytes": b, "kl": 1.0 / b} for b in (100, 101, 102, 103, 150, 300, 1000, 1010, 5000, 10000)]
    got = fr.pick(front, 5)
    b = [p["bytes"] for p in got]
    assert len(b) == 5 == len(set(b)) and b == sorted(b)
    assert b[0] == 100 and b[-1] == 10000
    # the middle of the widest gap each time (log bytes): 1000, then 5000 (1000..10000), then 300
    assert b == [100, 300, 1000, 5000, 10000]
    # crowded at the bottom: only gaps with points inside are filled
    crowded = [{"bytes": x, "kl": 1.0 / x} for x in (100, 101, 102, 103, 10000)]
    assert [p["bytes"] for p in fr.pick(crowded, 4)] == [100, 101, 103, 10000]
    assert fr.pick(front[:3], 8) == front[:3]
    with pytest.raises(ValueError):
        fr.pick(front, 1)


def test_pick_keeps_the_anchor_points_and_fills_wide_gaps():
    """The points at the anchors' bytes are picked and count towards ``points``; the widest gaps
    are filled on until none is wider than GAP_FACTOR x the even spacing (here one more point)."""
    front = [{"bytes": b, "kl": 1.0 / b} for b in (100, 101, 102, 103, 150, 300, 1000, 1010, 5000, 10000)]
    got = [p["bytes"] for p in fr.pick(front, 5, [front[4], front[7]])]
    assert got == [100, 150, 300, 1010, 5000, 10000]
    between = [(a, b) for a, b in zip(got, got[1:]) if any(a < p["bytes"] < b for p in front)]
    assert between and max(math.log(b / a) for a, b in between) <= fr.GAP_FACTOR * math.log(10000 / 100) / 4
    # anchors and ends already more than ``points``, no gap wider than GAP_FACTOR spacings: none added
    assert [p["bytes"] for p in fr.pick(front, 3, front[4:8])] == [100, 150, 300, 1000, 1010, 10000]
    with pytest.raises(ValueError, match="not on the front"):
        fr.pick(front, 5, [{"bytes": 7, "kl": 1.0}])


# -- the tiny decoder ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(graph_builder, tmp_path_factory):
    """The tiny decoder's nbits engine and its sensitivity CSV, as tests/test_nbits.py prepares them."""
    b = graph_builder("decoder")
    folder = tmp_path_factory.mktemp("budget")
    settings = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4)
    nb.prepare(b.model("fp32"), b.calib / "eval.npz", folder / "engine", settings, threads=2, logits=True)
    nb.sensitivity(folder / "engine", b.calib / "eval.npz", folder / "nbits.csv", folder / "nbits.json", 2)
    return b, folder


def _rows(folder):
    import pandas as pd

    return pd.read_csv(folder / "nbits.csv").to_dict("records")


def _components(rows):
    """Vision and embedding formats whose bytes are comparable with the tiny decoder's."""
    full = sum(r["bytes_float"] for r in rows)
    return {"vision": {"fp16": {"bytes": full // 4, "kl": 0.0}, "int8-mixed": {"bytes": full // 8, "kl": 2e-4},
                       "int4": {"bytes": full // 16, "kl": 1e-3}},
            "embedding": {"fp32": {"bytes": full // 3, "kl": 0.0}, "int4": {"bytes": full // 24, "kl": 5e-4}}}


@pytest.fixture(scope="module")
def searched(engine):
    """:func:`vlsens.budget.front.search` on the tiny decoder, components comparable with it."""
    b, folder = engine
    rows = _rows(folder)
    t0 = time.perf_counter()
    plans, record = fr.search(folder / "engine", b.calib / "eval.npz", folder / "nbits.csv", _components(rows),
                              other_bytes=1000, points=8, max_evals=60, threads=2)
    print(f"\nsearch: {record['evaluations']} in {time.perf_counter() - t0:.1f} s; front {len(record['front'])}")
    for p in record["curve"]:
        print(f"  budget {p['budget']:>9}  bytes {p['bytes']:>9}  KL {p['kl']:.4g}  ({p['from']}, searched "
              f"{p['searched']})")
    for p in plans:
        print(f"  {p.name}: {p.estimate['bytes']} bytes, KL {p.estimate['kl']:.4g}, vision {p.vision}, "
              f"embedding {p.embedding}, {p.bits_summary()}")
    return plans, record


def test_decoder_curve_falls_with_bytes_between_its_measured_ends(engine, searched):
    """The search's curve (:func:`vlsens.budget.front.decoder_curve` at its budgets)."""
    b, folder = engine
    _, record = searched
    curve = record["curve"]
    rows = fr.shipped_rows(nb.Prepared(folder / "engine"), _rows(folder))  # bytes as a graph file ships them
    low, high = fr.assignment_bytes(rows, {r["op"]: 4 for r in rows}), fr.assignment_bytes(rows, {})
    assert record["budgets"] == fr.budgets_between(low, high) and low < min(record["budgets"])
    assert len(curve) == len(record["budgets"]) + 2 == 14
    assert curve[0]["bytes"] == low and set(curve[0]["bits"].values()) == {4}
    assert curve[-1]["bytes"] == high and set(curve[-1]["bits"].values()) == {0} and curve[-1]["kl"] < 1e-9
    assert curve[0]["kl"] == max(p["kl"] for p in curve) > 1e-6
    assert all(p["bytes"] <= p["budget"] for p in curve[:-1])
    kl = [p["kl"] for p in curve]
    assert all(b <= a for a, b in zip(kl, kl[1:], strict=False))  # the best-so-far envelope
    # the search's own result: above the envelope by noise at most (a thousandth of all INT4's KL)
    assert all(p["searched"] - p["kl"] <= 1e-3 * kl[0] for p in curve[1:-1])
    assert kl[len(kl) // 2] < kl[0] / 2  # half-way in log bytes: most of the error is gone
    assert record["evaluations"]["measured"] < record["evaluations"]["asked"]  # asked again: not run again
    # each point measured again equals what the curve says
    eng_dir = nb.Prepared(folder / "engine")
    eng, ref = eng_dir.session(b.calib / "eval.npz", threads=2), eng_dir.reference()
    for p in curve[1:-1:4]:
        assert nb.error(eng.evaluate(p["bits"], ref), True) == p["kl"]


def test_curve_keeps_a_smaller_budgets_better_point():
    """A budget whose search does worse than a smaller budget's point takes that point."""
    rows = [{"op": o, "bytes_float": 400, "bytes_int8": 200, "bytes_int4": 100, "error_int4": e, "error_int8": e / 10}
            for o, e in (("a", 1.0), ("b", 0.5))]
    kl = {(4, 4): 1.0, (8, 4): 0.4, (4, 8): 0.6, (8, 8): 0.5, (0, 4): 0.45, (4, 0): 0.55, (0, 8): 0.3,
          (8, 0): 0.2, (0, 0): 0.0}
    measured = fr.Measured(lambda a: kl[(a.get("a", 0), a.get("b", 0))])
    curve = fr.decoder_curve(measured, rows, [300, 400], max_evals=2)  # the fills only
    assert [(p["budget"], p["bytes"], p["kl"]) for p in curve] == [(200, 200, 1.0), (300, 300, 0.4),
                                                                   (400, 300, 0.4), (800, 800, 0.0)]
    assert curve[2]["from"] == "budget 300" and curve[2]["searched"] == 0.5
    with pytest.raises(ValueError, match="below"):
        fr.decoder_curve(measured, rows, [150], 20)
    with pytest.raises(VlsensError, match="all-float"):
        fr.decoder_curve(fr.Measured(lambda a: 1.0), rows, [300], 20)


def test_an_op_whose_int8_costs_more_than_its_int4_widens_straight_to_float():
    """AWQ at INT4 against a data-free INT8 on an outlier channel: the op's INT8 measures worse than
    its INT4, so INT4 -> INT8 never saves error and the op would stay INT4 at any budget; its INT4
    widens to float instead. An INT8 above INT4 by less than the table's noise (its largest negative
    error) keeps the usual step."""
    from vlsens.precision.nbits import _int8_dominated, search_budget

    rows = [{"op": "out", "bytes_float": 400, "bytes_int8": 200, "bytes_int4": 100, "error_int4": 1.0,
             "error_int8": 5.0},
            {"op": "b", "bytes_float": 400, "bytes_int8": 200, "bytes_int4": 100, "error_int4": 0.5,
             "error_int8": 0.05},
            {"op": "noise", "bytes_float": 400, "bytes_int8": 200, "bytes_int4": 100, "error_int4": 0.01,
             "error_int8": 0.015},
            {"op": "neg", "bytes_float": 400, "bytes_int8": 200, "bytes_int4": 100, "error_int4": -0.01,
             "error_int8": 0.0}]
    assert _int8_dominated(rows) == {"out"}
    errors = {0: 0.0, 4: 1.0, 8: 5.0}

    def kl(a):
        return errors[a.get("out", 0)] + {0: 0.0, 4: 0.5, 8: 0.05}[a.get("b", 0)]

    bits, got = search_budget(kl, rows, 100 + 400 + 200 + 200, max_evals=20)
    assert bits["out"] == 0 and got == pytest.approx(0.05)


def test_one_measured_assignment_per_budget_is_the_per_byte_fill():
    """``max_evals`` bounds the assignments measured besides all INT4: at 1 the search measures the
    fill in order of estimated error saved per byte alone, at 2 the fill by estimated error too, and
    keeps the better one."""
    from vlsens.precision.nbits import search_budget

    rows = [{"op": "big", "bytes_float": 400, "bytes_int8": 200, "bytes_int4": 100, "error_int4": 1.0,
             "error_int8": 0.1},
            {"op": "small", "bytes_float": 40, "bytes_int8": 20, "bytes_int4": 10, "error_int4": 0.6,
             "error_int8": 0.0}]
    true = {"big": {4: 1.0, 8: 0.1, 0: 0.0}, "small": {4: 0.6, 8: 0.5, 0: 0.0}}  # small's INT8 estimate is wrong

    def kl(a):
        return sum(true[n][a.get(n, 0)] for n in true)

    budget = 100 + 10 + 100  # big to INT8, or small to float and no more
    measured = fr.Measured(kl)
    measured({"big": 4, "small": 4})
    bits, got = search_budget(measured, rows, budget, max_evals=1)
    assert measured.evaluations == 2, measured.cache
    assert bits == {"big": 4, "small": 0} and got == pytest.approx(1.0)
    measured = fr.Measured(kl)
    measured({"big": 4, "small": 4})
    bits, got = search_budget(measured, rows, budget, max_evals=2)
    assert measured.evaluations == 3, measured.cache
    assert bits == {"big": 8, "small": 4} and got == pytest.approx(0.7)


def test_search_returns_plans_spread_over_the_front(searched, engine, tmp_path):
    plans, record = searched
    b, folder = engine
    assert len(plans) >= min(8, len(record["front"])) >= 6
    logs = sorted(math.log(p["bytes"]) for p in record["front"])
    inner = [(a.estimate["bytes"], b.estimate["bytes"]) for a, b in zip(plans, plans[1:])]
    inner = [(a, b) for a, b in inner if any(a < p["bytes"] < b for p in record["front"])]
    assert all(math.log(b / a) <= fr.GAP_FACTOR * (logs[-1] - logs[0]) / 7 for a, b in inner)
    assert [p.name for p in plans] == [f"p{i}" for i in range(1, len(plans) + 1)]
    sizes = [p.estimate["bytes"] for p in plans]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    assert sizes[0] == record["front"][0]["bytes"] and sizes[-1] == record["front"][-1]["bytes"]
    assert len({p.digest() for p in plans}) == len(plans)
    ops = [o["name"] for o in weight_matmuls(b.model("fp32"))]
    assert all(list(p.decoder) == nb.Prepared(folder / "engine").ops and sorted(p.decoder) == sorted(ops)
               for p in plans)
    assert record["evaluations"]["measured"] <= record["evaluations"]["asked"]
    assert record["curve"][-1]["kl"] < 1e-9
    import json

    json.dumps(record)  # the record is plain JSON
    for p in plans:  # each plan saves and loads unchanged
        assert Plan.load(p.save(tmp_path / f"{p.name}.yaml")) == p


def test_a_built_plan_is_the_engine_assignment(searched, engine, tmp_path):
    from vlsens.core.metrics import Metrics
    from vlsens.core.onnxutil import make_session

    plans, _ = searched
    b, folder = engine
    plan = next(p for p in plans if len(set(p.decoder.values())) == 3) if \
        any(len(set(p.decoder.values())) == 3 for p in plans) else plans[len(plans) // 2]
    eng_dir = nb.Prepared(folder / "engine")
    facts = build_decoder(plan, eng_dir.folder / nb.FILES["float"], tmp_path / "model.onnx")
    nodes = quantized_nodes(tmp_path / "model.onnx")
    assert {n: v["bits"] for n, v in nodes.items()} == {n: bt for n, bt in plan.decoder.items() if bt}
    assert facts["bits"] == plan.bits_summary() and facts["digest"] == plan.digest()
    # the weights as the CSV counts them; the graph file as the estimate counts it (each op's node
    # and initializer entries, read from the engine's graphs; the opset entry and the data offsets' digits
    # make the rest: 59 bytes here, against 415 with the entries spread evenly)
    assert facts["weight_bytes"] == fr.assignment_bytes(_rows(folder), plan.decoder)
    float_model = eng_dir.folder / nb.FILES["float"]
    other = model_bytes(float_model) - sum(r["bytes_float"] for r in _rows(folder))
    built = model_bytes(tmp_path / "model.onnx") - other
    assert abs(built - plan.estimate["parts"]["decoder"]["bytes"]) <= 128, (built, plan.estimate)
    eng, ref = eng_dir.session(b.calib / "eval.npz", threads=2), eng_dir.reference()
    want = nb.error(eng.evaluate(plan.decoder, ref), True)
    sess, acc = make_session(tmp_path / "model.onnx", threads=2), Metrics(True)
    for i, feed in enumerate(eng.samples.feeds):
        acc.add(sess.run(["logits"], feed)[0], ref[i], eng.samples.valid[i])
    got = acc.result()["kl"]
    assert np.isclose(got, want, rtol=1e-6, atol=0), (got, want)
    assert np.isclose(want, plan.estimate["parts"]["decoder"]["kl"], rtol=1e-6, atol=0)


def test_a_plan_decoder_takes_the_engines_quantized_matmuls_unchanged(searched, engine, tmp_path, caplog):
    """A plan's decoder built from the engine's all-INT4 / all-INT8 models (reuse_of) is the one
    quantized afresh, file for file, with one MatMul by another algorithm (quantized, not taken);
    an engine prepared from other float weights gives nothing to reuse."""
    import onnx
    from onnx import numpy_helper

    from vlsens.core.onnxutil import data_path
    from vlsens.sensitivity.nbits import reuse_of

    plans, _ = searched
    b, folder = engine
    plan = max(plans, key=lambda p: len(set(p.decoder.values())))
    assert set(plan.decoder.values()) >= {4, 8}
    fp32 = b.model("fp32")
    reuse = reuse_of(folder / "engine", fp32)
    assert reuse is not None and reuse.models[4].name == nb.FILES["q4"]
    other = next(n for n, bt in plan.decoder.items() if bt == 4)
    for name, p in (("plain", plan), ("rtn", replace(plan, algorithms={other: "rtn"}))):
        for d in ("fresh", "taken"):
            (tmp_path / f"{name}-{d}").mkdir()
        fresh = build_decoder(p, fp32, tmp_path / f"{name}-fresh" / "model.onnx")
        caplog.clear()
        with caplog.at_level("INFO", logger="vlsens.quantize.nbits"):
            taken = build_decoder(p, fp32, tmp_path / f"{name}-taken" / "model.onnx", reuse=reuse)
        n = sum(1 for bt in p.decoder.values() if bt) - len(p.algorithms)
        assert f"k_quant: {n} MatMuls taken as quantized before, 0 quantized" in caplog.text, caplog.text
        assert fresh["bits"] == taken["bits"] and fresh["weight_bytes"] == taken["weight_bytes"]
        for f in ("model.onnx", data_path(Path("model.onnx")).name):
            assert (tmp_path / f"{name}-fresh" / f).read_bytes() == (tmp_path / f"{name}-taken" / f).read_bytes(), f
    m = onnx.load(str(tmp_path / "rtn-taken" / "model.onnx"))
    node = next(n for n in m.graph.node if n.name.startswith(other + "_Q"))
    kq = onnx.load(str(tmp_path / "plain-taken" / "model.onnx"))
    want = {t.name: numpy_helper.to_array(t) for t in kq.graph.initializer}
    assert any(not np.array_equal(numpy_helper.to_array(t), want[t.name]) for t in m.graph.initializer
               if t.name in node.input[1:])  # quantized by rtn, not taken from the k_quant engine
    changed = onnx.load(str(fp32))
    w = next(t for t in changed.graph.initializer if t.name == next(o["weight"] for o in nb.Prepared(folder / "engine")
                                                                    .meta["ops"] if o["name"] == other))
    arr = numpy_helper.to_array(w).copy()
    arr[0, 0] += 1.0
    w.CopyFrom(numpy_helper.from_array(arr, w.name))
    onnx.save(changed, str(tmp_path / "changed.onnx"), save_as_external_data=True, location="changed.onnx.data")
    assert reuse_of(folder / "engine", tmp_path / "changed.onnx") is None


def test_build_decoder_names_the_matmuls_a_plan_misses(engine, tmp_path):
    b, folder = engine
    ops = nb.Prepared(folder / "engine").ops
    plan = _plan(decoder={**dict.fromkeys(ops[1:], 4), "/nowhere/MatMul": 8})
    with pytest.raises(VlsensError, match="missing") as e:
        build_decoder(plan, b.model("fp32"), tmp_path / "model.onnx")
    assert ops[0] in str(e.value) and "/nowhere/MatMul" in str(e.value)


def test_a_plan_file_rebuilds_its_decoder_byte_for_byte(searched, engine, tmp_path):
    """The plan file is all a rebuild reads: saved, loaded and built twice, the graph and its data
    file are the same bytes."""
    import hashlib

    plans, _ = searched
    _, folder = engine
    src = nb.Prepared(folder / "engine").folder / nb.FILES["float"]
    plan = plans[len(plans) // 2]
    digests = []
    for k in range(2):
        loaded = Plan.load(plan.save(tmp_path / f"copy{k}.yaml"))
        (tmp_path / f"b{k}").mkdir()
        build_decoder(loaded, src, tmp_path / f"b{k}" / "model.onnx")
        files = sorted(p.name for p in (tmp_path / f"b{k}").iterdir())
        assert files == ["model.onnx", "model.onnx.data"], files
        digests.append([hashlib.sha256((tmp_path / f"b{k}" / f).read_bytes()).hexdigest() for f in files])
    assert digests[0] == digests[1]


def test_each_anchor_gets_the_best_plan_within_its_bytes():
    """An anchor's plan: the front point of lowest estimated KL at or below its bytes, one already
    picked when it is that plan (by digest), else a new ``at-<anchor>``; none below the front."""
    from vlsens.budget.build import _anchor_plans

    curve = [{"budget": b, "bits": bits} for b, bits in ((90, {"a": 4, "b": 4}), (140, {"a": 8, "b": 4}),
                                                         (190, {"a": 8, "b": 8}))]
    front = [{"bytes": 100, "kl": 3e-3, "decoder": 0, "vision": "int4", "embedding": "int4", "parts": {}},
             {"bytes": 150, "kl": 1e-3, "decoder": 1, "vision": "int4", "embedding": "int4", "parts": {}},
             {"bytes": 200, "kl": 1e-4, "decoder": 2, "vision": "int4", "embedding": "int8", "parts": {}}]
    picked = fr._plans(curve, [front[0], front[2]], ["a", "b"], {})
    record = {"front": front, "curve": curve}
    out = _anchor_plans(picked, record, {"big": 210, "mid": 160, "tiny": 50}, ["a", "b"], {})
    assert out["big"]["plan"] == "p2" and out["mid"]["plan"] == "at-mid" and out["tiny"]["plan"] is None
    assert [p.name for p in picked] == ["p1", "p2", "at-mid"] and picked[-1].decoder == {"a": 8, "b": 4}


def test_a_requested_budget_picks_its_point_and_is_refused_when_badly_named():
    """plan.budgets: bytes and bits per weight pick the lowest estimated KL within the limit, a KL
    the fewest bytes meeting it; none when nothing meets it. Names are checked by the schema and
    the DAG build (not p<i> or at-..., no repeat)."""
    from conftest import default_config

    from vlsens.budget.build import budget_point
    from vlsens.config import schema_errors, with_defaults
    from vlsens.deploy import check_config

    front = [{"bytes": 100, "kl": 3e-3}, {"bytes": 150, "kl": 1e-3}, {"bytes": 200, "kl": 1e-4}]
    assert budget_point(front, {"bytes": 180}, 800) == (front[1], 180)
    assert budget_point(front, {"bits_per_weight": 7.2}, 800) == (front[1], 180)  # 7.2 x 800 / 32
    assert budget_point(front, {"kl": 2e-3}, 800) == (front[1], None)
    assert budget_point(front, {"kl": 1e-5}, 800) == (None, None)
    assert budget_point(front, {"bytes": 50}, 800) == (None, 50)
    # a decode-step limit: alone, the lowest KL among the points fast enough; with bytes or KL, both
    timed = [{**p, "decode_ms": ms} for p, ms in zip(front, (1.0, 2.0, 3.0))] + \
        [{"bytes": 120, "kl": 2e-3, "decode_ms": 1.5}]
    assert budget_point(timed, {"decode_ms": 2.5}, 800) == (timed[1], None)
    assert budget_point(timed, {"decode_ms": 2.5, "bytes": 130}, 800) == (timed[3], 130)
    assert budget_point(timed, {"decode_ms": 1.8, "kl": 2.5e-3}, 800) == (timed[3], None)
    assert budget_point(timed, {"decode_ms": 0.5}, 800) == (None, None)
    assert budget_point(front, {"decode_ms": 9.0}, 800) == (None, None)  # no step timed: none fits
    def errors(budgets):
        cfg = default_config()
        cfg["plan"]["budgets"] = budgets
        return schema_errors(with_defaults(cfg))

    for bad in ({"name": "p3", "bytes": 1}, {"name": "at-x", "kl": 1e-3}, {"name": "small"},
                {"name": "small", "bytes": 1, "bits_per_weight": 4}, {"name": "fast", "decode_ms": 0}):
        assert any("budgets" in e for e in errors([bad])), bad
    assert not errors([{"name": "small", "bits_per_weight": 4.5}, {"name": "q", "kl": 1e-4},
                       {"name": "fast", "decode_ms": 80, "bytes": 2500000000}, {"name": "both", "bytes": 9, "kl": 1e-3}])
    cfg = default_config()
    cfg["plan"]["budgets"] = [{"name": "small", "bytes": 10**6}, {"name": "small", "kl": 1e-4}]
    with pytest.raises(ConfigError, match="plan.budgets: names"):
        check_config(cfg)


def test_a_budget_no_plan_meets_is_said_on_the_console_not_only_in_the_report(caplog):
    """A budget below the smallest plan built no folder with exit 0 and a line in measured.md;
    now both the search and the measured table warn (vlsens warnings reach the console)."""
    from vlsens.budget.build import _budget_plans
    from vlsens.budget.report import _requested

    record = {"front": [{"bytes": 100, "kl": 3e-3}, {"bytes": 200, "kl": 1e-4}]}
    with caplog.at_level("WARNING", logger="vlsens"):
        out = _budget_plans([], record, record["front"], [{"name": "tiny", "bits_per_weight": 0.5}], 800, eng=None)
    assert out["tiny"]["plan"] is None and out["tiny"]["byte_limit"] == 12
    assert "plan.budgets 'tiny' (bits_per_weight 0.5 = 12 bytes): no plan meets it" in caplog.text
    assert "the smallest plan takes 100 bytes" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="vlsens"):
        got = _requested({"small": {"request": {"bytes": 150}, "byte_limit": 150, "plan": "small"}},
                         {"small": {"bytes": 160, "kl": 1e-3}})
    assert got["small"]["met"] is False and "does not meet it (160 bytes" in caplog.text


def test_a_jobs_named_inputs_give_the_formats_and_the_anchors():
    from vlsens.budget.build import formats_of, named

    inputs = {"vision_fp32": "v32.onnx", "vision_int8-wo": "v8.onnx", "embedding_int4": "e4.onnx",
              "decoder_model": "d.onnx", "anchor_peer-olive": "deploy/peer-olive", "reference": "r.npz",
              "vision_features": "f.npz", "vision_reference": "vr.npz", "vision_ops": "vision.csv"}  # not formats
    assert formats_of(inputs) == {"vision": {"fp32": Path("v32.onnx"), "int8-wo": Path("v8.onnx")},
                                  "embedding": {"int4": Path("e4.onnx")}}
    assert named(inputs, "anchor_") == {"peer-olive": Path("deploy/peer-olive")}


MIXED_OPS = {"/v/0/MatMul": 4, "/v/1/MatMul": 8, "/v/2/MatMul": 0}


def test_a_mixed_vision_plan_names_every_linear_and_rebuilds_from_its_file(tmp_path):
    p = _plan(vision="mixed", vision_ops=MIXED_OPS)
    path = p.save(tmp_path / "m.yaml")
    assert Plan.load(path) == p and Plan.load(path).digest() == p.digest()
    assert p.vision_label() == "mixed 1/1/1" and _plan().vision_label() == "int8-mixed"
    # one Linear's width is another folder; a plan without vision_ops keeps the digest it had
    assert _plan(vision="mixed", vision_ops={**MIXED_OPS, "/v/2/MatMul": 8}).digest() != p.digest()
    assert "vision_ops" not in _plan().as_dict()
    for bad, match in (({"vision": "mixed"}, "vision_ops"), ({"vision": "mixed", "vision_ops": {"/v/0/MatMul": 3}},
                                                               "vision_ops: bits"),
                       ({"vision_ops": MIXED_OPS}, "vision_ops is for vision: mixed")):
        with pytest.raises(ConfigError, match=match):
            _plan(**bad)
    d = yaml.safe_load(path.read_text())
    d["vision_opz"] = d.pop("vision_ops")
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match="unknown key 'vision_opz'"):
        Plan.load(path)


def test_the_mixed_vision_curve_moves_the_cheapest_linears_per_byte_first():
    from vlsens.budget.vision import mixed_curve

    rows = [{"op": "a", "bytes_int4": 10, "bytes_int8": 20, "kl_int4": 3e-4},   # 3e-5 a byte saved
            {"op": "b", "bytes_int4": 50, "bytes_int8": 100, "kl_int4": 1e-4},  # 2e-6
            {"op": "c", "bytes_int4": 5, "bytes_int8": 10, "kl_int4": 1e-5},    # 2e-6, after b (graph order)
            {"op": "d", "bytes_int4": 20, "bytes_int8": 40, "kl_int4": -1e-9}]  # measured at the noise: 0
    curve = mixed_curve(rows, {"bytes": 1000, "kl": 1e-6})
    assert [p["name"] for p in curve] == ["mixed:1", "mixed:2", "mixed:3"]  # 0 and 4 moved: int8-wo and int4
    assert [sorted(op for op, b in p["ops"].items() if b == 4) for p in curve] == [["d"], ["b", "d"], ["b", "c", "d"]]
    assert [p["bytes"] for p in curve] == [980, 930, 925]
    assert curve[0]["kl"] == pytest.approx(1e-6) and curve[2]["kl"] == pytest.approx(1e-6 + 1e-4 + 1e-5)
    assert all(set(p["ops"]) == {"a", "b", "c", "d"} and set(p["ops"].values()) <= {4, 8} for p in curve)
    # calibrated where the curve was measured whole: the INT8 graph (ratio 1), a mixed graph at k = 2
    # (here 3x its additive KL) and the INT4 graph at its end (2x); interpolated in between
    int8 = {"bytes": 1000, "kl": 1e-6}
    int4 = {"bytes": 900, "kl": 2 * (1e-6 + 3e-4 + 1e-4 + 1e-5)}
    point = {"int4": 2, "kl": 3 * (1e-6 + 1e-4)}
    # with points measured whole, the options are those points, at their measured KL
    measured = mixed_curve(rows, int8, int4, [point])
    assert [(p["int4"], p["bytes"]) for p in measured] == [(2, curve[1]["bytes"])]
    assert measured[0]["kl"] == pytest.approx(point["kl"]) and measured[0]["ratio"] == pytest.approx(3.0)
    # a point whose graph's bytes in the folder were recorded: those, not the Linears' savings
    assert [p["bytes"] for p in mixed_curve(rows, int8, int4, [{**point, "bytes": 934}])] == [934]
    # without, every k: the additive KL times the ratio interpolated from 1 (k = 0) to 2 (the INT4 end)
    est = mixed_curve(rows, int8, int4)
    assert [round(p["ratio"], 9) for p in est] == [1.25, 1.5, 1.75]
    assert est[2]["kl"] == pytest.approx(1.75 * (1e-6 + 1e-4 + 1e-5))
    assert [p["bytes"] for p in est] == [p["bytes"] for p in curve]  # bytes are not calibrated
    from vlsens.budget.vision import point_ks

    assert point_ks(22) == [3, 6, 8, 11, 14, 16, 19, 20, 21] and point_ks(4) == [1, 2, 3]


def test_a_front_point_on_the_mixed_curve_becomes_a_mixed_plan():
    comps = {"vision": {**COMPONENTS["vision"], "mixed:1": {"bytes": 120, "kl": 0.01}},
             "embedding": COMPONENTS["embedding"]}
    front = fr.combine(_curve(), comps, other_bytes=10)
    point = next(p for p in front if p["vision"] == "mixed:1")
    plan = fr._plans(_curve(), [point], ["op"], NBitsSettings().as_dict(), {"mixed:1": MIXED_OPS})[0]
    assert plan.vision == "mixed" and plan.vision_ops == MIXED_OPS
    assert plan.estimate["vision_option"] == "mixed:1" and plan.estimate["parts"]["vision"]["bytes"] == 120
    with pytest.raises(VlsensError, match="mixed:1"):
        fr._plans(_curve(), [point], ["op"], NBitsSettings().as_dict(), {})
    with pytest.raises(ConfigError, match="vision"):
        fr.combine(_curve(), {**comps, "vision": {"mixed-1": {"bytes": 1, "kl": 0.0}}}, 0)


# -- decode latency (vlsens.budget.latency) --------------------------------------------------------


def _genai_folder(tiny_ckpt, path):
    """A folder holding only the genai_config.json a decode step is sized from (the tiny preset's)."""
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    path.mkdir(parents=True, exist_ok=True)
    heads = int(text["num_attention_heads"])
    (path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {
        "num_key_value_heads": int(text["num_key_value_heads"]), "head_size": int(text["hidden_size"]) // heads,
        "hidden_size": int(text["hidden_size"])}}}))
    return path


def test_decode_steps_are_timed_in_turn_and_estimated_by_byte_shares(engine, tiny_ckpt, tmp_path):
    """The three uniform decoders of the engine run one decode step each (one token after 64
    cached ones) in the same loop; an assignment's estimate is the byte-weighted mean of theirs."""
    from vlsens.budget.latency import estimate_ms, step_feed, uniform_latency

    b, folder = engine
    got = uniform_latency(folder / "engine", {"folder": _genai_folder(tiny_ckpt, tmp_path / "fp32"), "context": 64},
                          threads=1)
    assert sorted(got["uniform"]) == ["0", "4", "8"] and got["context"] == 64
    for t in got["uniform"].values():
        assert 0 < t["ms"] <= t["q3"] and t["q1"] <= t["q3"] and t["steps"] == 30  # ms: the quietest round's median
    feed = step_feed(folder / "engine" / "float.onnx", json.loads(
        (tmp_path / "fp32" / "genai_config.json").read_text())["model"]["decoder"], 64)
    assert feed["attention_mask"].shape == (1, 65) and feed["position_ids"].ravel().tolist() == [64] * 3
    rows = _rows(folder)
    uniform = {0: 3.0, 4: 1.0, 8: 2.0}
    ops = [r["op"] for r in rows]
    assert estimate_ms({}, rows, uniform) == pytest.approx(3.0)
    assert estimate_ms(dict.fromkeys(ops, 4), rows, uniform) == pytest.approx(1.0)
    half = {r["op"]: 8 for r in rows[: len(rows) // 2]}
    share = sum(r["bytes_float"] for r in rows[: len(rows) // 2]) / sum(r["bytes_float"] for r in rows)
    assert estimate_ms(half, rows, uniform) == pytest.approx(2.0 * share + 3.0 * (1 - share))
    with pytest.raises(VlsensError, match="width"):
        estimate_ms(dict.fromkeys(ops, 4), rows, {0: 3.0})


def test_the_search_carries_the_estimated_decode_step_to_every_point_and_plan(engine):
    b, folder = engine
    rows = _rows(folder)
    plans, record = fr.search(folder / "engine", b.calib / "eval.npz", folder / "nbits.csv", _components(rows),
                              other_bytes=1000, points=4, max_evals=10, threads=2,
                              extras=fr.Extras(uniform_ms={0: 3.0, 4: 1.0, 8: 2.0}))
    assert record["curve"][0]["decode_ms"] == pytest.approx(1.0) and record["curve"][-1]["decode_ms"] == pytest.approx(3.0)
    assert all(p["decode_ms"] == record["curve"][p["decoder"]]["decode_ms"] for p in record["front"])
    assert all(1.0 - 1e-9 <= p.estimate["decode_ms"] <= 3.0 + 1e-9 for p in plans)


# -- per-op algorithms (plan.algorithms) -----------------------------------------------------------


def _packed(model) -> dict[str, list]:
    """Per float MatMul the packed weight / scale tensors of its MatMulNBits node, as arrays."""
    import onnx

    from vlsens.core.onnxutil import tensor_array

    m = onnx.load(str(model), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    return {n.name.rsplit("_Q", 1)[0]: [tensor_array(inits[x], Path(model).parent) for x in n.input[1:] if x in inits]
            for n in m.graph.node if n.op_type == "MatMulNBits"}


def test_a_plan_names_per_op_algorithms_and_its_decoder_takes_them(engine, tmp_path):
    """quantize(algorithms=...) gives each named MatMul its algorithm's weights and bytes, every
    other one the settings'; a plan carries them in its file and digest, and build_decoder
    builds them; an unknown algorithm or one given to a float MatMul is refused."""
    from vlsens.quantize.nbits import quantize

    b, _ = engine
    fp32 = b.model("fp32")
    ops = [o["name"] for o in weight_matmuls(fp32)]
    kq = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4)
    every = {}
    for a in ("k_quant", "rtn"):
        (tmp_path / a).mkdir()
        every[a] = _packed(quantize(fp32, tmp_path / a / "model.onnx", dict.fromkeys(ops, 4), replace(kq, algorithm=a)))
    picked = {ops[0]: "rtn", ops[3]: "rtn"}
    plan = Plan("x", "fp16", "fp32", dict.fromkeys(ops, 4), kq.as_dict(), algorithms=picked)
    (tmp_path / "plan").mkdir()
    built = build_decoder(plan, fp32, tmp_path / "plan" / "model.onnx")
    got = _packed(built["model"])
    differ = [op for op in ops if any(not np.array_equal(x, y) for x, y in zip(every["rtn"][op], every["k_quant"][op]))]
    assert differ, "rtn and k_quant wrote the same weights: the test would not see a swap"
    for op in ops:
        want = every[picked.get(op, "k_quant")][op]
        assert all(np.array_equal(x, y) for x, y in zip(got[op], want)), op
    # the bytes follow each op's algorithm (k_quant writes zero points where symmetric RTN has none)
    q = {a: quantized_nodes(tmp_path / a / "model.onnx") for a in ("k_quant", "rtn")}
    assert {op: v["bytes"] for op, v in quantized_nodes(built["model"]).items()} == \
        {op: q[picked.get(op, "k_quant")][op]["bytes"] for op in ops}
    same = Plan("x", "fp16", "fp32", dict.fromkeys(ops, 4), kq.as_dict())
    assert plan.digest() != same.digest() and Plan.load(plan.save(tmp_path / "p.yaml")) == plan
    assert "algorithms" not in same.as_dict()  # a plan without per-op algorithms keeps its file and digest
    with pytest.raises(ConfigError, match="algorithms: one of"):
        Plan("x", "fp16", "fp32", dict.fromkeys(ops, 4), kq.as_dict(), algorithms={ops[0]: "hqq"})
    with pytest.raises(ConfigError, match="not quantized"):
        Plan("x", "fp16", "fp32", {**dict.fromkeys(ops, 4), ops[0]: 0}, kq.as_dict(), algorithms={ops[0]: "rtn"})


def test_each_op_takes_the_algorithm_it_costs_least_under(engine, tmp_path, monkeypatch):
    """choose_algorithms scores every MatMul alone under each algorithm and every MatMul at each
    width under each; a candidate that costs more than the default at a width over the whole
    decoder takes no op at that width (rtn beside k_quant: none); else each op takes the one it
    alone costs least under (k_quant beside rtn), and the engine built with the choice scores each
    op at that error, its bytes those of the chosen algorithm."""
    b, _ = engine
    kq = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4)
    rtn = replace(kq, algorithm="rtn")
    worse = nb.choose_algorithms(b.model("fp32"), b.calib / "eval.npz", kq, ["rtn"], tmp_path / "w0", 2, logits=True)
    assert all(worse["uniform"]["rtn"][w] > worse["uniform"]["k_quant"][w] for w in ("4", "8")), worse["uniform"]
    assert worse["allowed"] == {"4": ["k_quant"], "8": ["k_quant"]} and worse["chosen"] == {}
    choice = nb.choose_algorithms(b.model("fp32"), b.calib / "eval.npz", rtn, ["k_quant"], tmp_path / "work", 2,
                                  logits=True)
    assert choice["candidates"] == ["rtn", "k_quant"] and not (tmp_path / "work" / "k_quant").exists()
    errors = choice["errors"]
    for w in ("4", "8"):
        allowed = [a for a in ("rtn", "k_quant") if choice["uniform"][a][w] <= choice["uniform"]["rtn"][w]]
        assert choice["allowed"][w] == allowed
        for op in errors["rtn"]:
            best = min(allowed, key=lambda a: (errors[a][op][w], a != "rtn"))
            assert choice["chosen"].get(w, {}).get(op, "rtn") == best
    assert choice["chosen"] and any(len(c) < len(errors["rtn"]) for c in choice["chosen"].values()), \
        "every op or none takes k_quant: the per-op choice is never exercised"
    eng = tmp_path / "engine"
    nb.prepare(b.model("fp32"), b.calib / "eval.npz", eng, rtn, 2, logits=True,
               how=nb.Quantizing({int(w): a for w, a in choice["chosen"].items()}))
    assert nb.Prepared(eng).meta["algorithms"] == choice["chosen"]
    # the default's engine stays in work with its quantized models alone; an engine built with the
    # choice takes its rtn MatMuls from them (quantizing only the k_quant ones), to the same models
    kept = tmp_path / "work" / "rtn"
    assert sorted(p.name for p in kept.iterdir()) == ["engine.json", "q4.onnx", "q4.onnx.data", "q8.onnx", "q8.onnx.data"]
    import vlsens.quantize.nbits as qn

    quantized, real = [], qn._quantize_batch
    monkeypatch.setattr(qn, "_quantize_batch", lambda batch, *a, **k: quantized.extend(o["name"] for o in batch)
                        or real(batch, *a, **k))
    again = tmp_path / "engine-reused"
    nb.prepare(b.model("fp32"), b.calib / "eval.npz", again, rtn, 2, logits=True,
               how=nb.Quantizing({int(w): a for w, a in choice["chosen"].items()}, reuse=nb.reuse_of(kept, b.model("fp32"))))
    assert sorted(quantized) == sorted(op for c in choice["chosen"].values() for op in c)  # the rtn ones taken
    for q in ("q4.onnx", "q8.onnx"):
        got, want = _packed(again / q), _packed(eng / q)
        assert got.keys() == want.keys() and all(np.array_equal(x, y) for op in got
                                                 for x, y in zip(got[op], want[op], strict=True)), q
    nb.sensitivity(eng, b.calib / "eval.npz", tmp_path / "nbits.csv", tmp_path / "nbits.json", 2)
    for r in _rows(tmp_path):
        for w in ("4", "8"):
            low = min(errors[a][r["op"]][w] for a in choice["allowed"][w])
            assert r[f"error_int{w}"] == pytest.approx(low, rel=1e-5, abs=1e-12), (r["op"], w)
    plan = fr._plans([{"budget": 1, "bits": {op: 4 for op in errors["rtn"]}}],
                     [{"bytes": 1, "kl": 0.0, "decoder": 0, "vision": "fp16", "embedding": "fp32", "parts": {}}],
                     list(errors["rtn"]), rtn.as_dict(), algorithms=choice["chosen"])[0]
    assert plan.algorithms == choice["chosen"].get("4", {})


def test_gptq_is_chosen_per_op_on_the_calibration_split_and_its_plans_rebuild_only_on_it(engine, tmp_path,
                                                                                          monkeypatch):
    """With gptq a candidate, the INT4 ops GPTQ (on the calibration split) makes cheaper on the
    evaluation set take it; the engine records the calibration's SHA-256 and the plans name it; a
    plan's decoder is its ops' GPTQ weights, built only from the same calibration samples; a plan
    with gptq and no calibration, or calibration and no gptq, is refused. GPTQ runs once: the
    candidate engine fills the run's store, the engine built with the choice and the plan's
    decoder read it (the same codes as computing them)."""
    from vlsens.core.fsutil import file_sha256
    from vlsens.quantize import gptq
    from vlsens.quantize.nbits import quantize

    b, _ = engine
    calib, evaluation = b.calib / "calib.npz", b.calib / "eval.npz"
    kq = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4)
    with pytest.raises(ValueError, match="calibration"):
        nb.choose_algorithms(b.model("fp32"), evaluation, kq, ["gptq"], tmp_path / "w0", 2, logits=True)
    store = tmp_path / "gptq"
    choice = nb.choose_algorithms(b.model("fp32"), evaluation, kq, ["gptq"], tmp_path / "work", 2, logits=True,
                                  calibration=gptq.Calibration(calib, gptq.Store(store, b.model("fp32"), calib, True)))
    assert choice["candidates"] == ["k_quant", "gptq"]
    assert choice["allowed"]["8"] == ["k_quant"] and "8" not in choice["chosen"]  # INT4 only (DATA_AWARE_BITS)
    assert len(list(store.glob("*.npz"))) == len(choice["errors"]["k_quant"])  # every MatMul at INT4, once
    at4 = choice["chosen"].get("4", {})
    assert at4, "GPTQ made no op cheaper at INT4: the choice is never exercised"
    hessians = gptq.hessians
    monkeypatch.setattr(gptq, "hessians", lambda *a, **k: pytest.fail("GPTQ computed again beside the store"))
    read = gptq.Calibration(calib, gptq.Store(store, b.model("fp32"), calib))
    eng = tmp_path / "engine"
    nb.prepare(b.model("fp32"), evaluation, eng, kq, 2, logits=True,
               how=nb.Quantizing({int(w): a for w, a in choice["chosen"].items()}, read))
    meta = nb.Prepared(eng).meta
    assert meta["calibration"]["sha256"] == file_sha256(calib) == fr.calibration_of(meta)
    again = tmp_path / "engine-reused"  # its k_quant MatMuls taken from the default's engine: the same models
    nb.prepare(b.model("fp32"), evaluation, again, kq, 2, logits=True,
               how=nb.Quantizing({int(w): a for w, a in choice["chosen"].items()}, read,
                                 nb.reuse_of(tmp_path / "work" / "k_quant", b.model("fp32"))))
    for q in ("q4.onnx", "q8.onnx"):
        got, want = _packed(again / q), _packed(eng / q)
        assert got.keys() == want.keys() and all(np.array_equal(x, y) for op in got
                                                 for x, y in zip(got[op], want[op], strict=True)), q
    errors = choice["errors"]
    plan = fr._plans([{"budget": 1, "bits": {op: 4 for op in errors["k_quant"]}}],
                     [{"bytes": 1, "kl": 0.0, "decoder": 0, "vision": "fp16", "embedding": "fp32", "parts": {}}],
                     list(errors["k_quant"]), kq.as_dict(), algorithms=choice["chosen"],
                     calibration=fr.calibration_of(meta))[0]
    assert plan.algorithms == at4 and plan.calibration == file_sha256(calib)
    assert Plan.load(plan.save(tmp_path / "p.yaml")) == plan
    assert plan.digest() != replace(plan, calibration=file_sha256(evaluation)).digest()
    fp32 = b.model("fp32")
    (tmp_path / "plan").mkdir()
    built = build_decoder(plan, fp32, tmp_path / "plan" / "model.onnx", read)
    monkeypatch.setattr(gptq, "hessians", hessians)
    (tmp_path / "direct").mkdir()
    direct = quantize(fp32, tmp_path / "direct" / "model.onnx", plan.decoder, kq, algorithms=at4, calibration=calib)
    got, want = _packed(built["model"]), _packed(direct)
    assert all(np.array_equal(x, y) for op in got for x, y in zip(got[op], want[op], strict=True))
    for wrong in (evaluation, None):
        with pytest.raises(VlsensError, match="calibration samples"):
            build_decoder(plan, fp32, tmp_path / "x" / "model.onnx", wrong)
    with pytest.raises(ConfigError, match="calibration"):
        replace(plan, calibration="")
    with pytest.raises(ConfigError, match="no MatMul takes a data-aware"):
        replace(plan, algorithms={})


# -- the vision Linears' estimate ------------------------------------------------------------------

def test_estimated_linears_take_their_roles_scale_fitted_on_the_measured_ones():
    """The Linears not measured get KL = their role's scale x output error (per modality by their
    own error); a role's scale is the geometric mean of measured / output error over its measured
    Linears, a role with none takes every measured Linear's; each measured Linear keeps its
    measure and is estimated from the others (held out) in the record; every role is measured
    once before any role twice."""
    from vlsens.budget.vision import choose_measured, estimate_rows, fit_scales

    qkv, down, merger = "/visual/blocks.{}/attn/qkv/MatMul", "/visual/blocks.0/mlp/down_proj/MatMul", \
        "/visual/merger/mlp/mlp.2/MatMul"
    errors = {op: {"all": e, "text": 0.0, "image": 2 * e, "images": e} for op, e in
              ((qkv.format(0), 1.0), (qkv.format(1), 4.0), (qkv.format(2), 2.0), (down, 0.5), (merger, 8.0))}
    assert choose_measured(errors, 3) == [merger, qkv.format(1), down]  # the small down_proj before a second qkv
    assert choose_measured(errors, 5) == [merger, qkv.format(1), down, qkv.format(2), qkv.format(0)]  # qkv's median
    measured = {qkv.format(1): 2e-3, qkv.format(2): 4e-3, merger: 8e-3}  # ratios 5e-4, 2e-3, 1e-3
    rows = [{"op": op, **({"kl_int4": measured[op], "measured": 1} if op in measured else {})} for op in errors]
    scales = fit_scales(rows, errors)
    assert scales["attn.qkv"] == pytest.approx(1e-3) and scales["merger.mlp.mlp.2"] == pytest.approx(1e-3)
    assert scales["mlp.down_proj"] == pytest.approx(1e-3)  # (5e-4 * 2e-3 * 1e-3) ** (1 / 3): no down_proj measured
    record = estimate_rows(rows, errors)
    by = {r["op"]: r for r in rows}
    assert by[qkv.format(0)]["kl_int4"] == pytest.approx(1e-3) and by[qkv.format(0)]["measured"] == 0
    assert by[down]["kl_int4_image"] == pytest.approx(2 * 0.5 * 1e-3) and by[down]["kl_int4_text"] == 0.0
    # held out: qkv 1 from qkv 2's ratio (8e-3), qkv 2 from qkv 1's (1e-3), the merger from the others' (8e-3)
    assert by[qkv.format(1)]["kl_int4"] == 2e-3 and by[qkv.format(1)]["kl_estimate"] == pytest.approx(8e-3)
    assert by[qkv.format(2)]["kl_estimate"] == pytest.approx(1e-3) and by[merger]["kl_estimate"] == pytest.approx(8e-3)
    assert record["measured"] == 3 and record["estimated"] == 2
    assert record["measured_over_estimate"] == pytest.approx({"min": 0.25, "median": 1.0, "max": 4.0})
    assert record["rank_correlation"] == pytest.approx(0.5)


def _depth_rows(ratio, measured, blocks=8):
    """Every Linear of ``blocks`` blocks (qkv, down_proj) and the merger's last; ``ratio(op)``: its
    KL per unit of output error; the ``measured`` ones carry their KL."""
    ops = [f"/visual/blocks.{i}/{r}/MatMul" for i in range(blocks) for r in ("attn/qkv", "mlp/down_proj")]
    ops.append("/visual/merger/mlp/mlp.2/MatMul")
    errors = {op: {"all": 1.0 + (i % 3), "text": 0.0, "image": 1.0 + (i % 3), "images": 0.0} for i, op in enumerate(ops)}
    rows = [{"op": op, **({"kl_int4": ratio(op) * errors[op]["all"], "measured": 1} if op in measured else {})}
            for op in ops]
    return ops, errors, rows


def test_the_depth_term_is_taken_where_it_predicts_the_measured_linears_held_out_better():
    """Where an error costs more the earlier its block (KL / output error falling by one factor per
    block, as the 3B random tower measured), the estimate takes the depth term: every Linear not
    measured gets its true KL, where the role-only fit misses the first and last blocks by the
    depth's whole factor; where the ratio does not depend on depth (noise around each role's), the
    role-only fit is kept and the record says why (the held-out misses of both)."""
    import math

    from vlsens.budget.vision import Fit, _log_ratios, choose_depth, estimate_rows, relative_depth, role_of

    role = {"attn.qkv": 1e-4, "mlp.down_proj": 3e-4, "merger.mlp.mlp.2": 1e-3}

    def falling(op):  # 10x from the first block to the last
        d = relative_depth(op, 8)
        return role[role_of(op)] * 10 ** (1 - (1.0 if d is None else d))

    measured = [f"/visual/blocks.{i}/{r}/MatMul" for i, r in ((1, "attn/qkv"), (6, "attn/qkv"), (2, "mlp/down_proj"),
                                                              (5, "mlp/down_proj"), (7, "mlp/down_proj"))]
    measured.append("/visual/merger/mlp/mlp.2/MatMul")
    ops, errors, rows = _depth_rows(falling, measured)
    record = estimate_rows(rows, errors)
    assert record["depth"]["used"] and record["depth"]["first_over_last"] == pytest.approx(10.0)
    rms = record["depth"]["held_out_rms_log"]
    assert rms["role+depth"] < 0.5 * rms["role"]  # both miss the merger, measured once, held out
    for r in rows:
        assert r["kl_int4"] == pytest.approx(falling(r["op"]) * errors[r["op"]]["all"])
        if "blocks." in r["op"]:  # held out too: every block Linear's role stays measured at another depth
            assert r["kl_estimate"] == pytest.approx(falling(r["op"]) * errors[r["op"]]["all"])
    # the role-only fit on the same measures misses the first block's qkv by more than 2x
    first = "/visual/blocks.0/attn/qkv/MatMul"
    fit = Fit.of(_log_ratios(_depth_rows(falling, measured)[2], errors), depth=False)
    assert fit.scale("attn.qkv", 0.0) < 0.5 * falling(first)

    noise = {op: math.exp(0.4 * ((i * 7) % 5 - 2)) for i, op in enumerate(ops)}  # no trend in depth
    _, errors, rows = _depth_rows(lambda op: role[role_of(op)] * noise[op], measured)
    record = estimate_rows(rows, errors)
    rms = record["depth"]["held_out_rms_log"]
    assert not record["depth"]["used"] and record["depth"]["slope"] == 0.0 and rms["role"] <= rms["role+depth"]
    assert choose_depth([("attn.qkv", 0.1, -3.0), ("mlp.down_proj", 0.9, -2.0)])["used"] is False  # no role at 2 depths


def test_output_errors_are_each_linears_own_int4_output_change(graph_builder, tmp_path):
    """The estimate's per-Linear error, ``||X (W4 - W)^T||^2`` taken by forward hooks in one float
    pass, is what that Linear's output changes by when transformers' tower multiplies by the INT4
    graph's weight instead (the weight swapped the way the INT4 gate swaps it); checked on the
    first Linear of the tower and on the last one, each on its own input."""
    import torch

    from vlsens.budget.vision import ErrorHooks
    from vlsens.core.onnxgraph import dequantize_matmulnbits
    from vlsens.data.cases import Cases
    from vlsens.model.loading import load_model
    from vlsens.precision.weight_only import linear_module, linears, quantize_vision

    b = graph_builder("vision/dynamic")
    fp32 = b.model("fp32")
    int4 = tmp_path / "int4" / "model.onnx"
    quantize_vision(fp32, int4, NBitsSettings(algorithm="rtn", block_size=32))
    case = next(iter(Cases.load(b.reference)))
    pixels, grid = case.inputs["patches"], np.asarray(case.meta["grid_thw"], np.int64)
    hooks = ErrorHooks.from_graphs(b.ckpt, int4, fp32)
    got = hooks(pixels, grid)
    hooks.close()
    ops = linears(fp32)
    assert set(got) == {o["name"] for o in ops} and all(v > 0 for v in got.values())
    w4 = dict(dequantize_matmulnbits(int4))
    seen = {}
    for o in (ops[0], ops[-1]):
        model = load_model(b.ckpt, attn_implementation="eager", part="vision")
        linear = linear_module(model, o["weight"])
        linear.register_forward_hook(lambda m, a, out: seen.update(x=a[0].detach().clone()))  # None: output kept
        with torch.no_grad():
            model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid), return_dict=True)
            before = linear(seen["x"])
            linear.weight = torch.nn.Parameter(torch.from_numpy(w4[o["name"]].T.copy()), requires_grad=False)
            after = linear(seen["x"])
        assert float((after - before).double().pow(2).sum()) == pytest.approx(got[o["name"]], rel=1e-4)
