"""onnxsim variant with its check on real images, and our own gate."""

import json

import onnx

from conftest import TOL_FP32
from vlsens.simplify import simplify_vision


def test_simplify_fp32(fp32_224, reference_224, tmp_path):
    out = tmp_path / "fp32-sim" / "model.onnx"
    rec = simplify_vision(fp32_224, reference_224, out, out.with_name("parity.json"), TOL_FP32, "fp32-sim")
    assert rec["passed"] and rec["extra"]["onnxsim_check"] == "passed"
    assert rec["extra"]["nodes_after"] < rec["extra"]["nodes_before"]
    assert len(onnx.load(str(out), load_external_data=False).graph.node) == rec["extra"]["nodes_after"]
    assert json.loads(out.with_name("parity.json").read_text())["variant"] == "fp32-sim"
    assert out.with_name("model.onnx.data").is_file()


def test_simplify_skips_its_own_check_for_large_models(fp32_224, reference_224, tmp_path):
    out = tmp_path / "big" / "model.onnx"
    rec = simplify_vision(fp32_224, reference_224, out, out.with_name("parity.json"), TOL_FP32, "fp32-sim",
                          check_max_bytes=10)
    assert rec["extra"]["onnxsim_check"].startswith("skipped") and rec["passed"]


def test_any_output_file_name_keeps_its_data_reference(fp32_224, reference_224, tmp_path):
    import onnxruntime as ort

    out = tmp_path / "renamed" / "vision_224.onnx"
    simplify_vision(fp32_224, reference_224, out, tmp_path / "renamed" / "p.json", TOL_FP32, "fp32-sim")
    assert (tmp_path / "renamed" / "vision_224.onnx.data").is_file()
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
