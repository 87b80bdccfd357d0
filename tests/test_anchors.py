"""NNCF's weight compression of the decoder (vlsens.deploy.genai.anchors: the nncf-* peers) on the
tiny preset: each recipe's folder is gated on its own weights, its bits are the recipe's, and what it
ships computes what NNCF's own graph computes under ONNX Runtime."""

import numpy as np
import pytest
import yaml
from conftest import REPO

from vlsens.core.onnxutil import make_session
from vlsens.data.samples import Samples

RECIPES = ("nncf-ratio", "nncf-awq", "nncf-optimum")
_CFG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
NBITS_TOLERANCE, EXACT = _CFG["deploy"]["nbits"]["tolerance"], _CFG["parity"]["tolerance"]["fp32"]


@pytest.fixture(scope="module")
def nncf_built(graph_builder, tmp_path_factory):
    """The tiny decoder, its fp32 logits on the evaluation feeds and one folder per recipe."""
    from vlsens.deploy.genai.anchors import nncf_folder

    b = graph_builder("decoder")
    root = tmp_path_factory.mktemp("nncf")
    records = {r: nncf_folder(b.ckpt, r, b.folder("fp32"), b.reference, b.calib / "calib.npz", root / r,
                              NBITS_TOLERANCE, EXACT, threads=2) for r in RECIPES}
    feeds = Samples.load(b.calib / "eval.npz", b.model("fp32")).feeds
    return b, root, records, feeds, _logits(b.model("fp32"), feeds)


def _logits(model, feeds):
    sess = make_session(model, threads=2)
    return [sess.run(["logits"], f)[0] for f in feeds]


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_is_a_gated_compressed_decoder(nncf_built, recipe):
    """parity.json passed, exact half at FP32's tolerance on transformers given the graph's own
    weights; the weights stored in under a third of the fp32 decoder's; logits changed by the
    compression, and still close to fp32's."""
    import json

    from vlsens.precision.nbits import weight_facts

    b, root, records, feeds, fp32 = nncf_built
    rec = json.loads((root / recipe / "parity.json").read_text())
    assert rec["passed"] and rec["extra"]["exact"]["passed"] and "own weights" in rec["reference"]
    assert rec["extra"]["exact"]["metrics"]["max_rel_error"] <= EXACT["max_rel_error"]
    facts = rec["extra"]["graphs"]["model.onnx"]
    assert facts["nncf"]["recipe"] == recipe and facts["nncf"]["version"] == "3.4.0"
    assert facts["nncf"]["wrote"] == {"DequantizeLinear": 15, "MatMul": 15}
    assert len(facts["bits"]) == 15 and set(facts["bits"].values()) <= {4, 8}
    assert facts["weight_bytes"] < weight_facts(b.model("fp32"))["weight_bytes"] / 3
    mine = _logits(root / recipe / "model.onnx", feeds)
    assert max(float(np.abs(m - f).max()) for m, f in zip(mine, fp32)) > 1e-3
    assert min(_cosine(m, f) for m, f in zip(mine, fp32)) > 0.9


