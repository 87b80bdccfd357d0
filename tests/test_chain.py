"""The end-to-end measure as one decoder graph's evaluation set (vlsens.deploy.genai.chain): the
decoder's prefill of every case's whole sequence gives, at the valid positions, the logits
onnxruntime-genai's teacher forcing gives step by step with its KV cache -- for the fp32 folder
exactly, for an all-INT4 decoder within the kernels' rounding; and the nbits engine, evaluating
the same assignment on that set, gives the measure's KL."""

from __future__ import annotations

import shutil

import pytest
from conftest import TOL_FP32

from vlsens.quantize.nbits import NBitsSettings

SETTINGS = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4)
#: One INT4 decoder's KL per case, the runtime's step-by-step decode (MatMulNBits at M = 1 for
#: each appended token, the past from its cache) against one prefill of the sequence. Measured on
#: the tiny preset: at most 9e-8 relative. The prompt's step is bit-identical (a causal prefill's
#: prefix), the decode steps differ by a few float32 ulps of the logits (at most 2.4e-7 of logits
#: up to 0.63), as much as the fp32 folder's decode steps (1.8e-7): the INT4 kernel at accuracy
#: level 4 adds no difference of its own between M = 1 and the prefill. 1e-4 keeps a thousandfold
#: margin and is still far inside the 2 % a search over assignments relies on.
CASE_REL = 1e-4
#: The nbits engine's pooled KL against the measure's. Measured: within 1e-6 relative since
#: :func:`vlsens.core.metrics.kl_rows` keeps the KL's precision (the difference of two float32
#: log-softmaxes it replaced gave 1.7e-4, all of it that rounding). Tenfold margin, far inside the
#: 2 % a search relies on.
ENGINE_REL = 1e-5


@pytest.fixture(scope="module")
def chain(graph_builder, parity_refs, tmp_path_factory):
    """The fp32 folder of the tiny preset (built like the DAG builds it), its reference on
    3 cases per modality (8 tokens), and the decoder evaluation set of those cases."""
    from vlsens.deploy.build import build_folder
    from vlsens.deploy.cases import folder_cases
    from vlsens.deploy.genai.chain import decoder_feeds
    from vlsens.deploy.genai.evaluate import Checks
    from vlsens.deploy.genai.measure import reference

    root = tmp_path_factory.mktemp("chain")
    dec, vis = graph_builder("decoder"), graph_builder("vision/dynamic")
    fp32 = root / "fp32"
    build_folder("fp32", fp32, decoder=dec.model("fp32"), embedding=dec.folder("fp32") / "embedding.onnx",
                 vision=vis.model("fp32"), checks=Checks(8, TOL_FP32), checkpoint=dec.ckpt, images=parity_refs)
    cases = folder_cases(parity_refs, root / "cases", per_modality=3)
    index = reference(fp32, cases, 8, root / "reference.npz")
    facts = decoder_feeds(fp32, root / "reference.npz", cases, dec.ckpt, root / "feeds.npz")
    return {"dec": dec, "fp32": fp32, "cases": cases, "index": index, "ref": root / "reference.npz",
            "feeds": root / "feeds.npz", "facts": facts, "root": root, "vision": vis.model("fp32")}


def test_feeds_are_the_decoder_graphs_evaluation_set(chain):
    from vlsens.data.samples import Samples

    facts, index = chain["facts"], chain["index"]
    samples = Samples.load(chain["feeds"], chain["dec"].model("fp32"))
    assert samples.names == [c["name"] for c in index["cases"]] and facts["cases"] == 9
    assert facts["positions"] == sum(len(c["tokens"]) for c in index["cases"])
    for feed, valid, row, case in zip(samples.feeds, samples.valid, facts["per_case"], index["cases"]):
        s = row["sequence"]
        assert s == row["prompt"] + len(case["tokens"]) - 1
        assert valid.shape == (1, s) and int(valid.sum()) == len(case["tokens"]) and valid[0, -1]
        assert not valid[0, :row["prompt"] - 1].any()
        assert feed["inputs_embeds"].shape[:2] == (1, s) and feed["position_ids"].shape == (3, 1, s)
        assert feed["past_key_values.0.key"].shape[2] == 0
    images = [r for r, c in zip(facts["per_case"], index["cases"]) if c["modality"] != "text"]
    text = [r for r, c in zip(facts["per_case"], index["cases"]) if c["modality"] == "text"]
    assert min(r["prompt"] for r in images) > max(r["prompt"] for r in text)  # the image tokens are in


