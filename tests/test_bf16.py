"""The bf16 variant: bfloat16 weights and activations inside, float32 I/O, gated by ONNX's reference
implementation (ONNX Runtime's CPU provider has no bfloat16 kernels); its parts cross in float32."""

import json

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import TOL_FP32

from vlsens import variants
from vlsens.core.errors import ParityError
from vlsens.core.onnxutil import tensor_array
from vlsens.data.cases import Cases
from vlsens.model.presets.tables import TINY_VISION
from vlsens.npu import build, calibration
from vlsens.variants import bfloat16 as bf16

TOL_BF16 = {"min_cosine": 0.999, "max_rel_error": 0.1}


@pytest.fixture(scope="module")
def bf16_folder(fixed, tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16") / "bf16"
    variants.bf16(fixed.folder("fp32"), fixed.reference, out, TOL_BF16)
    return out


def test_bf16_graph_is_bfloat16_inside_float32_outside(bf16_folder, fixed):
    rec = json.loads((bf16_folder / "parity.json").read_text())
    assert rec["passed"] and rec["variant"] == "bf16"
    assert rec["providers"] == ["onnx.reference (ReferenceEvaluator, numpy + ml_dtypes)"]
    # bfloat16 rounding is visible (FP32 is ~1e-6 here) but within the tolerance
    assert 1e-4 < rec["metrics"]["max_rel_error"] < TOL_BF16["max_rel_error"]
    onnx.checker.check_model(str(bf16_folder / "model.onnx"), full_check=True)
    m = onnx.load(str(bf16_folder / "model.onnx"), load_external_data=False)
    assert [i.type.tensor_type.elem_type for i in m.graph.input] == [onnx.TensorProto.FLOAT]
    assert [o.type.tensor_type.elem_type for o in m.graph.output] == [onnx.TensorProto.FLOAT]
    types = {t.name: t.data_type for t in m.graph.initializer}
    facts = rec["extra"]["graphs"]["model.onnx"]
    assert [f["node"] for f in facts["fp32_unsupported"]] == ["/ConstantOfShape", "/visual/patch_embed/proj/Conv"]
    # every weight but the patch embedding's Conv (no bfloat16 Conv at opset 19) is bfloat16
    floats = [n for n, t in types.items() if t == onnx.TensorProto.FLOAT]
    assert floats == ["visual.patch_embed.proj.weight"] and facts["fp32_initializers"] == 1
    assert sum(t == onnx.TensorProto.BFLOAT16 for t in types.values()) > 40
    # attention softmax stays float32, as transformers computes it (in bfloat16 the 3B tower's
    # cosine fell to 0.976; torch's own bfloat16 forward keeps 0.99988)
    # every attention Softmax of the graph: one per window in the tiny tower's 2 windowed blocks
    # (224 / window_size 112 = 2 x 2 windows) and one in each of its 2 full-attention blocks, 10 in all
    windowed = TINY_VISION["depth"] - len(TINY_VISION["fullatt_block_indexes"])
    windows = (224 // TINY_VISION["window_size"]) ** 2
    assert facts["fp32_softmax"] == sum(n.op_type == "Softmax" for n in m.graph.node)
    assert facts["fp32_softmax"] == windowed * windows + len(TINY_VISION["fullatt_block_indexes"]) == 10
    inferred = onnx.shape_inference.infer_shapes(m)
    vtypes = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    softmax_in = [n.input[0] for n in m.graph.node if n.op_type == "Softmax"]
    assert softmax_in and all(vtypes.get(x) == onnx.TensorProto.FLOAT for x in softmax_in)

    def weight_bytes(model, folder):
        return sum(np.array(tensor_array(t, folder)).nbytes for t in model.graph.initializer)

    # about half: the tiny tower's FP32 patch-embedding Conv (12 % of its weights; 0.2 % at 3B) and
    # the biases the exporter shared and the converter unties make it 0.62 here
    src = onnx.load(str(fixed.model()), load_external_data=False)
    assert weight_bytes(m, bf16_folder) < 0.65 * weight_bytes(src, fixed.folder("fp32"))


def test_weights_are_rounded_once_as_torch_rounds(bf16_folder, fixed):
    src = onnx.load(str(fixed.model()), load_external_data=False)
    dst = onnx.load(str(bf16_folder / "model.onnx"), load_external_data=False)
    src_t = {t.name: t for t in src.graph.initializer}
    checked = 0
    for t in dst.graph.initializer:
        base = t.name.split("_vlsens_untied")[0]
        if t.data_type == onnx.TensorProto.BFLOAT16 and base in src_t and np.prod(t.dims) > 1000:
            want = torch.from_numpy(np.array(tensor_array(src_t[base], fixed.folder("fp32")))).to(torch.bfloat16)
            got = np.array(tensor_array(t, bf16_folder))
            assert got.dtype == ml_dtypes.bfloat16
            np.testing.assert_array_equal(got.view(np.int16), want.view(torch.int16).numpy())
            checked += 1
    assert checked >= 10


def test_the_reference_runner_runs_graphs_as_onnxruntime_does(fixed):
    """The gate's runner is exact where both run: the FP32 graph by onnx.reference equals ORT."""
    case = next(iter(Cases.load(fixed.reference)))
    (out,) = bf16.run_reference(fixed.model(), case.inputs)
    want = ort.InferenceSession(str(fixed.model()), providers=["CPUExecutionProvider"]).run(None, case.inputs)[0]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_onnxruntime_cpu_cannot_run_it(bf16_folder):
    """Why the gate does not use ONNX Runtime here (if ORT gains the kernels, the gate should)."""
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
        ort.InferenceSession(str(bf16_folder / "model.onnx"), providers=["CPUExecutionProvider"])


def test_a_bf16_graph_missing_the_tolerance_writes_nothing(fixed, tmp_path):
    with pytest.raises(ParityError, match=r"parity gate failed .*\(bf16\)"):
        variants.bf16(fixed.folder("fp32"), fixed.reference, tmp_path / "bf16", TOL_FP32)
    assert not (tmp_path / "bf16").exists() or not any((tmp_path / "bf16").iterdir())


def test_bf16_parts_cross_in_float32(bf16_folder, fixed, tmp_path):
    rec = build.build_parts(bf16_folder, fixed.reference, tmp_path / "p", TOL_BF16, "bf16", 2, 2_000_000_000)
    assert rec["passed"] and rec["extra"]["onnxsim"]["passed"] and len(rec["parts"]) == 2
    (b,) = rec["parts"][0]["outputs"]
    assert b["dtype"] == "FLOAT" and rec["parts"][1]["inputs"] == [b]
    inner = onnx.load(str(tmp_path / "p" / "part1.onnx"))
    first = inner.graph.node[0]
    assert first.op_type == "Cast" and first.input == [b["name"]]
    assert next(a.i for a in first.attribute if a.name == "to") == onnx.TensorProto.BFLOAT16
    m = calibration.part_calibration(tmp_path / "p", fixed.calib / "calib.npz", fixed.calib / "eval.npz", tmp_path / "c")
    assert m["inputs"][1] == [b["name"]]
    # the archive's .npy files are float32 (numpy cannot write bfloat16 to .npy)
    import io
    import tarfile

    with tarfile.open(tmp_path / "c" / "part1" / "calib.tar") as tar:
        arr = np.load(io.BytesIO(tar.extractfile(tar.getmembers()[0]).read()), allow_pickle=False)
    assert arr.dtype == np.float32 and list(arr.shape) == b["shape"]
    assert np.array_equal(arr.astype(ml_dtypes.bfloat16).astype(np.float32), arr)  # bfloat16 values, exactly


def test_the_fast_runner_equals_onnx_reference_exactly(bf16_folder, fixed):
    """bfloat16 products in float32 with BLAS, rounded once, give ONNX's reference implementation's
    own numbers (numpy's bfloat16 dot accumulates in float32 too), bit for bit."""
    from onnx.reference import ReferenceEvaluator

    case = next(iter(Cases.load(fixed.reference)))
    (fast,) = bf16.run_reference(bf16_folder / "model.onnx", case.inputs)
    (slow,) = ReferenceEvaluator(onnx.load(str(bf16_folder / "model.onnx"))).run(None, case.inputs)
    np.testing.assert_array_equal(fast, slow)
