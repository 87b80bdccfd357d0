"""``deploy.nbits.embedding: tied``: on a checkpoint that ties lm_head to the embedding table, the
int4 folders' embedding graph gathers lm_head's quantized weight from the decoder's data file (no
bytes of its own), gated exactly on lm_head's rows; the int4-mixed profile measures lm_head with
its table, so the table's error is inside the KL budget."""

import json
import shutil

import numpy as np
import onnx
import pytest
from conftest import TOL_FP32, build_graph

from vlsens.core.errors import ParityError, VlsensError
from vlsens.core.onnxutil import make_session
from vlsens.precision.weight_only import gate_tied, tied_embedding
from vlsens.quantize.nbits import NBitsSettings, lm_head_table, quantize, weight_matmuls
from vlsens.sensitivity import nbits as nb

LM = "/lm_head/MatMul"


@pytest.fixture(scope="module")
def tied(tmp_path_factory, parity_refs):
    """The tiny preset with tie_word_embeddings (same seed: only lm_head differs from the preset),
    through the decoder's stages and engine nbits."""
    from vlsens.model.presets.build import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("tied")
    ckpt = build_tiny_checkpoint(root / "ckpt", seed=0, tied=True)
    b = build_graph("decoder", ckpt, root / "decoder", parity_refs)
    nb.prepare(b.model("fp32"), b.calib / "eval.npz", root / "engine", NBitsSettings(), threads=2, logits=True)
    nb.sensitivity(root / "engine", b.calib / "eval.npz", root / "nbits.csv", root / "nbits.json", 2)
    return b, root


def _token(ckpt) -> int:
    return int(json.loads((ckpt / "config.json").read_text())["image_token_id"])


def _folder(b, dst, bits):
    """A folder with the decoder's lm_head at ``bits`` (0: float; every other MatMul INT4) and the
    tied embedding beside it."""
    dst.mkdir()
    fl = b.model("fp32")
    ops = {o["name"]: 4 for o in weight_matmuls(fl)}
    ops[LM] = bits
    quantize(fl, dst / "decoder.onnx", {n: v for n, v in ops.items() if v}, NBitsSettings())
    facts = tied_embedding(dst / "decoder.onnx", b.folder("fp32") / "embedding.onnx", dst / "embedding.onnx")
    return facts


@pytest.mark.parametrize("bits", [4, 8, 0])
def test_tied_embedding_reads_lm_head_where_it_is_stored(tied, tmp_path, bits):
    b, _ = tied
    facts = _folder(b, tmp_path / "f", bits)
    assert facts["own_bytes"] == 0 and facts["bits"] == bits
    assert not (tmp_path / "f" / "embedding.onnx.data").exists()
    m = onnx.load(str(tmp_path / "f" / "embedding.onnx"), load_external_data=False)
    refs = [{e.key: e.value for e in t.external_data} for t in m.graph.initializer if t.external_data]
    assert refs and all(r["location"] == "decoder.onnx.data" for r in refs)  # the decoder's bytes, nothing else
    assert [n.op_type for n in m.graph.node][0] == ("GatherBlockQuantized" if bits else "Gather")
    rec = gate_tied(tmp_path / "f", b.reference, _token(b.ckpt), TOL_FP32)
    assert rec["passed"] and rec["metrics"]["max_rel_error"] == 0.0  # ORT's kernel gathers lm_head's rows exactly
    fr = rec["extra"]["float_reference"]["metrics"]  # against the checkpoint's table: lm_head's quantization
    if bits == 0:
        assert fr["max_rel_error"] == 0.0  # tied: the float lm_head is the table
    else:
        assert (0.99 if bits == 4 else 0.9999) < fr["min_cosine"] < 1 - 1e-9, fr


def test_tied_embedding_gate_fails_on_a_wrong_table(tied, tmp_path):
    """The same graph reading another matrix of lm_head's shape (its rows shifted by one block row)
    misses the gate; an untied decoder's lm_head shape mismatch is refused when the graph is made."""
    b, _ = tied
    _folder(b, tmp_path / "f", 4)
    m = onnx.load(str(tmp_path / "f" / "embedding.onnx"), load_external_data=False)
    table = next(t for t in m.graph.initializer if t.name == "tied_table")
    for e in table.external_data:
        if e.key == "offset":
            e.value = str(int(e.value) + table.dims[1])  # one row later
    onnx.save_model(m, str(tmp_path / "f" / "embedding.onnx"))
    with pytest.raises(ParityError):
        gate_tied(tmp_path / "f", b.reference, _token(b.ckpt), TOL_FP32)
    with pytest.raises(VlsensError, match="beside"):
        tied_embedding(tmp_path / "f" / "decoder.onnx", b.folder("fp32") / "embedding.onnx", tmp_path / "e.onnx")


