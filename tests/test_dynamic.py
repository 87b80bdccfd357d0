"""Tower vision_dynamic, one vision graph for every size: the rewrite equals transformers' encoder,
the graph passes its gate at several sizes (partial windows) and on a 2-image call, equals the
fixed-size graph, its calibration set holds every size, and ONNX vision + ONNX text reproduce
PyTorch end to end (logits and greedy generation). (FP16, onnxsim, the engine and the profile of
every tower: tests/test_stages.py.)"""

import json

import numpy as np
import pytest

from vlsens.data.cases import Cases
from vlsens.data.images import open_rgb, resolve_images
from vlsens.export.towers.vision_dynamic import INPUTS, dynamic_module, graph_inputs, window_len


@pytest.fixture(scope="module")
def dyn(graph_builder):
    """The default parity cases (224x224, 336x448, 448x224, 252x308, a 224x224 + 252x308 call)."""
    return graph_builder("vision/dynamic")


def test_rewrite_equals_transformers_encoder(tiny_ckpt):
    import torch

    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_image_processor
    from vlsens.model.vision import processor_inputs

    model = load_model(tiny_ckpt, attn_implementation="eager")
    proc = load_image_processor(tiny_ckpt)
    mod = dynamic_module(model.model.visual)
    img = open_rgb(resolve_images("builtin")[0])
    for h, w in ((224, 224), (252, 308), (448, 224)):
        inp = processor_inputs(proc, [img], h, w)
        with torch.no_grad():
            ref = model.model.get_image_features(pixel_values=torch.from_numpy(inp["pixel_values"]),
                                                 image_grid_thw=torch.from_numpy(inp["image_grid_thw"])).pooler_output[0]
            feeds = graph_inputs(inp["pixel_values"], inp["image_grid_thw"], model.config.vision_config)
            out = mod(*[torch.from_numpy(feeds[k]) for k in INPUTS])
        np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-5, err_msg=f"{h}x{w}")


def test_gate_at_four_sizes_partial_windows_and_two_images(dyn, tiny_ckpt):
    from transformers import AutoConfig

    rec = json.loads((dyn.folder("fp32") / "parity.json").read_text())
    assert rec["passed"] and {p["case"] for p in rec["per_input"]} == {
        "224x224", "336x448", "448x224", "252x308", "224x224+252x308", "clip-4x224x224"}
    assert rec["metrics"]["max_rel_error"] <= 1e-4
    ref = {c.name: c.inputs for c in Cases.load(dyn.reference)}
    cfg = AutoConfig.from_pretrained(str(tiny_ckpt)).vision_config
    lens = np.diff(ref["252x308"]["cu_window_seqlens"])
    assert lens.max() == window_len(cfg) and lens.min() < window_len(cfg)  # partial windows present
    assert len(ref["224x224+252x308"]["cu_seqlens"]) == 3  # two images in one call
    counts = {c: len(ref[c]["patches"]) for c in ref if not c.startswith("clip")}
    assert len(set(counts.values())) == len(counts)  # every image case a different patch count: one graph


def test_gate_on_a_video_clip(dyn):
    """A 4-frame clip (grid t = 2: two temporal steps, each its own attention segment) through the
    dynamic graph equals transformers' get_video_features in the gate (the FP16 and onnxsim
    variants are gated on every case too: tests/test_stages.py)."""
    clip = {c.name: c for c in Cases.load(dyn.reference)}["clip-4x224x224"]
    assert clip.meta["grid_thw"] == [[2, 16, 16]] and clip.meta["frames"] == 4
    assert len(clip.inputs["cu_seqlens"]) == 3  # one full-attention segment per temporal step
    assert clip.expected.shape == (128, 64)
    a, b = clip.inputs["patches"][:256], clip.inputs["patches"][256:]  # the two steps differ (a pan)
    assert np.abs(a - b).mean() > 0.1
    rec = json.loads((dyn.folder("fp32") / "parity.json").read_text())
    row = next(p for p in rec["per_input"] if p["case"] == "clip-4x224x224")
    assert rec["passed"] and row["max_rel_error"] <= 1e-4 and row["cosine"] >= 0.99999, row


def test_patchify_frames_is_the_video_processors_layout(tiny_ckpt):
    """Two copies of one image patchify exactly as the image processor's still image (which it
    repeats over the temporal patch axis); four frames give grid_t 2 with frames 2 and 3 in the
    second step, at temporal positions 0 and 1; an odd count repeats the last frame."""
    from vlsens.model.processor import load_image_processor
    from vlsens.model.vision import Geometry, patchify_frames, preprocess_nchw, processor_inputs

    proc = load_image_processor(tiny_ckpt)
    geom = Geometry()
    img = open_rgb(resolve_images("builtin")[0])
    still = preprocess_nchw(proc, [img], 56, 84)
    patches, grid = patchify_frames(np.concatenate([still, still]), geom)
    np.testing.assert_array_equal(patches, processor_inputs(proc, [img], 56, 84)["pixel_values"])
    assert grid.tolist() == [[1, 4, 6]]
    frames = np.random.default_rng(0).normal(size=(4, 3, 56, 84)).astype(np.float32)
    patches, grid = patchify_frames(frames, geom)
    assert grid.tolist() == [[2, 4, 6]] and patches.shape == (48, 3 * 2 * 14 * 14)
    first = patches[24].reshape(3, 2, 14, 14)  # step 1, merged block 0, patch 0: top-left 14x14
    np.testing.assert_array_equal(first[:, 0], frames[2, :, :14, :14])
    np.testing.assert_array_equal(first[:, 1], frames[3, :, :14, :14])
    second = patches[25].reshape(3, 2, 14, 14)  # the next patch of the 2x2 merge block: one to the right
    np.testing.assert_array_equal(second[:, 0], frames[2, :, :14, 14:28])
    odd, grid = patchify_frames(frames[:3], geom)
    assert grid.tolist() == [[2, 4, 6]]
    np.testing.assert_array_equal(odd[24:].reshape(24, 3, 2, 14, 14)[:, :, 1], odd[24:].reshape(24, 3, 2, 14, 14)[:, :, 0])