def test_fp32_chain_equals_the_runtimes_teacher_forcing(chain):
    from vlsens.deploy.genai.chain import chain_kl

    rows = chain_kl(chain["fp32"] / "decoder.onnx", chain["feeds"], chain["ref"], threads=2)
    assert [r["name"] for r in rows] == [c["name"] for c in chain["index"]["cases"]]
    for row, case in zip(rows, chain["index"]["cases"]):
        assert abs(row["kl"]) < 1e-9 and abs(row["max_kl"]) < 1e-9 and row["top1"] == 1.0, row
        assert row["steps"] == len(case["tokens"]) and row["modality"] == case["modality"]


def test_another_decoder_graph_is_refused(chain, tmp_path):
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.genai.chain import check_same_graph

    assert check_same_graph(chain["fp32"])["inputs_embeds"] == 1  # the folder's record: its source graph
    with pytest.raises(VlsensError, match="differ in their inputs"):
        check_same_graph(chain["fp32"], chain["fp32"] / "embedding.onnx")


@pytest.fixture(scope="module")
def int4(chain):
    """The all-INT4 decoder (every weight MatMul) in a copy of the fp32 folder as its decoder, the
    folder through the measure, and the decoder on the chain."""
    from vlsens.core.onnxutil import copy_model
    from vlsens.deploy.genai import folder as genai
    from vlsens.deploy.genai.chain import chain_kl
    from vlsens.deploy.genai.measure import measure_folder
    from vlsens.quantize.nbits import quantize, weight_matmuls

    root, fp32 = chain["root"], chain["dec"].model("fp32")
    ops = [o["name"] for o in weight_matmuls(fp32)]
    (root / "q4").mkdir()
    q = quantize(fp32, root / "q4" / "model.onnx", dict.fromkeys(ops, 4), SETTINGS)
    folder = root / "int4"
    # a measurement vehicle, not a folder vlsens published: without the fp32 folder's records, which
    # list the decoder it replaces (the runtime checks a folder against them before loading it)
    shutil.copytree(chain["fp32"], folder,
                    ignore=shutil.ignore_patterns(genai.GRAPHS["decoder"] + "*", "parity.json", "eval.json"))
    copy_model(q, folder / genai.GRAPHS["decoder"])
    return {"model": q, "folder": folder, "ops": ops,
            "measure": measure_folder(folder, chain["ref"], chain["cases"], "int4"),
            "chain": chain_kl(q, chain["feeds"], chain["ref"], threads=2)}


def _pooled(rows) -> float:
    """The mean KL over all steps of all cases."""
    return sum(r["kl"] * r["steps"] for r in rows) / sum(r["steps"] for r in rows)


def test_int4_chain_equals_the_measure(int4):
    from vlsens.quantize.nbits import quantized_nodes

    assert {v["bits"] for v in quantized_nodes(int4["folder"] / "decoder.onnx").values()} == {4}
    rows, measured = int4["chain"], int4["measure"]["cases"]
    for a, b in zip(rows, measured, strict=True):
        assert a["name"] == b["name"] and a["steps"] == b["steps"] and b["kl"] > 1e-6, (a, b)
        assert a["kl"] == pytest.approx(b["kl"], rel=CASE_REL), (a, b)
        assert a["max_kl"] == pytest.approx(b["max_kl"], rel=CASE_REL) and a["top1"] == b["top1"], (a, b)
    assert any(r["top1"] < 1 for r in measured)  # INT4 changes the tokens somewhere: not a trivial pass
    assert _pooled(rows) == pytest.approx(_pooled(measured), rel=CASE_REL)


def test_nbits_engine_on_the_chain_equals_the_measure(chain, int4, tmp_path):
    from vlsens.sensitivity import nbits as nb

    nb.prepare(chain["dec"].model("fp32"), chain["feeds"], tmp_path / "engine", SETTINGS, threads=2, logits=True)
    eng_dir = nb.Prepared(tmp_path / "engine")
    eng = eng_dir.session(chain["feeds"], threads=2)
    assert eng_dir.ops == int4["ops"]
    got = nb.error(eng.evaluate(dict.fromkeys(eng_dir.ops, 4), eng_dir.reference()), eng.logits)
    assert got == pytest.approx(_pooled(int4["chain"]), rel=ENGINE_REL)
    assert got == pytest.approx(_pooled(int4["measure"]["cases"]), rel=ENGINE_REL)
    assert nb.error(eng.evaluate({}, eng_dir.reference()), eng.logits) == 0.0  # its float pass is the fp32 chain