def test_text_rows_are_found_exactly(tied):
    from vlsens.data.samples import Samples
    from vlsens.precision.nbits import text_ids

    b, root = tied
    table = lm_head_table(root / "engine" / nb.FILES["float"])
    samples = Samples.load(b.calib / "eval.npz", root / "engine" / nb.FILES["float"])
    for name, f in zip(samples.names, samples.feeds):
        ids = text_ids(f["inputs_embeds"], table)
        found = ids[0] >= 0
        if name.startswith("text-"):  # a text prompt: every row a table row
            assert found.all(), name
        else:  # an image prompt: its image rows (features) are not taken for text, the rest are
            assert 0 < (~found).sum() < found.size, name
        np.testing.assert_array_equal(f["inputs_embeds"][0][found], table[ids[0][found]])
    # rows that are not table rows (image features; a row off by one ulp) are not taken for text
    x = next(f for n, f in zip(samples.names, samples.feeds) if n.startswith("text-"))["inputs_embeds"].copy()
    rng = np.random.default_rng(0)
    x[0, 3:9] = rng.standard_normal((6, x.shape[-1])).astype(np.float32)
    x[0, 10, 5] = np.nextafter(x[0, 10, 5], np.float32(np.inf))
    ids = text_ids(x, table)
    assert (ids[0, 3:9] == -1).all() and ids[0, 10] == -1 and (ids[0, 11:] >= 0).all()


def test_profile_budgets_the_tied_table(tied, tmp_path):
    """The search measures lm_head with its table; the built model run on embeddings gathered from
    its own lm_head (as the folder's embedding graph gathers them) has the record's error."""
    import pandas as pd

    from vlsens.core.metrics import Metrics
    from vlsens.precision.nbits import SearchSettings, build, text_ids

    b, root = tied
    eval_npz = b.calib / "eval.npz"
    plain = build(root / "engine", eval_npz, root / "nbits.csv", tmp_path / "plain", SearchSettings(1e-3, threads=2))
    rec = build(root / "engine", eval_npz, root / "nbits.csv", tmp_path / "tied",
                SearchSettings(1e-3, threads=2, tied=True))
    assert plain["tied"] is None
    t = rec["tied"]
    csv = pd.read_csv(root / "nbits.csv").set_index("op")
    assert t["op"] == LM and t["csv"]["error_int4"] == csv.loc[LM, "error_int4"]
    assert t["with_table"]["error_int4"] > 1.5 * t["csv"]["error_int4"]  # the table's error, now counted
    assert rec["built"]["kl"] <= 1e-3
    # independent of the engine: the built model on the feeds a tied folder gives it
    model = tmp_path / "tied" / "model.onnx"
    e = nb.Prepared(root / "engine")
    samples, ref = e.session(eval_npz).samples, e.reference()
    table, own = lm_head_table(e.folder / nb.FILES["float"]), lm_head_table(model)
    sess, acc = make_session(model, threads=2), Metrics(True)
    for i, f in enumerate(samples.feeds):
        ids = text_ids(f["inputs_embeds"], table)
        x = f["inputs_embeds"].copy()
        x[ids >= 0] = own[ids[ids >= 0]]
        acc.add(sess.run(["logits"], {**f, "inputs_embeds": x})[0], ref[i], samples.valid[i])
    assert acc.result()["kl"] == rec["built"]["kl"]


def test_a_tied_folder_runs_in_onnxruntime_genai(tied, graph_builder, parity_refs, tmp_path):
    """The int4 decoder with its tied embedding behind onnxruntime-genai: the folder loads, its
    embedding gate is recorded, and it generates close to the fp32 folder of the same checkpoint."""
    from vlsens.deploy.build import build_folder
    from vlsens.deploy.genai.evaluate import Checks

    b, root = tied
    vis = graph_builder("vision/dynamic")  # the tied preset's vision tower is the preset's (same seed)
    tol = {"min_cosine": 0.98, "max_rel_error": 0.3}
    build_folder("fp32", tmp_path / "fp32", b.ckpt, b.model("fp32"), b.folder("fp32") / "embedding.onnx",
                 vis.model("fp32"), parity_refs, Checks(16, TOL_FP32))
    prof = tmp_path / "prof"
    rec = build(root, b, prof)
    out = build_folder("int4-mixed", tmp_path / "int4", b.ckpt, prof / "model.onnx", b.folder("fp32") / "embedding.onnx",
                       vis.model("fp32"), parity_refs,
                       Checks(16, tol, fp32_folder=tmp_path / "fp32",
                              tied={"reference": b.reference, "exact_tolerance": TOL_FP32}))
    parity = json.loads((tmp_path / "int4" / "parity.json").read_text())
    assert parity["embedding"]["passed"] and parity["embedding"]["metrics"]["max_rel_error"] == 0.0
    assert "embedding.onnx.data" not in parity["files"] and not (tmp_path / "int4" / "embedding.onnx.data").exists()
    assert 0 < out["mean_kl"] < 0.05 and out["top1_agreement"] > 0.7, out
    assert rec["tied"]["op"] == LM


