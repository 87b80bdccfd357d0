"""FP16 conversion: the model's own Cast nodes and the range-based FP32 fallback."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TOL_FP16
from onnx import TensorProto, helper, numpy_helper

from vlsens import variants
from vlsens.core.metrics import compare
from vlsens.core.onnxutil import save_with_external_data, untie_identity_initializers
from vlsens.data.cases import Cases
from vlsens.variants.float16 import choose_fp32_nodes, own_float_casts, range_fallbacks, to_fp16


def _load(path):
    m = onnx.load(str(path), load_external_data=True)
    untie_identity_initializers(m)
    return m


def test_own_cast_nodes_must_be_retargeted(fp32_224, reference_224, tmp_path):
    model = _load(fp32_224)
    assert own_float_casts(model), "the exported vision tower has its own Cast(to=FLOAT) nodes"
    raw, _ = to_fp16(_load(fp32_224), [], retarget_casts=False, repair=False)
    save_with_external_data(raw, tmp_path / "raw" / "model.onnx")
    with pytest.raises(Exception, match="(?i)type"):
        ort.InferenceSession(str(tmp_path / "raw" / "model.onnx"), providers=["CPUExecutionProvider"])

    fixed, casts = to_fp16(model, [], retarget_casts=True, repair=False)
    save_with_external_data(fixed, tmp_path / "ok" / "model.onnx")
    sess = ort.InferenceSession(str(tmp_path / "ok" / "model.onnx"), providers=["CPUExecutionProvider"])
    case = Cases.load(reference_224).cases[0]
    out = sess.run(None, case.inputs)[0]
    assert out.dtype == np.float32  # I/O kept FP32
    assert compare(out, case.expected)["cosine"] > 0.999
    retargeted = [n for n in fixed.graph.node if n.name in set(casts)]
    assert retargeted and all(a.i == TensorProto.FLOAT16 for n in retargeted for a in n.attribute if a.name == "to")


def test_fp16_stage_default_bound_keeps_nothing_on_random_weights(fp32_224, reference_224, tmp_path):
    out = tmp_path / "fp16" / "model.onnx"
    rec = variants.fp16(fp32_224.parent, reference_224, out.parent, TOL_FP16, max_activation=512, max_initializer=65504)
    facts = rec["extra"]["graphs"]["model.onnx"]
    assert rec["passed"] and facts["fp32_fallback"] == []
    assert facts["retargeted_casts"] > 0
    assert 0 < facts["observed_max_activation"] < 512
    assert json.loads(out.with_name("parity.json").read_text())["variant"] == "fp16"
    inits = onnx.load(str(out), load_external_data=False).graph.initializer
    assert sum(i.data_type == TensorProto.FLOAT16 for i in inits) > sum(i.data_type == TensorProto.FLOAT for i in inits)


@pytest.mark.parametrize("bound", [1.0, 3.0, 4.0])
def test_fp16_fallback_keeps_large_activation_nodes_in_fp32(fp32_224, reference_224, tmp_path, bound):
    out = tmp_path / "fb" / "model.onnx"
    rec = variants.fp16(fp32_224.parent, reference_224, out.parent, TOL_FP16, max_activation=bound, max_initializer=65504)
    fallback = rec["extra"]["graphs"]["model.onnx"]["fp32_fallback"]
    kept = {f["node"] for f in fallback}
    assert kept and all(f"> {bound:g}" in f["reason"] for f in fallback)
    assert rec["passed"]
    model = onnx.load(str(out), load_external_data=False)
    # Kept nodes compute in FP32: the weights only they read stay FP32, the rest became FP16.
    kept_nodes = [n for n in model.graph.node if n.name in kept]
    inits = {i.name: i.data_type for i in model.graph.initializer}
    kept_weights = [inits[i] for n in kept_nodes for i in n.input if i in inits]
    assert kept_weights and all(dt == TensorProto.FLOAT for dt in kept_weights if dt in (TensorProto.FLOAT, TensorProto.FLOAT16))
    assert bound < 3 or any(dt == TensorProto.FLOAT16 for dt in inits.values())  # at 1.0 all stays FP32


def test_choose_fp32_nodes_reasons():
    big = numpy_helper.from_array(np.full((2, 2), 1e5, dtype=np.float32), "W")
    small = numpy_helper.from_array(np.ones((2, 2), dtype=np.float32), "V")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm_big"),
         helper.make_node("MatMul", ["y", "V"], ["z"], name="mm_small"),
         helper.make_node("Relu", ["z"], ["out"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 2])], [big, small])
    keep = choose_fp32_nodes(helper.make_model(g), {"x": 1.0, "y": 3.0, "z": 900.0, "out": 900.0}, max_activation=512)
    assert "initializer 'W'" in keep["mm_big"]
    assert "activation 'z'" in keep["mm_small"] and "relu" in keep
    facts = range_fallbacks(helper.make_model(g), {"x": 1.0, "y": 3.0, "z": 900.0, "out": 900.0}, max_activation=512)
    assert facts["mm_big"] | {"reason": ""} == {"reason": "", "kind": "initializer", "tensor": "W", "observed": 1e5,
                                                "bound": 65504.0}
    assert facts["mm_small"]["kind"] == "activation" and facts["mm_small"]["observed"] == 900.0


def test_own_float32_islands_stay_fp32(fp32_224, reference_224, tmp_path):
    """What transformers upcasts on purpose (RMSNorm statistics, rotary angles) stays FP32; the
    matrix multiplications between an island's downcast and the next upcast do not."""
    from vlsens.variants.float16 import own_fp32_islands

    model = onnx.load(str(fp32_224), load_external_data=False)
    kept = own_fp32_islands(model)
    ops = {n.name: n.op_type for n in model.graph.node}
    assert any(n.endswith("/norm1/Pow") for n in kept) and any(n.endswith("/norm1/ReduceMean") for n in kept)
    assert any("/attn/" in n and ops[n] == "Neg" for n in kept)  # rotate_half of the rotary embedding
    assert not [n for n in kept if ops[n] in ("MatMul", "Gemm", "Conv", "Cast")]
    out = tmp_path / "fp16" / "model.onnx"
    rec = variants.fp16(fp32_224.parent, reference_224, out.parent, TOL_FP16, max_activation=512, max_initializer=65504)
    facts = rec["extra"]["graphs"]["model.onnx"]["fp32_islands"]
    assert facts["nodes"] == len(kept) and any(s.endswith("/norm1") for s in facts["scopes"])
    conv = {n.name: n for n in onnx.load(str(out), load_external_data=False).graph.node}
    pow_node = next(conv[n] for n in kept if n.endswith("blocks.0/norm1/Pow"))
    # Its input is cast to FP32 right before it (the converter or the boundary repair did it).
    producer = {o: n for n in conv.values() for o in n.output}
    cast = producer[pow_node.input[0]]
    assert cast.op_type == "Cast" and next(a.i for a in cast.attribute if a.name == "to") == TensorProto.FLOAT


