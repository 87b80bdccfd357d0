"""Weight-only INT4 of the int4 folders' embedding table (GatherBlockQuantized) and vision Linears
(MatMulNBits): built by ONNX Runtime's quantizer, run by ONNX Runtime, gated on their own weights."""

import json

import numpy as np
import onnx
import pytest
from conftest import TOL_FP32

from vlsens.core.errors import ParityError
from vlsens.core.onnxutil import make_session
from vlsens.data.cases import Cases
from vlsens.precision.weight_only import dequantize_table, embedding_folder, gemm_to_matmul, vision_folder
from vlsens.quantize.nbits import NBitsSettings

TOL_INT4 = {"min_cosine": 0.98, "max_rel_error": 0.3}


def _image_token(ckpt) -> int:
    return int(json.loads((ckpt / "config.json").read_text())["image_token_id"])


@pytest.mark.parametrize("block_size", [32, 64])
def test_int4_embedding_is_exact_on_its_own_table_and_a_quarter_of_the_bytes(graph_builder, tmp_path, block_size):
    b = graph_builder("decoder")
    out = tmp_path / "emb"
    rec = embedding_folder(b.folder("fp32"), b.reference, out, block_size, True, _image_token(b.ckpt), TOL_FP32,
                           threads=2)
    assert rec["passed"] and rec["metrics"]["max_rel_error"] < 1e-6  # a lookup of the table it holds
    fr = rec["extra"]["float_reference"]["metrics"]  # against the checkpoint's table: INT4 noise, measured
    assert 0.99 < fr["min_cosine"] < 1 - 1e-6
    m = onnx.load(str(out / "embedding.onnx"), load_external_data=False)
    assert [n.op_type for n in m.graph.node].count("GatherBlockQuantized") == 1
    facts = rec["extra"]["graphs"]["embedding.onnx"]
    rows, cols = facts["shape"]
    # INT4 values and one FP32 scale per block: 0.5 + 4 / block_size bytes per weight
    assert facts["bytes"]["quantized"] == rows * cols // 2 + 4 * rows * cols // block_size
    assert (out / "embedding.onnx.data").stat().st_size == facts["bytes"]["quantized"]
    # the dequantized table is the checkpoint's within one INT4 step per block (half a step but
    # where +absmax clips to 7 steps, the block's -absmax taking -8)
    ref = onnx.load(str(b.folder("fp32") / "embedding.onnx"))
    w = onnx.numpy_helper.to_array(next(t for t in ref.graph.initializer if t.name == facts["table"]))
    dq = dequantize_table(out / "embedding.onnx")
    step = np.abs(w.reshape(rows, -1, block_size)).max(-1, keepdims=True) / 8  # the extreme maps to -8
    err = np.abs(dq - w).reshape(rows, -1, block_size)
    assert (err <= step + 1e-6).all() and err.mean() < (step / 4).mean()
    # ONNX Runtime's kernel gathers exactly those rows
    ids = np.array([[0, 5, rows - 1, 3]], np.int64)
    got = make_session(out / "embedding.onnx").run(None, {"input_ids": ids,
                                                          "image_features": np.zeros((0, cols), np.float32)})[0]
    np.testing.assert_array_equal(got[0], dq[ids[0]])


def test_int4_embedding_gate_fails_and_writes_nothing(graph_builder, tmp_path):
    """A wrong image token id puts text rows where transformers put image features: the gate
    fails and no folder appears."""
    b = graph_builder("decoder")
    with pytest.raises(ParityError):
        embedding_folder(b.folder("fp32"), b.reference, tmp_path / "emb", 32, True, _image_token(b.ckpt) + 1,
                         TOL_FP32, threads=2)
    assert not (tmp_path / "emb" / "embedding.onnx").exists()


def test_gemm_to_matmul_is_exact_in_float(graph_builder, tmp_path):
    from vlsens.core.onnxutil import save_with_external_data

    b = graph_builder("vision/dynamic")
    m = onnx.load(str(b.model("fp32")))
    gemms = sum(n.op_type == "Gemm" for n in m.graph.node)
    names = gemm_to_matmul(m)
    assert len(names) == gemms > 0 and not any(n.op_type == "Gemm" for n in m.graph.node)
    assert all(w.endswith(".weight") for w in names.values())
    path = save_with_external_data(m, tmp_path / "model.onnx")
    case = next(iter(Cases.load(b.reference)))
    want = make_session(b.model("fp32")).run(None, case.inputs)[0]
    got = make_session(path).run(None, case.inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int4_vision_is_gated_on_its_own_weights(graph_builder, tmp_path):
    b = graph_builder("vision/dynamic")
    settings = NBitsSettings(algorithm="rtn", block_size=32)
    rec = vision_folder(b.ckpt, b.folder("fp32"), b.reference, tmp_path / "int4", settings, TOL_INT4, TOL_FP32,
                        threads=2)
    assert rec["passed"] and rec["extra"]["exact"]["passed"]
    assert rec["extra"]["exact"]["metrics"]["max_rel_error"] < 1e-5  # float activations: exact to rounding
    fr = rec["extra"]["float_reference"]["metrics"]
    assert fr["min_cosine"] < rec["metrics"]["min_cosine"]  # the quantization error shows against the checkpoint
    m = onnx.load(str(tmp_path / "int4" / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in m.graph.node]
    facts = rec["extra"]["graphs"]["model.onnx"]
    assert ops.count("MatMulNBits") == facts["linears"] > 0 and "Gemm" not in ops
    src = (b.folder("fp32") / "model.onnx.data").stat().st_size
    assert (tmp_path / "int4" / "model.onnx.data").stat().st_size < 0.4 * src


def test_int4_vision_gate_catches_a_wrong_weight(graph_builder, tmp_path, monkeypatch):
    """Two same-shaped Linears swapped in the reference's mapping: the graph no longer computes
    what transformers does with its weights, so the exact gate fails and nothing is written."""
    from vlsens.precision import weight_only

    b = graph_builder("vision/dynamic")
    real = weight_only.quantize_vision

    def swapped(src, staged, settings, bits=4):
        facts, weights = real(src, staged, settings, bits)
        qkv = sorted(k for k in weights if "attn/qkv" in k)
        weights[qkv[0]], weights[qkv[1]] = weights[qkv[1]], weights[qkv[0]]
        return facts, weights

    monkeypatch.setattr(weight_only, "quantize_vision", swapped)
    with pytest.raises(ParityError, match="own weights"):
        vision_folder(b.ckpt, b.folder("fp32"), b.reference, tmp_path / "int4", NBitsSettings(algorithm="rtn"),
                      TOL_INT4, TOL_FP32, threads=2)
    assert not (tmp_path / "int4" / "model.onnx").exists()
