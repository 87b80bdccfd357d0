"""Fixed-size export and the parity gate (including sabotaged models)."""

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import TOL_FP32
from vlsens import parity
from vlsens.errors import ParityError
from vlsens.export import export_vision_fixed
from vlsens.onnxutil import data_path, save_with_external_data
from vlsens.vision import Reference


def test_export_writes_model_data_and_passing_record(fp32_224, reference_224):
    assert fp32_224.is_file() and data_path(fp32_224).is_file()
    assert data_path(fp32_224).stat().st_size > 100_000  # the weights live in the data file
    rec = json.loads(fp32_224.with_name("parity.json").read_text())
    assert rec["passed"] is True
    assert rec["metrics"]["min_cosine"] > 0.99999 and rec["metrics"]["max_rel_error"] < 1e-4
    assert [i["image"] for i in rec["inputs"]] == ["astronaut.png", "coffee.png"]
    assert rec["tolerance"] == TOL_FP32
    assert {"torch", "transformers", "onnx", "onnxruntime"} <= set(rec["versions"])
    m = onnx.load(str(fp32_224), load_external_data=False)
    assert [i.name for i in m.graph.input] == ["pixel_values"]
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 224, 224]
    ref = Reference.load(reference_224)
    assert ref.features.shape == (2, 64, 64)
    assert not any(p.name.startswith(".staging") for p in fp32_224.parent.iterdir())


def _sabotage(src, dst, scale=1.05):
    """Copy of ``src`` with one weight matrix changed after export."""
    model = onnx.load(str(src), load_external_data=True)
    target = next(i for i in model.graph.initializer if "mlp" in i.name and len(i.dims) == 2) \
        if any("mlp" in i.name and len(i.dims) == 2 for i in model.graph.initializer) \
        else max(model.graph.initializer, key=lambda i: int(np.prod(i.dims)))
    arr = numpy_helper.to_array(target).copy()
    arr.flat[0] += scale * (np.abs(arr).max() + 1.0) * 20
    target.CopyFrom(numpy_helper.from_array(arr, target.name))
    save_with_external_data(model, dst)
    return target.name


def test_sabotaged_model_fails_the_gate(fp32_224, reference_224, tmp_path):
    bad = tmp_path / "bad" / "model.onnx"
    name = _sabotage(fp32_224, bad)
    ref = Reference.load(reference_224)
    with pytest.raises(ParityError) as e:
        parity.check_vision(bad, ref, TOL_FP32, variant="fp32")
    assert e.value.record["passed"] is False, name
    assert "No model was written" in str(e.value)
    # The unmodified model passes the same gate.
    assert parity.check_vision(fp32_224, ref, TOL_FP32, variant="fp32")["passed"]


def test_failed_gate_leaves_no_model_behind(tiny_ckpt, reference_224, tmp_path):
    out = tmp_path / "fp32" / "model.onnx"
    impossible = {"min_cosine": 1.0, "max_rel_error": 1e-30}
    with pytest.raises(ParityError):
        export_vision_fixed(tiny_ckpt, reference_224, out, out.with_name("parity.json"), 224, 224, impossible)
    assert list(out.parent.iterdir()) == []


def test_batched_export_matches_reference(tiny_ckpt, parity_refs, tmp_path):
    from vlsens.vision import compute_reference

    ref_path = tmp_path / "ref.npz"
    compute_reference(tiny_ckpt, parity_refs, 252, 308).save(ref_path)  # partial windows
    out = tmp_path / "b2" / "model.onnx"
    rec = export_vision_fixed(tiny_ckpt, ref_path, out, out.with_name("parity.json"), 252, 308, TOL_FP32, batch=2)
    assert rec["passed"] and rec["input_shape"] == [2, 3, 252, 308]


def test_compare_metrics():
    a = np.array([1.0, 2.0, 3.0])
    m = parity.compare(a, a)
    assert m["max_abs_diff"] == 0 and m["cosine"] == pytest.approx(1.0)
    m = parity.compare(a + [0, 0, 0.3], a)
    assert m["max_abs_diff"] == pytest.approx(0.3) and m["max_rel_error"] == pytest.approx(0.1)
    m = parity.compare(np.array([np.nan, 1, 1]), a)
    assert m["cosine"] == -1.0 and m["max_abs_diff"] == float("inf")