def test_streamed_fp16_weights_equal_the_converters_own(fp32_224, tmp_path):
    """The weights never loaded (converted tensor by tensor from the FP32 data file) are exactly
    what onnxconverter-common makes of loaded ones."""
    import numpy as np
    from onnx import numpy_helper

    from vlsens.core.onnxutil import save_streamed, untie_identity_initializers
    from vlsens.variants.float16 import fp16_weights, to_fp16

    lazy = onnx.load(str(fp32_224), load_external_data=False)
    untie_identity_initializers(lazy)
    was_float = {i.name for i in lazy.graph.initializer if i.data_type == TensorProto.FLOAT}
    converted, _ = to_fp16(lazy, [])
    out = save_streamed(converted, fp32_224.parent, tmp_path / "model.onnx", *fp16_weights(was_float))
    eager = onnx.load(str(fp32_224))
    untie_identity_initializers(eager)
    expected, _ = to_fp16(eager, [])
    got = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
    want = {i.name: numpy_helper.to_array(i) for i in expected.graph.initializer}
    assert got.keys() == want.keys() and len(want) > 10
    for k, v in want.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k


def test_the_angles_of_an_fp32_island_never_pass_through_fp16():
    """A rotary island (positions cast to float, times the frequencies, Cos): kept FP32, the angles
    reach Cos as FP32 and the frequencies stay FP32 (a Constant only the island reads), so the cos
    table equals float32's within float32 rounding; through FP16 an angle of 120 rad moves by up
    to 1/32 rad."""

    freq = np.array([1.0, 0.2718, 0.0739], np.float32)
    nodes = [helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT, name="rot/Cast"),
             helper.make_node("Constant", [], ["freq"], value=numpy_helper.from_array(freq), name="rot/Constant"),
             helper.make_node("Mul", ["posf", "freq"], ["angle"], name="rot/Mul"),
             helper.make_node("Cos", ["angle"], ["cos"], name="rot/Cos"),
             helper.make_node("Mul", ["x", "cos"], ["y"], name="attn/Mul")]
    graph = helper.make_graph(nodes, "rot", [helper.make_tensor_value_info("pos", TensorProto.INT64, [None, 1]),
                                             helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    model = onnx.shape_inference.infer_shapes(model)
    feeds = {"pos": np.arange(100, 128, dtype=np.int64)[:, None], "x": np.ones((28, 3), np.float32)}
    want = np.cos(feeds["pos"].astype(np.float32) * freq)
    converted, _ = to_fp16(model, ["rot/Mul", "rot/Cos"])
    got = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(got - want).max() < 1e-3  # the product's FP16 rounding alone (cos in [-1, 1])
    rounded = np.cos((feeds["pos"] * freq.astype(np.float16)).astype(np.float16).astype(np.float32))
    assert np.abs(rounded - want).max() > 1e-2  # what an FP16 angle would have cost
