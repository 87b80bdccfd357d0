"""One vision graph for every image size (and several images per call).

The stock encoder does not export this way: the window index, cu_seqlens and
rotary positions are computed from ``grid_thw`` in Python, and its eager attention loops over
windows with ``torch.split(lengths.tolist())``; tracing bakes all of that for one size. The graph
here takes what Qwen2.5-VL computes from ``grid_thw`` as inputs, exactly as transformers' own
helpers compute them (:func:`index_inputs`):

=====================  ==============  =====================================================
input                  shape           meaning
=====================  ==============  =====================================================
``patches``            (N, 1176) f32   the processor's ``pixel_values`` (all images, flattened patches)
``position_ids``       (N, 2) i64      2-D rotary positions (``get_vision_position_ids``)
``window_index``       (N/4,) i64      window order of merged tokens (``get_vision_window_index``)
``cu_seqlens``         (I+1,) i64      image boundaries (``get_vision_cu_seqlens``)
``cu_window_seqlens``  (W+1,) i64      window boundaries in window order
=====================  ==============  =====================================================

and returns ``vision_features`` (N/4, out_hidden): every image's merged tokens in order, as
``get_image_features`` concatenates them.

The rewrite (:func:`dynamic_module`) re-uses the checkpoint's own modules (patch embed, rotary,
norms, qkv/proj, MLP, merger) and changes only attention, which is where the Python loop was:

* window blocks: every window is gathered into a fixed number of slots (the largest window:
  ``(window_size / patch_size)^2`` = 64 patches), attention runs per window with padded slots
  masked, and the result is gathered back. Memory is linear in N (windows x 64 x 64 scores), no
  N x N tensor;
* full-attention blocks: one softmax over all N tokens with an additive block-diagonal mask built
  from ``cu_seqlens`` (one block per image): the scores are (heads, N, N) -- the same as the stock
  encoder's per-image attention for one image; the mask adds one N x N float tensor.

bench/bench_dynamic.py measures the cost per size (peak memory and time) up to 1344x1344.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from vlsens.samples import CaseStore

log = logging.getLogger(__name__)

INPUTS = ("patches", "position_ids", "window_index", "cu_seqlens", "cu_window_seqlens")
OUTPUT = "vision_features"


def index_inputs(grid_thw: np.ndarray, vision_config) -> dict[str, np.ndarray]:
    """The index inputs of the dynamic graph for ``grid_thw`` (images x (t, h, w)), computed by
    transformers' own helpers (the same code the stock encoder runs)."""
    import torch
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

    g = torch.as_tensor(np.asarray(grid_thw, dtype=np.int64))
    merge = int(vision_config.spatial_merge_size)
    pos = get_vision_position_ids(g, merge)
    cu = get_vision_cu_seqlens(g)
    win, cu_win = get_vision_window_index(g, spatial_merge_size=merge, window_size=int(vision_config.window_size),
                                          patch_size=int(vision_config.patch_size))
    return {"position_ids": pos.numpy().astype(np.int64), "window_index": win.numpy().astype(np.int64),
            "cu_seqlens": cu.numpy().astype(np.int64), "cu_window_seqlens": cu_win.numpy().astype(np.int64)}


def graph_inputs(pixel_values: np.ndarray, grid_thw: np.ndarray, vision_config) -> dict[str, np.ndarray]:
    """All inputs of the dynamic graph from the processor's ``pixel_values`` and ``image_grid_thw``."""
    return {"patches": np.ascontiguousarray(pixel_values, dtype=np.float32), **index_inputs(grid_thw, vision_config)}