def test_the_bits_are_each_recipes(nncf_built):
    """nncf-awq: every MatMul INT4_SYM in groups of 32 (K = 64, 128 allow it). nncf-ratio: INT4_SYM
    below 0.8 of the weights by count, NNCF's INT8_ASYM per channel for the rest, short of 0.8 by
    less than one backup MatMul. nncf-optimum: INT4_ASYM in groups of 128 where K allows, NNCF's
    adjusted 64 where K = 64, lm_head (the last layer) INT8_ASYM per channel."""
    _, _, records, _, _ = nncf_built
    layout = {r: rec["extra"]["graphs"]["model.onnx"]["layout"] for r, rec in records.items()}
    awq = layout["nncf-awq"]
    assert all(v["format"] == "MatMulNBits" and (v["bits"], v["group_size"], v["symmetric"]) == (4, 32, True)
               for v in awq.values())
    ratio, facts = layout["nncf-ratio"], records["nncf-ratio"]["extra"]["graphs"]["model.onnx"]
    backup = [v for v in ratio.values() if v["bits"] == 8]
    assert backup and all((v["format"], v["group_size"], v["symmetric"]) == ("DequantizeLinear", -1, False)
                          for v in backup)
    assert all((v["group_size"], v["symmetric"]) == (32, True) for v in ratio.values() if v["bits"] == 4)
    total = sum(v["K"] * v["N"] for v in ratio.values())
    assert 0.5 < facts["int4_fraction"] < 0.8 <= facts["int4_fraction"] + max(v["K"] * v["N"] for v in backup) / total
    opt = layout["nncf-optimum"]
    assert (opt["/lm_head/MatMul"]["format"], opt["/lm_head/MatMul"]["bits"]) == ("DequantizeLinear", 8)
    assert {v["K"] for v in opt.values()} == {64, 128}
    for name, v in opt.items():
        if name != "/lm_head/MatMul":
            assert (v["bits"], v["symmetric"], v["group_size"]) == (4, False, 128 if v["K"] % 128 == 0 else 64), name


def test_nncf_writes_dequantizelinear_the_folder_ships_what_onnx_runtime_runs(nncf_built, tmp_path):
    """NNCF's own graph: INT4 blocked DequantizeLinear (axis 0) + MatMul, the INT8 backup UINT8 per
    channel; its bytes as stored counted from the format. Its weights as ONNX Runtime dequantizes
    them are the reader's; the folder's MatMulNBits graph (ONNX Runtime's fusion done ahead) holds
    the same weights and gives the same logits, bit for bit."""
    import onnx
    from onnx import TensorProto, helper

    from vlsens.deploy.genai.anchors import nncf_decoder, own_weights

    b, root, records, feeds, _ = nncf_built
    calib = Samples.load(b.calib / "calib.npz", b.model("fp32")).feeds
    dst = tmp_path / "model.onnx"
    facts = nncf_decoder(b.model("fp32"), dst, calib, "ratio")
    m = onnx.load(str(dst), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    dqs = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dqs) == 15 and not any(n.op_type == "MatMulNBits" for n in m.graph.node)
    kinds = {(inits[n.input[0]].data_type, next((a.i for a in n.attribute if a.name == "block_size"), 0)) for n in dqs}
    assert kinds == {(TensorProto.INT4, 32), (TensorProto.UINT8, 0)}
    expected = sum(v["K"] * v["N"] // 2 + 4 * v["K"] // 32 * v["N"] if v["bits"] == 4 else v["K"] * v["N"] + 5 * v["N"]
                   for v in facts["layout"].values())
    assert facts["weight_bytes"] == expected  # INT4 + a float scale per 32; UINT8 + scale and zero point per column
    assert facts["bits"] == records["nncf-ratio"]["extra"]["graphs"]["model.onnx"]["bits"]
    # ONNX Runtime's own dequantization of every weight (no graph optimization)
    probe = onnx.load(str(dst))
    probe.graph.output.extend(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in dqs)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds[0]), strict=True))
    consumer = {n.input[1]: n.name for n in m.graph.node if n.op_type == "MatMul"}
    mine, shipped = dict(own_weights(dst)), dict(own_weights(root / "nncf-ratio" / "model.onnx"))
    assert sorted(mine) == sorted(shipped) == sorted(consumer.values())
    for n in dqs:
        w = mine[consumer[n.output[0]]]
        assert np.array_equal(w, got[n.output[0]]) and np.array_equal(w, shipped[consumer[n.output[0]]])
    theirs, ours = _logits(dst, feeds), _logits(root / "nncf-ratio" / "model.onnx", feeds)
    assert all(np.array_equal(t, o) for t, o in zip(theirs, ours, strict=True))