#: Every op's KL with lm_head at the read positions only against lm_head at every position. Measured
#: on the tiny preset: float and every INT4 assignment identical; lm_head at INT8 differs in the last
#: bits of its logits (MatMulNBits sums fewer rows in another order), 0.45 % of a KL of 8.8e-7.
READ_ROWS_REL = 2e-2


def test_the_engine_computes_logits_only_where_the_measure_reads_them(chain, tmp_path):
    """The measure's set is marked read-only, so the engine's switch model gathers lm_head's input
    at the read positions: every op alone at both widths gives the engine's KL over every position
    (the same set unmarked), the float pass is the reference exactly, and the reference holds the
    read rows only."""
    import csv

    import numpy as np
    import onnx

    from vlsens.data.samples import Samples
    from vlsens.sensitivity import nbits as nb

    samples = Samples.load(chain["feeds"])
    assert samples.read_only and all(v is not None for v in samples.valid)
    samples.read_only = False
    every = tmp_path / "every.npz"
    samples.save(every)
    assert not Samples.load(every).read_only
    scores = {}
    for name, evaluation in (("read", chain["feeds"]), ("every", every)):
        meta = nb.prepare(chain["dec"].model("fp32"), evaluation, tmp_path / name, SETTINGS, threads=2, logits=True)
        assert meta["read_rows"] is (name == "read")
        nb.sensitivity(tmp_path / name, evaluation, tmp_path / f"{name}.csv", tmp_path / f"{name}.json", threads=2)
        with open(tmp_path / f"{name}.csv") as f:
            scores[name] = {r["op"]: r for r in csv.DictReader(f)}
    switch = onnx.load(str(tmp_path / "read" / nb.FILES["switch"]), load_external_data=False)
    assert nb.POSITIONS_INPUT in {i.name for i in switch.graph.input}
    ref = nb.Prepared(tmp_path / "read").reference()
    assert [r.shape[1] for r in ref] == [int(v.sum()) for v in samples.valid]  # the read rows, nothing else
    assert set(scores["read"]) == set(scores["every"]) and len(scores["read"]) == 15
    assert sum(float(r["kl_int4"]) > 1e-6 for r in scores["every"].values()) >= 5  # not a trivial comparison
    for op, row in scores["read"].items():
        for b in (4, 8):
            got, want = float(row[f"kl_int{b}"]), float(scores["every"][op][f"kl_int{b}"])
            rel = READ_ROWS_REL if (op, b) == ("/lm_head/MatMul", 8) else 1e-6
            assert got == pytest.approx(want, rel=rel, abs=1e-10), (op, b)  # KL at 1e-8: float32 noise
            assert float(row[f"top1_int{b}"]) == float(scores["every"][op][f"top1_int{b}"]), (op, b)
    eng_dir = nb.Prepared(tmp_path / "read")
    eng = eng_dir.session(chain["feeds"], threads=2)
    assert nb.error(eng.evaluate({}, eng_dir.reference()), True) == 0.0
    assert np.all([f[nb.POSITIONS_INPUT].size == int(v.sum()) for f, v in zip(eng.samples.feeds, samples.valid)])