def build(root, b, dst):
    """The tied int4-mixed decoder as a published variant folder (the deploy job's input)."""
    from vlsens.export.towers.decoder import weight_reference
    from vlsens.precision.nbits import SearchSettings, profile_folder
    from vlsens.variants import Gate

    shutil.rmtree(dst, ignore_errors=True)
    gate = Gate({"min_cosine": 0.98, "max_rel_error": 0.3}, 2, exact_tolerance=TOL_FP32,
                reference_for=lambda staged, cases: weight_reference(b.ckpt, staged["model.onnx"], cases))
    rec = profile_folder(root / "engine", b.calib / "eval.npz", root / "nbits.csv", b.folder("fp32"), b.reference,
                         dst, SearchSettings(1e-3, threads=2, tied=True), gate)
    return rec["extra"]["graphs"]["model.onnx"]["search"]


def test_tied_is_refused_for_an_untied_checkpoint_and_sources_its_cases(tmp_path):
    from conftest import default_config

    from vlsens.core.errors import ConfigError
    from vlsens.dag.plan import lm_config
    from vlsens.deploy import check_config, sources

    def ties(**changes):
        return lm_config(default_config(**changes))["tie_word_embeddings"]

    tied = {"deploy.nbits.embedding": "tied"}
    with pytest.raises(ConfigError, match=r"deploy\.nbits\.embedding: tied.*tie_word_embeddings: false"):
        check_config(default_config(**tied), ties=ties())  # the tiny preset unties them
    assert ties(**{"model.checkpoint": "3b"}) is True
    check_config(default_config(**tied, **{"model.checkpoint": "3b"}), ties=True)
    ckpt = tmp_path / "mine"
    ckpt.mkdir()
    for flag in (True, False):
        (ckpt / "config.json").write_text(json.dumps({"tie_word_embeddings": flag, "text_config": {}}))
        assert ties(**{"model.checkpoint": str(ckpt)}) is flag
    check_config(default_config(**tied), ties=True)
    src = sources("int4-mixed", "int4", "tied")
    assert src["embedding_reference"] == "results/{model}/decoder/reference.npz" and "embedding" not in src
    assert "embedding_reference" not in sources("fp32", "int4", "tied")


def test_the_heatmap_shows_lm_head_with_its_tied_table(tmp_path, monkeypatch):
    """The report's heatmap colours lm_head by the error the profile measured with its table."""
    from vlsens.report import build as report
    from vlsens.report import figures

    rows = [{"rank": 1, "op": "/model/layers.0/mlp/down_proj/MatMul", "block": 0, "role": "mlp.down_proj",
             "error_int4": 1e-3, "kl_int4": 1e-3},
            {"rank": 2, "op": LM, "block": "", "role": "lm_head", "error_int4": 1e-4, "kl_int4": 1e-4}]
    import pandas as pd

    pd.DataFrame(rows).to_csv(tmp_path / "nbits.csv", index=False)
    tied = {"op": LM, "csv": {"error_int4": 1e-4}, "with_table": {"error_int4": 5e-3}}
    rec = {"extra": {"graphs": {"model.onnx": {"bits": {LM: 8}, "search": {"tied": tied}}}}}
    (tmp_path / "parity.json").write_text(json.dumps(rec))
    (tmp_path / "int4.json").write_text(json.dumps({"rows": {"int4-mixed": {"decoder_bytes": 1e6, "mean_kl": 0.1}}}))
    seen = {}
    real = figures.nbits_heatmap
    monkeypatch.setattr(figures, "nbits_heatmap", lambda r, *a, **k: seen.setdefault("rows", r) and real(r, *a, **k))
    out = report.int4(tmp_path / "int4.json", tmp_path / "nbits.csv", tmp_path / "parity.json", tmp_path / "p.png",
                      tmp_path / "h.png")
    lm = next(r for r in seen["rows"] if r["op"] == LM)
    assert lm["error_int4"] == 5e-3 and lm["tied"] and out["not_int4"] == 1 and (tmp_path / "h.png").stat().st_size
