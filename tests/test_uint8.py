"""Tower vision_uint8: the fixed-size graph taking (batch, H, W, 3) uint8 RGB, with the image
processor's rescale, normalize and patchify inside."""

import json

import numpy as np
import pytest
from conftest import TOL_FP32

from vlsens.core.metrics import compare
from vlsens.data.calibration import load_stacked, read_tar, write_npu_archive


@pytest.fixture(scope="module")
def u8(graph_builder):
    return graph_builder("vision/224x224-u8")


@pytest.fixture(scope="module")
def fp(graph_builder):
    return graph_builder("vision/224x224")


def test_the_graph_takes_uint8_nhwc(u8):
    import onnx

    m = onnx.load(str(u8.model()), load_external_data=False)
    (inp,) = m.graph.input
    assert inp.name == "image" and inp.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, 224, 224, 3]


def test_its_quantizable_ops_are_the_float_graphs_by_name(u8, fp):
    """The uint8 graph is the float graph behind a few elementwise ops: the same MatMul/Gemm/Conv
    nodes under the same names, so rankings and profiles of the two line up."""
    import onnx

    def ops(path):
        m = onnx.load(str(path), load_external_data=False)
        return {n.name for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")}

    assert ops(u8.model()) == ops(fp.model()) and len(ops(fp.model())) > 20


def test_uint8_features_equal_the_float_paths_within_the_fp32_gate(u8, fp):
    """The same images through the uint8 graph and through the float graph (processor pixels):
    their features agree within the FP32 gate, and both match transformers (their records)."""
    import onnxruntime as ort

    from vlsens.data.cases import Cases

    su = ort.InferenceSession(str(u8.model()), providers=["CPUExecutionProvider"])
    sf = ort.InferenceSession(str(fp.model()), providers=["CPUExecutionProvider"])
    cu, cf = Cases.load(u8.reference), Cases.load(fp.reference)
    assert [c.name for c in cu] == [c.name for c in cf] and len(cu) == 2
    for a, b in zip(cu, cf):
        assert a.inputs["image"].dtype == np.uint8 and a.inputs["image"].shape == (1, 224, 224, 3)
        out_u8 = su.run(None, a.inputs)[0]
        out_fp = sf.run(None, b.inputs)[0]
        m = compare(out_u8, out_fp)
        assert m["cosine"] >= TOL_FP32["min_cosine"] and m["max_rel_error"] <= TOL_FP32["max_rel_error"], m
        np.testing.assert_array_equal(a.expected, b.expected)  # the same transformers features
    for b in (u8, fp):
        assert json.loads((b.folder("fp32") / "parity.json").read_text())["passed"]


def test_a_channel_swapped_image_misses_the_gate(u8):
    """The gate would see a BGR (or otherwise mislaid) input: the features move far off."""
    import onnxruntime as ort

    from vlsens.data.cases import Cases

    s = ort.InferenceSession(str(u8.model()), providers=["CPUExecutionProvider"])
    case = next(iter(Cases.load(u8.reference)))
    good = compare(s.run(None, case.inputs)[0], case.expected)
    bgr = compare(s.run(None, {"image": case.inputs["image"][..., ::-1].copy()})[0], case.expected)
    assert good["max_rel_error"] <= TOL_FP32["max_rel_error"]
    assert bgr["max_rel_error"] > 100 * TOL_FP32["max_rel_error"], bgr


def test_calibration_set_and_npu_archive_hold_uint8_images(u8, tmp_path):
    x = load_stacked(u8.calib / "calib.npz")["image"]
    assert x.dtype == np.uint8 and x.shape[1:] == (224, 224, 3) and x.std() > 10
    assert write_npu_archive(u8.calib / "calib.npz", tmp_path / "calib.tar") == len(x)
    np.testing.assert_array_equal(read_tar(tmp_path / "calib.tar"), x)  # .npy files of uint8 NHWC images