def test_the_engine_prices_on_a_stratified_subset_of_the_cases(chain, tmp_path):
    """A subset of the cases to price on: every op alone is priced on the named cases (their KL, not the whole
    set's), the output errors of the estimate on the same cases, and the uniform models stay on
    every case; nbits.json names the cases and their positions."""
    import csv
    import json

    from vlsens.deploy.cases import pricing_cases
    from vlsens.sensitivity import nbits as nb

    names = pricing_cases(chain["cases"], 3)
    assert [n.split("-")[0] for n in names] == ["text", "image", "images"]
    nb.prepare(chain["dec"].model("fp32"), chain["feeds"], tmp_path / "eng", SETTINGS, threads=2, logits=True)
    out = {}
    for key, on, measured in (("all", None, None), ("sub", names, None), ("est", names, 6)):
        nb.sensitivity(tmp_path / "eng", chain["feeds"], tmp_path / f"{key}.csv", tmp_path / f"{key}.json", threads=2,
                       measured=measured, price_on=on)
        with open(tmp_path / f"{key}.csv") as f:
            out[key] = ({r["op"]: r for r in csv.DictReader(f)}, json.loads((tmp_path / f"{key}.json").read_text()))
    eng_dir = nb.Prepared(tmp_path / "eng")
    eng, ref = eng_dir.session(chain["feeds"], threads=2), eng_dir.reference()
    idx = eng.indices(names)
    assert [eng.samples.names[i] for i in idx] == names
    rows, summary = out["sub"]
    assert summary["priced_on"]["cases"] == names and summary["priced_on"]["of"] == 9
    assert 0 < summary["priced_on"]["positions"] < summary["priced_on"]["positions_of"]
    assert "priced_on" not in out["all"][1]
    differ = 0
    for op, row in rows.items():
        for b in (4, 8):
            sub = nb.error(eng.evaluate({op: b}, ref, idx), True)
            assert float(row[f"kl_int{b}"]) == pytest.approx(sub, rel=1e-9, abs=1e-12), (op, b)
            differ += abs(float(out["all"][0][op][f"kl_int{b}"]) - sub) > 1e-3 * abs(sub) + 1e-10
    assert differ >= 10  # the subset's KL is its own, not the whole set's
    for b in ("all_int4", "all_int8"):  # the uniform models on every case
        assert summary[b]["kl"] == pytest.approx(out["all"][1][b]["kl"], rel=1e-9)
    est_rows, est = out["est"]
    assert sum(int(r["measured"]) for r in est_rows.values()) == 6 and est["priced_on"]["cases"] == names
    for op, row in est_rows.items():  # a measured op's price is the subset's measure, like the table's
        if int(row["measured"]):
            assert float(row["kl_int4"]) == pytest.approx(float(rows[op]["kl_int4"]), rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match="not in the evaluation set"):
        eng.indices(["text-99"])


#: A vision or embedding format's KL per case, the chain (:class:`vlsens.deploy.genai.chain.PartChain`:
#: the fp32 decoder's one prefill) against the measure of the folder assembled with that part
#: (onnxruntime-genai's prefill and decode steps). The float32 decoder is the same in both, so they
#: differ by the decode steps' float32 rounding alone (as the fp32 folder's, at most a few ulps of
#: the logits): measured on the tiny preset at most 6.3e-7 relative (2.4e-7 for the vision graph's
#: mean KL per case, 3.2e-7 for the table's); the same margin as an INT4 decoder's.
PART_REL = CASE_REL


@pytest.fixture(scope="module")
def parts(chain):
    """The tiny preset's vision graph with every Linear at INT4 and the embedding table at INT4,
    each in a folder assembled from the fp32 folder's other parts (as the components' folders
    were) and measured, and the same parts on the chain."""
    from vlsens.core.artifacts import file_entries
    from vlsens.core.fsutil import write_json
    from vlsens.core.onnxutil import copy_model
    from vlsens.deploy.genai import folder as genai
    from vlsens.deploy.genai.assemble import assemble
    from vlsens.deploy.genai.chain import PartChain
    from vlsens.deploy.genai.measure import measure_folder
    from vlsens.precision.weight_only import quantize_embedding, quantize_vision

    root, dec = chain["root"] / "parts", chain["dec"]
    vis_fp32 = chain["vision"]
    vision, embedding = root / "vision" / "model.onnx", root / "embedding" / "model.onnx"
    quantize_vision(vis_fp32, vision, SETTINGS)
    quantize_embedding(dec.folder("fp32") / "embedding.onnx", embedding, 32, True, bits=4)
    for g in (vision, embedding):  # as published: a record beside each lists it (the folder verifies its parts)
        write_json(g.with_name("parity.json"), {"files": file_entries([g])})
    preamble = chain["fp32"] / genai.GRAPHS["vision"]
    measured = {}
    for part, graphs in (("vision", (dec.model("fp32"), dec.folder("fp32") / "embedding.onnx", vision)),
                         ("embedding", (dec.model("fp32"), embedding, vis_fp32))):
        folder = root / part / "folder"
        assemble(folder, dec.ckpt, *graphs, root / part / "work", preamble_from=preamble)
        measured[part] = measure_folder(folder, chain["ref"], chain["cases"], part)
    pc = PartChain(chain["fp32"], chain["ref"], chain["cases"], dec.ckpt, threads=2)
    wrapped = root / "vision" / "folder" / genai.GRAPHS["vision"]
    return {"measured": measured, "chain": pc,
            "chained": {"vision": pc.measure("vision", vision=wrapped),
                        "embedding": pc.measure("embedding", embedding=copy_model(embedding, root / "named" /
                                                                                   genai.GRAPHS["embedding"]))},
            "folders": {p: root / p / "folder" for p in ("vision", "embedding")}}