def window_len(vision_config) -> int:
    return (int(vision_config.window_size) // int(vision_config.patch_size)) ** 2


def _segment_ids(cu, n_like):
    """Segment number of every token, from cumulative boundaries ``cu`` (O(N), no N x N)."""
    import torch

    marks = torch.zeros_like(n_like).scatter(0, cu[1:-1], torch.ones_like(cu[1:-1]))
    return marks.cumsum(0)


def dynamic_module(visual):
    """The rewritten encoder: a torch ``nn.Module`` tree over the checkpoint's own submodules,
    laid out like transformers' (``visual.blocks.<i>.attn.qkv`` ...), so the exported nodes are
    named as in the fixed-size graphs (``/visual/blocks.2/attn/qkv/Gemm``) and weights keep their
    checkpoint names."""
    import torch
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    cfg = visual.config
    unit = int(cfg.spatial_merge_size) ** 2
    slots = window_len(cfg)
    fullatt = {int(i) for i in cfg.fullatt_block_indexes}

    class Attention(torch.nn.Module):
        def __init__(self, attn, full: bool):
            super().__init__()
            self.qkv, self.proj = attn.qkv, attn.proj
            self.heads, self.head_dim, self.scaling, self.full = attn.num_heads, attn.head_dim, attn.scaling, full

        def forward(self, x, cos, sin, full_mask, slot_tok, win_mask, token_slot):
            heads, hd = self.heads, self.head_dim
            q, k, v = self.qkv(x).reshape(-1, 3, heads, hd).permute(1, 0, 2, 3).unbind(0)
            q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
            if self.full:  # one softmax over all tokens, block-diagonal per image
                o = _attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                            full_mask, self.scaling)[0].transpose(0, 1).reshape(-1, heads * hd)
            else:  # each window in fixed slots, attended alone, gathered back
                qs, ks, vs = (t[slot_tok].reshape(-1, slots, heads, hd).transpose(1, 2) for t in (q, k, v))
                o = _attend(qs, ks, vs, win_mask, self.scaling).transpose(1, 2).reshape(-1, heads * hd)[token_slot]
            return self.proj(o)

    class Block(torch.nn.Module):
        def __init__(self, blk, full: bool):
            super().__init__()
            self.norm1, self.norm2, self.mlp = blk.norm1, blk.norm2, blk.mlp
            self.attn = Attention(blk.attn, full)

        def forward(self, h, *attn_args):
            h = h + self.attn(self.norm1(h), *attn_args)
            return h + self.mlp(self.norm2(h))

    class Visual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed, self.rotary_pos_emb, self.merger = visual.patch_embed, visual.rotary_pos_emb, visual.merger
            self.blocks = torch.nn.ModuleList([Block(b, i in fullatt) for i, b in enumerate(visual.blocks)])

        def forward(self, patches, position_ids, window_index, cu_seqlens, cu_window_seqlens):
            h = self.patch_embed(patches)
            d = h.shape[-1]
            h = h.reshape(-1, unit, d)[window_index].reshape(-1, d)  # window order, as the stock encoder
            cos, sin = self.rotary_pos_emb(h, position_ids)
            cos = cos.reshape(-1, unit, cos.shape[-1])[window_index].reshape(-1, cos.shape[-1])
            sin = sin.reshape(-1, unit, sin.shape[-1])[window_index].reshape(-1, sin.shape[-1])
            ones = torch.ones_like(position_ids[:, 0])
            ar = ones.cumsum(0) - 1  # 0..N-1 without a data-dependent arange
            # full attention: additive block-diagonal mask, one block per image
            img = _segment_ids(cu_seqlens, ones * 0)
            full_mask = torch.where(img[:, None] == img[None, :], 0.0, -1e30).to(h.dtype)[None, None]
            # windows: token -> slot maps
            starts, lens = cu_window_seqlens[:-1], cu_window_seqlens[1:] - cu_window_seqlens[:-1]
            j = torch.arange(slots, dtype=starts.dtype)
            valid = j[None, :] < lens[:, None]
            slot_tok = torch.where(valid, starts[:, None] + j[None, :], torch.zeros_like(starts)[:, None]).reshape(-1)
            win = _segment_ids(cu_window_seqlens, ones * 0)
            token_slot = win * slots + (ar - starts[win])
            win_mask = torch.where(valid, 0.0, -1e30).to(h.dtype)[:, None, None, :]
            for blk in self.blocks:
                h = blk(h, cos, sin, full_mask, slot_tok, win_mask, token_slot)
            merged = self.merger(h)
            reverse = torch.zeros_like(window_index).scatter(0, window_index, ar[: window_index.shape[0]])
            return merged[reverse]

    class DynamicVision(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = Visual()

        def forward(self, patches, position_ids, window_index, cu_seqlens, cu_window_seqlens):
            return self.visual(patches, position_ids, window_index, cu_seqlens, cu_window_seqlens)

    return DynamicVision().eval()


def _attend(q, k, v, mask, scaling):
    """softmax(q k^T * scaling + mask) v, softmax in float32 (as transformers' eager attention)."""
    import torch

    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling + mask
    p = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


# ----------------------------------------------------------------------------------------------
# Reference, export, parity, variants


class DynamicReference(CaseStore):
    """Cases (one size, or several images of different sizes) with the graph inputs and
    transformers' ``get_image_features`` output (``reference.npz``)."""

    def feeds(self, case: str) -> dict[str, np.ndarray]:
        return {k: self.cases[case][k] for k in INPUTS}


def case_name(sizes) -> str:
    return "+".join(f"{h}x{w}" for h, w in sizes)


def compute_dynamic_reference(checkpoint, image_refs, cases: list[list[tuple[int, int]]]) -> DynamicReference:
    """For every case (a list of (H, W), one image each, images taken in order): the processor's
    patches at exactly those sizes, the index inputs, and transformers' features."""
    import torch

    from vlsens.checkpoint import load_image_processor, load_model
    from vlsens.images import open_rgb
    from vlsens.vision import processor_inputs

    model = load_model(checkpoint, attn_implementation="eager")
    proc = load_image_processor(checkpoint)
    ref = DynamicReference()
    for sizes in cases:
        parts = [processor_inputs(proc, [open_rgb(image_refs[i % len(image_refs)])], h, w)
                 for i, (h, w) in enumerate(sizes)]
        pv = np.concatenate([p["pixel_values"] for p in parts])
        grid = np.concatenate([p["image_grid_thw"] for p in parts])
        with torch.no_grad():
            out = model.model.get_image_features(pixel_values=torch.from_numpy(pv), image_grid_thw=torch.from_numpy(grid))
        feats = torch.cat(list(out.pooler_output)).float().numpy()
        ref.cases[case_name(sizes)] = {**graph_inputs(pv, grid, model.config.vision_config), "features": feats,
                                       "grid_thw": grid}
    return ref


def export_dynamic(checkpoint, reference_path, out_model, out_parity, tolerance: dict, opset: int = 19,
                   threads: int = 0, device: str = "auto") -> dict:
    """Export :func:`dynamic_module` (TorchScript exporter, every axis dynamic), gate it at every
    reference case, publish model + data + parity.json."""
    import torch

    from vlsens.artifacts import publish_model
    from vlsens.checkpoint import load_model
    from vlsens.fsutil import staging_dir
    from vlsens.onnxutil import check_model, resave

    out_model = Path(out_model)
    ref = DynamicReference.load(reference_path)
    model = load_model(checkpoint, attn_implementation="eager")
    module = dynamic_module(model.model.visual)
    example = max(ref.cases, key=lambda c: c.count("+"))  # a multi-image case: nothing specialises to one image
    dyn = {"patches": {0: "patches"}, "position_ids": {0: "patches"}, "window_index": {0: "tokens"},
           "cu_seqlens": {0: "images_plus_1"}, "cu_window_seqlens": {0: "windows_plus_1"}, OUTPUT: {0: "tokens"}}
    with staging_dir(out_model) as tmp:
        raw = tmp / "raw" / "model.onnx"
        raw.parent.mkdir()
        with torch.no_grad():
            torch.onnx.export(module, tuple(torch.from_numpy(v) for v in ref.feeds(example).values()), str(raw),
                              dynamo=False, opset_version=opset, input_names=list(INPUTS), output_names=[OUTPUT],
                              dynamic_axes=dyn, do_constant_folding=True)
        del model, module
        staged = resave(raw, tmp / out_model.name)
        check_model(staged)
        record = check_dynamic(staged, ref, tolerance, "fp32", threads, device, artifact=out_model,
                               extra={"exporter": "torch.onnx.export(dynamo=False)", "opset": opset,
                                      "rewrite": "vlsens.dynamic.dynamic_module", "traced_on": example})
        publish_model(staged, record, out_model, out_parity)
    return record


def check_dynamic(model_path, ref: DynamicReference, tolerance: dict, variant: str, threads: int = 0,
                  device: str = "auto", extra: dict | None = None, artifact=None) -> dict:
    """Parity record of the dynamic graph at every reference case (each compared whole)."""
    from vlsens.onnxutil import make_session
    from vlsens.parity import compare, gate, make_record

    sess = make_session(model_path, threads=threads, device=device)
    per_input = []
    for case, arrays in ref.cases.items():
        out = sess.run(None, ref.feeds(case))[0]
        per_input.append({"image": case, "sha256": "", "patches": int(arrays["patches"].shape[0]),
                          **compare(out, arrays["features"])})
    record = make_record(
        artifact or model_path, variant, per_input, tolerance,
        reference="transformers Qwen2_5_VLModel.get_image_features on the processor's patches (PyTorch, float32)",
        inputs=[{"case": p["image"], "patches": p["patches"]} for p in per_input],
        input_shape=[p["patches"] for p in per_input], providers=sess.get_providers(), extra=extra,
    )
    gate(record)
    return record


def dynamic_variant(src_model, reference_path, out_model, out_parity, tolerance: dict, variant: str, make,
                    threads: int = 0, device: str = "auto") -> dict:
    """FP16 / simplified variant: ``make(src, feeds, staged) -> extra``, then the same gate."""
    from vlsens.artifacts import publish_model
    from vlsens.fsutil import staging_dir

    out_model = Path(out_model)
    ref = DynamicReference.load(reference_path)
    with staging_dir(out_model) as tmp:
        staged = tmp / out_model.name
        extra = make(src_model, [ref.feeds(c) for c in ref.cases], staged)
        record = check_dynamic(staged, ref, tolerance, variant, threads, device, extra=extra, artifact=out_model)
        publish_model(staged, record, out_model, out_parity)
    return record


def dynamic_fp16(src_model, reference_path, out_model, out_parity, tolerance: dict, max_activation: float,
                 max_initializer: float, threads: int = 0, device: str = "auto") -> dict:
    from vlsens.fp16 import convert_fp16

    return dynamic_variant(src_model, reference_path, out_model, out_parity, tolerance, "fp16",
                           lambda src, feeds, staged: convert_fp16(src, feeds, staged, max_activation,
                                                                   max_initializer, threads, device),
                           threads, device)


def dynamic_simplify(src_model, reference_path, out_model, out_parity, tolerance: dict, variant: str,
                     check_max_bytes: int, threads: int = 0, device: str = "auto") -> dict:
    from vlsens.simplify import simplify_model

    return dynamic_variant(src_model, reference_path, out_model, out_parity, tolerance, variant,
                           lambda src, feeds, staged: simplify_model(src, feeds[0], staged, check_max_bytes),
                           threads, device)


def calibration_stage(checkpoint, sizes: list[str], calib_npzs, eval_npzs, out_calib, out_eval) -> dict:
    """The ``dynamic_calibration`` rule: both splits from every size's fixed-size sets."""
    from transformers import AutoConfig

    vc = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False).vision_config
    return {split: dynamic_calibration(dict(zip(sizes, npzs)), vc, out)
            for split, npzs, out in (("calib", calib_npzs, out_calib), ("eval", eval_npzs, out_eval))}


def dynamic_calibration(split_npzs: dict[str, str | Path], vision_config, out_npz) -> int:
    """Per-size calibration for the dynamic graph: every image of every size's split (NCHW at that
    size, as the fixed-size sets hold them) becomes one feed with its own index inputs."""
    from vlsens.samples import Samples
    from vlsens.vision import Geometry, patchify_np

    geom = Geometry.from_config(vision_config)
    feeds, names = [], []
    for size, npz in split_npzs.items():
        with np.load(npz, allow_pickle=False) as z:
            pix, nm = z["pixel_values"], [str(s) for s in z["names"]]
        for img, n in zip(pix, nm):
            patches, grid = patchify_np(img[None], geom)
            feeds.append(graph_inputs(patches, grid, vision_config))
            names.append(f"{size}/{n}")
    Samples(feeds, [None] * len(feeds), names).save_feeds(out_npz)
    return len(feeds)