def test_dynamic_graph_equals_fixed_size_graph(dyn, fp32_224, reference_224, tiny_ckpt):
    import onnxruntime as ort
    from transformers import AutoConfig

    from vlsens.model.vision import Geometry, patchify_np

    vision_config = AutoConfig.from_pretrained(str(tiny_ckpt)).vision_config
    geom = Geometry.from_config(vision_config)
    fixed = ort.InferenceSession(str(fp32_224), providers=["CPUExecutionProvider"])
    dynamic = ort.InferenceSession(str(dyn.model()), providers=["CPUExecutionProvider"])
    for case in Cases.load(reference_224):
        x = case.inputs["pixel_values"]
        want = fixed.run(None, {"pixel_values": x})[0][0]
        patches, grid = patchify_np(x, geom)
        got = dynamic.run(None, graph_inputs(patches, grid, vision_config))[0]
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_vision_encoder_runtime_any_size(dyn, tiny_ckpt):
    import torch

    from vlsens.deploy.genai.runtime import VisionEncoder
    from vlsens.model.loading import load_model

    enc = VisionEncoder(dyn.model(), tiny_ckpt)
    imgs = [open_rgb(r) for r in resolve_images("builtin")[:2]]
    model = load_model(tiny_ckpt)
    for sizes in ([(224, 224), (252, 308)], None):  # exact sizes, and the processor's own resize
        p = enc.preprocess(imgs, sizes)
        feats = enc(imgs, sizes)
        assert len(feats) == 2
        with torch.no_grad():
            ref = model.model.get_image_features(pixel_values=torch.from_numpy(p["pixel_values"]),
                                                 image_grid_thw=torch.from_numpy(p["image_grid_thw"])).pooler_output
        for f, r in zip(feats, ref):
            np.testing.assert_allclose(f, r.numpy(), atol=1e-4)


def test_vision_encoder_checks_a_published_graph_against_its_record(dyn, tiny_ckpt, tmp_path):
    """Like Chat, the other public loader checks what vlsens published before it loads it."""
    import shutil

    from vlsens.core.errors import ArtifactError
    from vlsens.deploy.genai.runtime import VisionEncoder

    folder = tmp_path / "dynamic"
    shutil.copytree(dyn.model().parent, folder)
    data = folder / "model.onnx.data"
    data.write_bytes(bytes(data.stat().st_size))  # zeroed, same size
    with pytest.raises(ArtifactError, match=r"model.onnx.data"):
        VisionEncoder(folder / "model.onnx", tiny_ckpt)
    VisionEncoder(folder / "model.onnx", tiny_ckpt, verify=False)  # the opt-out


def test_calibration_set_holds_every_size(dyn):
    from vlsens.data.samples import Samples

    man = json.loads((dyn.calib / "manifest.json").read_text())
    assert man["sizes"] == ["224x224", "224x336"] and man["counts"] == {"calib": 12, "eval": 6}
    ev = Samples.load(dyn.calib / "eval.npz")
    assert {len(f["patches"]) for f in ev.feeds} == {256, 384}  # both sizes in one set, one image per feed
    assert [e["size"] for e in man["samples"] if e["split"] == "eval"] == ["224x224"] * 3 + ["224x336"] * 3


def test_dynamic_graph_names_ops_like_the_fixed_graphs(dyn, fp32_224):
    """Node and weight names follow transformers' module tree, as in the fixed-size export, so
    rankings, profiles and inc_op_name_dict read the same for both."""
    import onnx

    from vlsens.quantize.qdq import quantizable_ops

    dyn_ops = {o.name: o for o in quantizable_ops(onnx.load(str(dyn.model())))}
    fixed_ops = {o.name for o in quantizable_ops(onnx.load(str(fp32_224)))}
    assert "/visual/blocks.2/attn/qkv/Gemm" in dyn_ops and "/visual/blocks.3/mlp/down_proj/Gemm" in dyn_ops
    weights = {o.name for o in dyn_ops.values() if o.weight_params}
    assert weights <= fixed_ops  # every op with weights has the fixed graph's name
    roles = {(o.block, o.role) for o in dyn_ops.values()}
    assert (2, "attn.qkv") in roles and (None, "patch_embed.proj") in roles
