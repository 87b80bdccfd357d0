"""One vision graph for every size: the rewrite equals transformers' encoder, the ONNX graph passes
its gate at several sizes (partial windows) and on a 2-image call, equals the fixed-size graph,
its variants and the per-size sensitivity work, and ONNX vision + ONNX text reproduce PyTorch end
to end (logits and greedy generation)."""

import json

import numpy as np
import pytest

from conftest import TOL_FP16, TOL_FP32
from vlsens.dynamic import (
    INPUTS,
    DynamicReference,
    compute_dynamic_reference,
    dynamic_module,
    export_dynamic,
    graph_inputs,
    window_len,
)
from vlsens.images import open_rgb, resolve_images

CASES = [[(224, 224)], [(336, 448)], [(448, 224)], [(252, 308)], [(224, 224), (252, 308)]]


@pytest.fixture(scope="module")
def dyn(tiny_ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("dynamic")
    compute_dynamic_reference(tiny_ckpt, resolve_images("builtin"), CASES).save(root / "ref.npz")
    export_dynamic(tiny_ckpt, root / "ref.npz", root / "fp32" / "model.onnx", root / "fp32" / "parity.json", TOL_FP32)
    return root


def test_rewrite_equals_transformers_encoder(tiny_ckpt):
    import torch

    from vlsens.checkpoint import load_image_processor, load_model
    from vlsens.vision import processor_inputs

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

    rec = json.loads((dyn / "fp32" / "parity.json").read_text())
    assert rec["passed"] and {p["image"] for p in rec["per_input"]} == {
        "224x224", "336x448", "448x224", "252x308", "224x224+252x308"}
    assert rec["metrics"]["max_rel_error"] <= 1e-4
    ref = DynamicReference.load(dyn / "ref.npz")
    cfg = AutoConfig.from_pretrained(str(tiny_ckpt)).vision_config
    lens = np.diff(ref.cases["252x308"]["cu_window_seqlens"])
    assert lens.max() == window_len(cfg) and lens.min() < window_len(cfg)  # partial windows present
    assert len(ref.cases["224x224+252x308"]["cu_seqlens"]) == 3  # two images in one call
    counts = {c: len(ref.cases[c]["patches"]) for c in ref.cases}
    assert len(set(counts.values())) == len(counts)  # every case a different patch count: one graph


def test_dynamic_graph_equals_fixed_size_graph(dyn, fp32_224, reference_224, tiny_ckpt):
    import onnxruntime as ort
    from transformers import AutoConfig

    from vlsens.vision import Geometry, Reference, patchify_np

    ref = Reference.load(reference_224)
    vision_config = AutoConfig.from_pretrained(str(tiny_ckpt)).vision_config
    geom = Geometry.from_config(vision_config)
    fixed = ort.InferenceSession(str(fp32_224), providers=["CPUExecutionProvider"])
    dynamic = ort.InferenceSession(str(dyn / "fp32" / "model.onnx"), providers=["CPUExecutionProvider"])
    for i in range(len(ref.pixel_values)):
        x = ref.pixel_values[i:i + 1]
        want = fixed.run(None, {"pixel_values": x})[0][0]
        patches, grid = patchify_np(x, geom)
        got = dynamic.run(None, graph_inputs(patches, grid, vision_config))[0]
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_fp16_and_simplified_dynamic_variants(dyn):
    from vlsens.dynamic import dynamic_fp16, dynamic_simplify

    rec = dynamic_fp16(dyn / "fp32" / "model.onnx", dyn / "ref.npz", dyn / "fp16" / "model.onnx",
                       dyn / "fp16" / "parity.json", TOL_FP16, 512, 65504)
    assert rec["passed"] and len(rec["per_input"]) == len(CASES)
    rec = dynamic_simplify(dyn / "fp32" / "model.onnx", dyn / "ref.npz", dyn / "fp32-sim" / "model.onnx",
                           dyn / "fp32-sim" / "parity.json", TOL_FP32, "fp32-sim", 2_000_000_000)
    assert rec["passed"] and rec["extra"]["nodes_after"] < rec["extra"]["nodes_before"]
    # simplification must not have baked one size: the gate ran every case through it
    assert {p["image"] for p in rec["per_input"]} == {p["image"] for p in
                                                     json.loads((dyn / "fp32" / "parity.json").read_text())["per_input"]}


def test_vision_encoder_runtime_any_size(dyn, tiny_ckpt):
    import torch

    from vlsens.checkpoint import load_model
    from vlsens.runtime import VisionEncoder

    enc = VisionEncoder(dyn / "fp32" / "model.onnx", tiny_ckpt)
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


@pytest.fixture(scope="module")
def text_fp32(tiny_ckpt, tmp_path_factory):
    from vlsens.text import BUILTIN_PROMPTS, compute_text_reference, export_text

    root = tmp_path_factory.mktemp("text")
    compute_text_reference(tiny_ckpt, resolve_images("builtin")[:2], BUILTIN_PROMPTS, [1, 2]).save(root / "ref.npz")
    export_text(tiny_ckpt, root / "ref.npz", root / "fp32", TOL_FP32)
    return root / "fp32" / "embeds.onnx"


def test_end_to_end_onnx_reproduces_pytorch_logits_and_generation(dyn, text_fp32, tiny_ckpt):
    """ONNX vision (dynamic) + ONNX text (embeds) from Python with the checkpoint's processor,
    two images of different sizes: the model's logits, and the same greedy tokens as generate()."""
    import torch

    from vlsens.checkpoint import load_model
    from vlsens.runtime import VLM, rope_index

    vlm = VLM(dyn / "fp32" / "model.onnx", text_fp32, tiny_ckpt)
    imgs = [open_rgb(r) for r in resolve_images("builtin")[2:4]]
    sizes = [(224, 224), (252, 308)]
    inputs = vlm.inputs(imgs, ["Describe both images."], sizes)
    logits = vlm.logits(inputs)
    model = load_model(tiny_ckpt, attn_implementation="eager")
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with torch.no_grad():
        ref = model(**t, use_cache=False).logits.numpy()
        pos, deltas = model.model.get_rope_index(t["input_ids"], mm_token_type_ids=t["mm_token_type_ids"],
                                                 image_grid_thw=t["image_grid_thw"], attention_mask=t["attention_mask"])
    mine, my_deltas = rope_index(inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"],
                                 inputs["attention_mask"])
    np.testing.assert_array_equal(mine, pos.numpy())
    np.testing.assert_array_equal(my_deltas, deltas.numpy())
    keep = inputs["attention_mask"].astype(bool)
    np.testing.assert_allclose(logits[keep], ref[keep], atol=1e-4)
    assert (logits[keep].argmax(-1) == ref[keep].argmax(-1)).all()
    tokens = vlm.generate(imgs, "Describe both images.", max_new_tokens=8, sizes=sizes)
    with torch.no_grad():
        gen = model.generate(**t, max_new_tokens=8, do_sample=False)
    assert tokens == gen[0, t["input_ids"].shape[1]:].tolist()


def test_sensitivity_on_the_dynamic_graph_with_per_size_calibration(dyn, tiny_ckpt, tmp_path):
    from transformers import AutoConfig

    from vlsens.calibration import build_calibration
    from vlsens.dynamic import dynamic_calibration
    from vlsens.quant import QuantSettings
    from vlsens.samples import Samples
    from vlsens.sensitivity import read_csv
    from vlsens.sensitivity_stage import gather, prepare, run_shard

    refs = resolve_images("builtin")
    vcfg = AutoConfig.from_pretrained(str(tiny_ckpt)).vision_config
    splits = {}
    for size in ("224x224", "252x308"):
        h, w = map(int, size.split("x"))
        build_calibration(tiny_ckpt, refs, h, w, tmp_path / size, 3, 2)
        splits[size] = tmp_path / size
    for split in ("calib", "eval"):
        n = dynamic_calibration({s: d / f"{split}.npz" for s, d in splits.items()}, vcfg, tmp_path / f"{split}.npz")
        assert n == (6 if split == "calib" else 4)
    ev = Samples.load(tmp_path / "eval.npz")
    assert len({len(f["patches"]) for f in ev.feeds}) == 2  # both sizes in one set
    prepare(dyn / "fp32" / "model.onnx", tmp_path / "calib.npz", tmp_path / "eval.npz", tmp_path / "engine",
            QuantSettings())
    run_shard(tmp_path / "engine", tmp_path / "eval.npz", 0, 1, tmp_path / "s.csv")
    s = gather(tmp_path / "engine", tmp_path / "eval.npz", [tmp_path / "s.csv"], tmp_path / "ort.csv",
               tmp_path / "ort.json")
    rows = read_csv(tmp_path / "ort.csv")
    assert len(rows) == s["ops"] > 10 and s["all_int8"]["cosine"] > 0.9
    assert any(r["role"] == "patch_embed.proj" for r in rows)


def test_dynamic_graph_names_ops_like_the_fixed_graphs(dyn, fp32_224):
    """Node and weight names follow transformers' module tree, as in the fixed-size export, so
    rankings, profiles and inc_op_name_dict read the same for both."""
    import onnx

    from vlsens.quant import quantizable_ops

    dyn_ops = {o.name: o for o in quantizable_ops(onnx.load(str(dyn / "fp32" / "model.onnx")))}
    fixed_ops = {o.name for o in quantizable_ops(onnx.load(str(fp32_224)))}
    assert "/visual/blocks.2/attn/qkv/Gemm" in dyn_ops and "/visual/blocks.3/mlp/down_proj/Gemm" in dyn_ops
    weights = {o.name for o in dyn_ops.values() if o.weight_params}
    assert weights <= fixed_ops  # every op with weights has the fixed graph's name
    roles = {(o.block, o.role) for o in dyn_ops.values()}
    assert (2, "attn.qkv") in roles and (None, "patch_embed.proj") in roles