def test_the_fp32_folder_on_the_part_chain_is_its_own_measure(chain, parts):
    assert parts["chain"].read_rows  # lm_head at the read positions alone (test_the_chain_computes_logits_only_...)
    m = parts["chain"].measure("fp32")
    assert [r["name"] for r in m["cases"]] == [c["name"] for c in chain["index"]["cases"]]
    assert all(abs(r["kl"]) < 1e-9 and r["top1"] == 1.0 for r in m["cases"]), m["cases"]


@pytest.mark.parametrize("part", ["vision", "embedding"])
def test_a_part_on_the_chain_equals_the_measure_of_its_folder(parts, part):
    from vlsens.deploy.genai.measure import folder_weight_bytes

    chained, measured = parts["chained"][part], parts["measured"][part]
    for a, b in zip(chained["cases"], measured["cases"], strict=True):
        assert a["name"] == b["name"] and a["steps"] == b["steps"] and a["top1"] == b["top1"], (a, b)
        if b["modality"] == "text" and part == "vision":
            assert a["kl"] < 1e-9 and b["kl"] < 1e-9, (a, b)  # the vision graph does not reach a text prompt
            continue
        assert b["kl"] > 1e-7, b  # the part changes the answer's distribution: not a trivial pass
        assert a["kl"] == pytest.approx(b["kl"], rel=PART_REL), (a, b)
        assert a["max_kl"] == pytest.approx(b["max_kl"], rel=PART_REL), (a, b)
    assert chained["mean_kl"] == pytest.approx(measured["mean_kl"], rel=PART_REL)
    assert chained["bytes"] == folder_weight_bytes(parts["folders"][part])
    for m, s in measured["modalities"].items():
        assert chained["modalities"][m]["mean_kl"] == pytest.approx(s["mean_kl"], rel=PART_REL, abs=1e-9)


def test_the_part_chain_runs_only_the_modalities_asked_and_each_image_once(chain, parts, monkeypatch):
    from vlsens.deploy.genai import chain as ch
    from vlsens.deploy.genai.chain import PartChain

    pc = PartChain(chain["fp32"], chain["ref"], chain["cases"], chain["dec"].ckpt, threads=2,
                   modalities={"image", "images"})
    calls = []
    real = ch._features
    monkeypatch.setattr(ch, "_features", lambda s, p, h: calls.append(p["image_grid_thw"].tolist()) or real(s, p, h))
    wrapped = parts["folders"]["vision"] / "vision.onnx"
    m = pc.measure("vision", vision=wrapped)
    want = {r["name"]: r for r in parts["chained"]["vision"]["cases"]}
    assert {r["modality"] for r in m["cases"]} == {"image", "images"}
    for r in m["cases"]:
        assert r == want[r["name"]]
    images = [f["path"] for c in chain["cases"] if c["images"] for f in c["images"]]
    assert len(calls) == len(set(images)) < len(images), (calls, images)
    with pytest.raises(Exception, match="none of the cases"):
        PartChain(chain["fp32"], chain["ref"], chain["cases"], chain["dec"].ckpt, modalities={"video"})


