"""Tower vision_fixed: the graph's interface, a batched export, the reference cases per image,
and onnxsim's own check skipped above its size bound (the gate still runs)."""

import json

import numpy as np
import onnx
from conftest import TOL_FP32, tower_of

from vlsens import variants
from vlsens.core.onnxutil import data_path
from vlsens.data.cases import Cases
from vlsens.export import stages


def test_export_writes_model_data_and_passing_record(fp32_224, reference_224):
    assert fp32_224.is_file() and data_path(fp32_224).is_file()
    assert data_path(fp32_224).stat().st_size > 100_000  # the weights live in the data file
    rec = json.loads(fp32_224.with_name("parity.json").read_text())
    assert rec["passed"] is True
    assert rec["metrics"]["min_cosine"] > 0.99999 and rec["metrics"]["max_rel_error"] < 1e-4
    assert [i["image"] for i in rec["inputs"]] == ["astronaut.png", "coffee.png"]
    assert all(len(i["sha256"]) == 64 for i in rec["inputs"])
    assert rec["tolerance"] == TOL_FP32 and rec["input_shape"] == [[1, 3, 224, 224]] * 2
    assert {"torch", "transformers", "onnx", "onnxruntime"} <= set(rec["versions"])
    m = onnx.load(str(fp32_224), load_external_data=False)
    assert [i.name for i in m.graph.input] == ["pixel_values"]
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 224, 224]
    cases = Cases.load(reference_224)
    assert [c.expected.shape for c in cases] == [(1, 64, 64)] * 2  # (batch, tokens, out_hidden) per image
    assert not any(p.name.startswith(".") for p in fp32_224.parent.iterdir())


def test_batched_export_matches_reference(tiny_ckpt, parity_refs, tmp_path):
    """A graph with a fixed batch of 2 at 252x308 (partial windows): each case is run in that batch."""
    tower = tower_of("vision/252x308", **{"vision.sizes": ["252x308"], "vision.batch_size": 2})
    stages.reference(tower, tiny_ckpt, parity_refs, tmp_path / "ref.npz", {})
    rec = stages.export(tower, tiny_ckpt, tmp_path / "ref.npz", tmp_path / "b2", TOL_FP32, tower.export_settings())
    assert rec["passed"] and rec["extra"]["batch"] == 2
    m = onnx.load(str(tmp_path / "b2" / "model.onnx"), load_external_data=False)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


def test_simplify_skips_its_own_check_for_large_models(fp32_224, reference_224, tmp_path):
    rec = variants.simplify(fp32_224.parent, reference_224, tmp_path / "big", TOL_FP32, "fp32-sim", check_max_bytes=10)
    facts = rec["extra"]["graphs"]["model.onnx"]
    assert facts["onnxsim_check"].startswith("skipped") and rec["passed"]
    assert len(onnx.load(str(tmp_path / "big" / "model.onnx"), load_external_data=False).graph.node) == facts["nodes_after"]


def test_reference_cases_are_the_processor_pixels(reference_224, tiny_ckpt, parity_refs):
    """Each case's NCHW input patchifies back to exactly the processor's pixel_values."""
    import torch

    from vlsens.data.images import open_rgb
    from vlsens.model.processor import load_image_processor
    from vlsens.model.vision import Geometry, patchify, processor_inputs

    cases = Cases.load(reference_224)
    proc = load_image_processor(tiny_ckpt)
    for case, ref in zip(cases, parity_refs):
        hf = processor_inputs(proc, [open_rgb(ref)], 224, 224)
        np.testing.assert_array_equal(patchify(torch.from_numpy(case.inputs["pixel_values"]), Geometry()).numpy(),
                                      hf["pixel_values"])