def test_a_whole_folder_on_the_part_chain_equals_its_measure(chain, int4, parts):
    """A plan folder's measure (vlsens.budget.build.plan_job) is the part chain on the folder
    itself: every part its own -- an INT4 decoder, an INT4 vision graph, an INT4 table -- as the
    runtime's measure of the folder gives it, case by case."""
    import onnx

    from vlsens.core.artifacts import file_entries
    from vlsens.core.fsutil import write_json
    from vlsens.deploy.genai.assemble import assemble
    from vlsens.deploy.genai.chain import RUNNER, PartChain
    from vlsens.deploy.genai.measure import REFERENCE, folder_weight_bytes, measure_folder
    from vlsens.quantize.nbits import quantized_nodes

    root = chain["root"] / "whole"
    write_json(int4["model"].with_name("parity.json"), {"files": file_entries([int4["model"]])})
    parts_root = chain["root"] / "parts"
    folder = root / "folder"
    assemble(folder, chain["dec"].ckpt, int4["model"], parts_root / "embedding" / "model.onnx",
             parts_root / "vision" / "model.onnx", root / "work", preamble_from=chain["fp32"] / "vision.onnx")
    for graph in ("decoder.onnx", "vision.onnx"):
        assert {v["bits"] for v in quantized_nodes(folder / graph).values()} == {4}, graph
    table = onnx.load(str(folder / "embedding.onnx"), load_external_data=False)
    assert [n.attribute for n in table.graph.node if n.op_type == "GatherBlockQuantized"], "an INT4 table"
    measured = measure_folder(folder, chain["ref"], chain["cases"], "whole")
    pc = PartChain(folder, chain["ref"], chain["cases"], chain["dec"].ckpt, threads=2)
    assert pc.read_rows  # its lm_head a MatMulNBits, computed at the read positions alone
    chained = pc.measure("whole")
    assert chained["reference"] == measured["reference"] == REFERENCE and chained["runner"] == RUNNER
    assert "runner" not in measured
    for a, b in zip(chained["cases"], measured["cases"], strict=True):
        assert a["name"] == b["name"] and a["steps"] == b["steps"] and a["top1"] == b["top1"], (a, b)
        assert b["kl"] > 1e-6, b  # every part changes the answer: not a trivial pass
        assert a["kl"] == pytest.approx(b["kl"], rel=CASE_REL), (a, b)
        assert a["max_kl"] == pytest.approx(b["max_kl"], rel=CASE_REL), (a, b)
    assert chained["mean_kl"] == pytest.approx(measured["mean_kl"], rel=CASE_REL)
    assert chained["bytes"] == measured["bytes"] == folder_weight_bytes(folder)
    for m, s in measured["modalities"].items():
        assert chained["modalities"][m]["mean_kl"] == pytest.approx(s["mean_kl"], rel=CASE_REL)


def test_the_chain_computes_logits_only_where_the_measure_reads_them(chain, int4):
    """The part chain's decoder (:func:`read_rows_session`) gives lm_head's rows at the positions
    fed and no others: equal to the folder's own graph's logits there (float: the same dot products;
    INT4 within the kernel's rounding), for the fp32 decoder (MatMul) and an INT4 one
    (MatMulNBits); a graph whose logits another node writes runs as it is."""
    import numpy as np
    import onnx
    from onnx import helper

    from vlsens.core.onnxutil import make_session
    from vlsens.data.samples import Samples
    from vlsens.deploy.genai.chain import READ_POSITIONS, read_rows_session

    samples = Samples.load(chain["feeds"])
    for graph in (chain["fp32"] / "decoder.onnx", int4["model"]):
        plain = make_session(graph, threads=2)
        session, reads = read_rows_session(graph, threads=2)
        assert reads, graph
        output = plain.get_outputs()[0].name
        for feed, valid in zip(samples.feeds[:4], samples.valid[:4]):
            rows = np.flatnonzero(valid[0]).astype(np.int64)
            whole = plain.run([output], feed)[0][0]
            read = session.run([output], {**feed, READ_POSITIONS: rows})[0][0]
            assert read.shape == (len(rows), whole.shape[-1]) and len(rows) < whole.shape[0]
            np.testing.assert_allclose(read, whole[rows], rtol=1e-5, atol=1e-5 * np.abs(whole).max())
    m = onnx.load(str(chain["fp32"] / "decoder.onnx"))  # the tiny decoder, its weights in memory
    out = m.graph.output[0].name
    head = next(n for n in m.graph.node if out in n.output)
    head.output[0] = f"{out}_raw"
    m.graph.node.append(helper.make_node("Identity", [f"{out}_raw"], [out]))
    other = chain["root"] / "identity-logits" / "decoder.onnx"
    other.parent.mkdir(exist_ok=True)
    onnx.save_model(m, str(other), save_as_external_data=True, location="decoder.onnx.data")
    session, reads = read_rows_session(other, threads=2)
    feed = samples.feeds[0]
    assert not reads and session.run([out], feed)[0].shape == plain.run([output], feed)[0].shape


def test_a_spliced_vision_graph_is_the_one_quantize_vision_writes(chain, parts, tmp_path):
    """budget_vision measures each mix of INT4, INT8 weight-only and float Linears as a
    VisionSplice of the wrapped float graph and the run's all-INT4 and all-INT8 graphs (only the
    changed Linears' tensors written): every quantized node and tensor is the one
    quantize_vision + wrap_vision writes for that mix, the chain's measure is the same, and the
    bytes as shipped differ by the data offsets' digits at most; a source quantized on other
    settings is refused."""
    import json

    import numpy as np
    import onnx

    from vlsens.core.errors import VlsensError
    from vlsens.core.onnxutil import model_bytes, tensor_array
    from vlsens.deploy.genai import folder as genai
    from vlsens.precision.weight_only import FORMATS, VisionSplice, linears, quantize_vision

    fp32, preamble = chain["vision"], chain["fp32"] / genai.GRAPHS["vision"]
    int4 = chain["root"] / "parts" / "vision" / "model.onnx"  # the parts' all-INT4 graph, on SETTINGS
    int8 = tmp_path / "int8" / "model.onnx"
    quantize_vision(fp32, int8, SETTINGS, FORMATS["int8-wo"])
    ops = [o["name"] for o in linears(fp32)]
    mix = {op: (FORMATS["int4"], FORMATS["int8-wo"], None)[i % 3] for i, op in enumerate(ops)}
    quantize_vision(fp32, tmp_path / "built" / "model.onnx", SETTINGS, per_op=mix)
    built = genai.wrap_vision(tmp_path / "built" / "model.onnx", tmp_path / "built" / "vision.onnx", None,
                              tmp_path / "pre1", preamble)
    quantize_vision(fp32, tmp_path / "float" / "model.onnx", SETTINGS, per_op=dict.fromkeys(ops))
    base = genai.wrap_vision(tmp_path / "float" / "model.onnx", tmp_path / "splice" / "vision.onnx", None,
                             tmp_path / "pre2", preamble)
    splice = VisionSplice(base, {"int4": int4, "int8-wo": int8}, SETTINGS)
    spliced, shipped = splice.write("mix", {op: f.name if f else None for op, f in mix.items()})

    def quantized(path):
        m = onnx.load(str(path), load_external_data=False)
        inits = {t.name: t for t in m.graph.initializer}
        return {n.name: (list(n.input)[:1] + list(n.output), {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute},
                         [np.asarray(tensor_array(inits[x], path.parent)) for x in n.input[1:] if x in inits])
                for n in m.graph.node if n.op_type == "MatMulNBits"}, [n.op_type for n in m.graph.node]

    (a, order_a), (b, order_b) = quantized(built), quantized(spliced)
    assert order_a == order_b and len(a) == sum(f is not None for f in mix.values()) == len(b)
    assert {n[:-3] for n in a} == {op for op, f in mix.items() if f is not None}
    for name, (io, attrs, tensors) in a.items():
        assert b[name][:2] == (io, attrs), name
        assert all(np.array_equal(x, y) for x, y in zip(tensors, b[name][2], strict=True)), name
    ref, got = parts["chain"].measure("built", vision=built), parts["chain"].measure("spliced", vision=spliced)
    for x, y in zip(ref["cases"], got["cases"], strict=True):
        assert x["kl"] == pytest.approx(y["kl"], rel=1e-12, abs=1e-15) and x["top1"] == y["top1"], (x, y)
    assert max(r["kl"] for r in got["cases"]) > 1e-7  # the mix changes the answers: not a trivial pass
    external = sum(1 for t in onnx.load(str(built), load_external_data=False).graph.initializer
                   if t.data_location == onnx.TensorProto.EXTERNAL)
    print(f"\nspliced: {shipped} bytes as shipped, quantize_vision's graph {model_bytes(built)} "
          f"({external} external tensors); the variant's own files {model_bytes(spliced)}")
    assert abs(shipped - model_bytes(built)) <= 8 * external
    assert model_bytes(spliced) < model_bytes(built) / 2
    splice.remove("mix")
    assert not spliced.exists() and base.exists()
    record = int8.with_name("parity.json")
    record.write_text(json.dumps({"extra": {"graphs": {"model.onnx": {"format": "int8-wo", "run_settings": {
        **SETTINGS.as_dict(), "block_size": 128}}}}}))
    with pytest.raises(VlsensError, match="not as 'int8-wo' on the run's"):
        VisionSplice(base, {"int8-wo": int8}, SETTINGS)
