"""Tower ``vision_dynamic``: one vision graph for every image size (and several images per call),
``vision/dynamic``.

Qwen2-VL has no windows (inputs ``patches``, ``position_ids``, ``cu_seqlens``); Qwen3-VL adds the
bilinear taps into its learned position table (``pos_indices``, ``pos_weights``, (N, 4) each, by
transformers' ``get_vision_interpolation_indices_and_weights``) and returns its DeepStack maps
next to the merged tokens (:mod:`vlsens.model.family`). The table below is Qwen2.5-VL's.

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
  from ``cu_seqlens`` (one block per image), computed one head at a time: the scores alive at
  once are (1, N, N), not the (heads, N, N) of the stock encoder (5.4 GB at 1344x1344 with 16
  heads, twice over during the softmax); the mask adds one N x N float tensor. The attention's
  activation MatMuls are then one node per head.

bench/bench_dynamic.py measures the cost per size (peak memory and time) up to 1344x1344.

Reference: ``vision.dynamic.parity_cases``, each a list of sizes (one image each; two sizes make a
2-image call), with transformers' ``get_image_features`` on the processor's patches. Calibration:
every image of every ``vision.sizes`` calibration set becomes one feed with its own index inputs.
"""

from __future__ import annotations

import logging

import numpy as np

from vlsens.config import check_sizes, check_variants
from vlsens.core import paths
from vlsens.core.fsutil import open_npz
from vlsens.core.sizes import parse_size
from vlsens.data.calibration import CalibrationSet
from vlsens.data.cases import Case, Cases
from vlsens.data.samples import Samples
from vlsens.export.towers import names
from vlsens.export.towers.base import Tower
from vlsens.model.family import of_vision_config
from vlsens.model.vision import planted_site as vision_planted_site

log = logging.getLogger(__name__)

INPUTS = ("patches", "position_ids", "window_index", "cu_seqlens", "cu_window_seqlens")
OUTPUT = "vision_features"


def input_names(vision_config) -> tuple[str, ...]:
    """The dynamic graph's inputs for this family (:func:`vlsens.model.family.of_vision_config`):
    windowed attention (Qwen2.5-VL) needs ``window_index`` and ``cu_window_seqlens``; a learned
    position table (Qwen3-VL) its taps (``pos_indices``, ``pos_weights``: (N, 4) bilinear taps into
    the table); Qwen2-VL has neither."""
    f = of_vision_config(vision_config)
    return ("patches", "position_ids", *(("window_index",) if f.windows else ()), "cu_seqlens",
            *(("cu_window_seqlens",) if f.windows else ()), *(("pos_indices", "pos_weights") if f.pos_table else ()))


def index_inputs(grid_thw: np.ndarray, vision_config) -> dict[str, np.ndarray]:
    """The index inputs of the dynamic graph for ``grid_thw`` (images x (t, h, w)), computed by
    transformers' own helpers (the same code the stock encoder runs)."""
    import torch
    from transformers.vision_utils import (
        get_vision_cu_seqlens,
        get_vision_interpolation_indices_and_weights,
        get_vision_position_ids,
        get_vision_window_index,
    )

    g = torch.as_tensor(np.asarray(grid_thw, dtype=np.int64))
    merge = int(vision_config.spatial_merge_size)
    out = {"position_ids": get_vision_position_ids(g, merge).numpy().astype(np.int64),
           "cu_seqlens": get_vision_cu_seqlens(g).numpy().astype(np.int64)}
    f = of_vision_config(vision_config)
    if f.windows:
        win, cu_win = get_vision_window_index(g, spatial_merge_size=merge, window_size=int(vision_config.window_size),
                                              patch_size=int(vision_config.patch_size))
        out.update(window_index=win.numpy().astype(np.int64), cu_window_seqlens=cu_win.numpy().astype(np.int64))
    if f.pos_table:  # as Qwen3VLVisionModel.forward calls it
        idx, w = get_vision_interpolation_indices_and_weights(
            g, num_grid_per_side=int(int(vision_config.num_position_embeddings) ** 0.5), mode="bilinear",
            align_corners=True, spatial_merge_size=merge)
        out.update(pos_indices=idx.numpy().astype(np.int64), pos_weights=w.numpy().astype(np.float32))
    return {k: out[k] for k in input_names(vision_config) if k != "patches"}


def graph_inputs(pixel_values: np.ndarray, grid_thw: np.ndarray, vision_config) -> dict[str, np.ndarray]:
    """All inputs of the dynamic graph from the processor's ``pixel_values`` and ``image_grid_thw``."""
    return {"patches": np.ascontiguousarray(pixel_values, dtype=np.float32), **index_inputs(grid_thw, vision_config)}


def window_len(vision_config) -> int:
    if getattr(vision_config, "window_size", None) is None:
        return 0
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
    checkpoint names.

    Long: its three small module classes are defined in it, as one unit, because they close over
    this encoder's constants (window slots, merge unit, full-attention blocks, deepstack indexes)
    and over torch, which this module imports lazily; their attribute layout is the exported
    graph's node names."""
    import torch
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    cfg = visual.config
    unit = int(cfg.spatial_merge_size) ** 2
    slots = window_len(cfg)
    family = of_vision_config(cfg)
    names = input_names(cfg)
    windows = family.windows
    fullatt = {int(i) for i in cfg.fullatt_block_indexes} if windows else set(range(len(visual.blocks)))
    deepstack = [int(i) for i in getattr(cfg, "deepstack_visual_indexes", None) or []]

    class Attention(torch.nn.Module):
        def __init__(self, attn, full: bool):
            super().__init__()
            self.qkv, self.proj = attn.qkv, attn.proj
            self.heads, self.head_dim, self.scaling, self.full = attn.num_heads, attn.head_dim, attn.scaling, full

        def forward(self, x, cos, sin, full_mask, slot_tok, win_mask, token_slot):
            heads, hd = self.heads, self.head_dim
            q, k, v = self.qkv(x).reshape(-1, 3, heads, hd).permute(1, 0, 2, 3).unbind(0)
            q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
            if self.full:  # one softmax over all tokens, block-diagonal per image, one head at a time
                qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (heads, N, hd)
                o = torch.cat([_attend(qh[i:i + 1], kh[i:i + 1], vh[i:i + 1], full_mask[0], self.scaling)
                               for i in range(heads)], 0).transpose(0, 1).reshape(-1, heads * hd)
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
            if family.pos_table:
                self.pos_embed, self.deepstack_merger_list = visual.pos_embed, visual.deepstack_merger_list

        def forward(self, x: dict):
            patches, position_ids, cu_seqlens = x["patches"], x["position_ids"], x["cu_seqlens"]
            h = self.patch_embed(patches)
            d = h.shape[-1]
            if family.pos_table:  # the learned table, bilinear taps (as Qwen3VLVisionModel.forward)
                h = h + (self.pos_embed(x["pos_indices"]) * x["pos_weights"][:, :, None]).sum(1).to(h.dtype)
            cos, sin = self.rotary_pos_emb(h, position_ids)
            ones = torch.ones_like(position_ids[:, 0])
            ar = ones.cumsum(0) - 1  # 0..N-1 without a data-dependent arange
            slot_tok = win_mask = token_slot = None
            if windows:
                window_index, cu_window_seqlens = x["window_index"], x["cu_window_seqlens"]
                h = h.reshape(-1, unit, d)[window_index].reshape(-1, d)  # window order, as the stock encoder
                cos = cos.reshape(-1, unit, cos.shape[-1])[window_index].reshape(-1, cos.shape[-1])
                sin = sin.reshape(-1, unit, sin.shape[-1])[window_index].reshape(-1, sin.shape[-1])
                # windows: token -> slot maps
                starts, lens = cu_window_seqlens[:-1], cu_window_seqlens[1:] - cu_window_seqlens[:-1]
                j = torch.arange(slots, dtype=starts.dtype)
                valid = j[None, :] < lens[:, None]
                slot_tok = torch.where(valid, starts[:, None] + j[None, :],
                                       torch.zeros_like(starts)[:, None]).reshape(-1)
                win = _segment_ids(cu_window_seqlens, ones * 0)
                token_slot = win * slots + (ar - starts[win])
                win_mask = torch.where(valid, 0.0, -1e30).to(h.dtype)[:, None, None, :]
            # full attention: additive block-diagonal mask, one block per image (or video frame step)
            img = _segment_ids(cu_seqlens, ones * 0)
            full_mask = torch.where(img[:, None] == img[None, :], 0.0, -1e30).to(h.dtype)[None, None]
            maps = []
            for i, blk in enumerate(self.blocks):
                h = blk(h, cos, sin, full_mask, slot_tok, win_mask, token_slot)
                if i in deepstack:
                    maps.append(self.deepstack_merger_list[deepstack.index(i)](h))
            merged = torch.cat([self.merger(h), *maps], dim=-1) if maps else self.merger(h)
            if windows:
                reverse = torch.zeros_like(window_index).scatter(0, window_index, ar[: window_index.shape[0]])
                merged = merged[reverse]
            return merged

    class DynamicVision(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = Visual()

        def forward(self, *inputs):  # in the order of input_names(cfg): the exporter names them
            return self.visual(dict(zip(names, inputs)))

    return DynamicVision().eval()


def _attend(q, k, v, mask, scaling):
    """softmax(q k^T * scaling + mask) v, softmax in float32 (as transformers' eager attention)."""
    import torch

    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling + mask
    p = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


# ----------------------------------------------------------------------------------------------
# The tower


def case_name(sizes) -> str:
    return "+".join(f"{h}x{w}" for h, w in sizes)


def compute_reference(checkpoint, image_refs, cases: list[list[tuple[int, int]]],
                      clips: list[tuple[int, tuple[int, int]]] = ()) -> Cases:
    """For every case (a list of (H, W), one image each, images taken in order): the processor's
    patches at exactly those sizes, the index inputs, and transformers' features. For every clip
    ``(frames, (H, W))``: a shifted-photo clip (:func:`vlsens.data.images.shifted_clip`) of the first
    image, each frame through the image processor, patchified as the video processor does
    (:func:`vlsens.model.vision.patchify_frames`, ``grid_t = frames / 2``), against transformers'
    ``get_video_features``."""
    import torch

    from vlsens.data.images import open_rgb
    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_image_processor
    from vlsens.model.vision import Geometry, clip_frames, patchify_frames, processor_inputs

    model = load_model(checkpoint, attn_implementation="eager", part="vision")
    proc = load_image_processor(checkpoint)
    from vlsens.export.towers.vision_fixed import image_features

    out = Cases(source=f"transformers {type(model.model).__name__}.get_image_features on the processor's patches "
                       "(PyTorch, float32)")
    for sizes in cases:
        refs = [image_refs[i % len(image_refs)] for i in range(len(sizes))]
        parts = [processor_inputs(proc, [open_rgb(r)], h, w) for r, (h, w) in zip(refs, sizes)]
        pv = np.concatenate([p["pixel_values"] for p in parts])
        grid = np.concatenate([p["image_grid_thw"] for p in parts])
        feats = image_features(model, torch.from_numpy(pv), torch.from_numpy(grid))
        out.add(Case(case_name(sizes), "model.onnx", graph_inputs(pv, grid, model.config.vision_config),
                     np.concatenate(feats),
                     meta={"patches": int(pv.shape[0]), "images": [r.name for r in refs],
                           "grid_thw": grid.tolist()}))
    geom = Geometry.from_config(model.config.vision_config)
    for n_frames, (h, w) in clips:
        ref = image_refs[0]
        pv, grid = patchify_frames(clip_frames(proc, open_rgb(ref), n_frames, h, w), geom)
        feats = image_features(model, torch.from_numpy(pv), torch.from_numpy(grid), video=True)
        out.add(Case(f"clip-{n_frames}x{h}x{w}", "model.onnx", graph_inputs(pv, grid, model.config.vision_config),
                     np.concatenate(feats),
                     meta={"patches": int(pv.shape[0]), "images": [ref.name], "frames": n_frames,
                           "grid_thw": grid.tolist()}))
    if clips:
        out.source += "; clips: transformers get_video_features on the video processor's patch layout"
    return out


class DynamicVision(Tower):
    kind = "vision_dynamic"
    #: the one graph of this tower (the deploy folders' vision graph)
    GRAPH = names.VISION_DYNAMIC
    pattern = r"vision/dynamic"
    calibration_runs_model = False  # index tensors from transformers' helpers; no model runs
    section_key = "vision.dynamic"

    planted_site = staticmethod(vision_planted_site)  # (block, role) of the preset's vision outlier

    @classmethod
    def graphs(cls, config, spec=None) -> list[str]:
        return [cls.GRAPH] if config["vision"]["dynamic"]["enabled"] else []


    def sizes(self) -> list[str]:
        """The fixed sizes whose calibration images make this graph's calibration set."""
        return check_sizes(list(self.config["vision"]["sizes"]), rule=self.size_rule)

    def check(self, plan) -> None:
        for i, case in enumerate(self.section["parity_cases"]):
            for j, size in enumerate(case):
                parse_size(str(size), key=f"vision.dynamic.parity_cases[{i}][{j}]", **self.size_rule)
        for i, clip in enumerate(self.section["video_cases"]):
            parse_size(str(clip["size"]), key=f"vision.dynamic.video_cases[{i}].size", **self.size_rule)
        check_variants(self.variants(), self.analysed_variants(), self.key("variants"), self.key("sensitivity_variants"))

    def reference_settings(self) -> dict:
        return {"cases": [list(c) for c in self.section["parity_cases"]],
                "clips": [[int(c["frames"]), str(c["size"])] for c in self.section["video_cases"]]}

    def export_settings(self) -> dict:
        return {"opset": self.config["export"]["opset"]}

    def calibration_settings(self) -> dict:
        return {"sizes": self.sizes()}

    def calibration_inputs(self, model, manifests) -> dict:
        return {split: [f"{paths.fill(paths.CALIB, model=model, graph=f'vision/{s}')}/{paths.CALIB_FILES[split]}"
                        for s in self.sizes()] for split in ("calib", "eval")}

    def reference(self, checkpoint, images, settings, device="cpu") -> Cases:
        rule = self.size_rule
        cases = [[parse_size(s, key="vision.dynamic.parity_cases", **rule) for s in case] for case in settings["cases"]]
        clips = [(n, parse_size(s, key="vision.dynamic.video_cases", **rule)) for n, s in settings.get("clips", [])]
        return compute_reference(checkpoint, images, cases, clips)

    def export(self, checkpoint, cases, workdir, settings):
        """:func:`dynamic_module` with the TorchScript exporter, every axis dynamic, traced on a
        multi-image case (nothing specialises to one image)."""
        import torch

        from vlsens.core.onnxutil import resave
        from vlsens.model.loading import load_model

        opset = settings["opset"]
        model = load_model(checkpoint, attn_implementation="eager", part="vision")
        module = dynamic_module(model.model.visual)
        names = input_names(model.config.vision_config)
        example = max(cases, key=lambda c: c.name.count("+"))
        dyn = {"patches": {0: "patches"}, "position_ids": {0: "patches"}, "window_index": {0: "tokens"},
               "cu_seqlens": {0: "images_plus_1"}, "cu_window_seqlens": {0: "windows_plus_1"},
               "pos_indices": {0: "patches"}, "pos_weights": {0: "patches"}, OUTPUT: {0: "tokens"}}
        raw = workdir / "raw" / "model.onnx"
        raw.parent.mkdir(parents=True)
        with torch.no_grad():
            torch.onnx.export(module, tuple(torch.from_numpy(example.inputs[k]) for k in names), str(raw),
                              dynamo=False, opset_version=opset, input_names=list(names), output_names=[OUTPUT],
                              dynamic_axes={k: dyn[k] for k in (*names, OUTPUT)}, do_constant_folding=True)
        del model, module
        staged = resave(raw, workdir / "model.onnx")
        return {"model.onnx": staged}, {"exporter": "torch.onnx.export(dynamo=False)", "opset": opset,
                                        "rewrite": "vlsens.export.towers.vision_dynamic.dynamic_module",
                                        "traced_on": example.name}

    def calibration(self, checkpoint, inputs, settings) -> CalibrationSet:
        """Every image of every size's fixed-size split (NCHW at that size) becomes one feed with
        its own index inputs."""
        from transformers import AutoConfig

        from vlsens.model.vision import Geometry, patchify_np

        vc = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False).vision_config
        geom = Geometry.from_config(vc)
        splits, samples = {}, []
        for split in ("calib", "eval"):
            feeds, names = [], []
            for size, npz in zip(settings["sizes"], inputs[split]):
                with open_npz(npz) as z:
                    pix, nm = z["pixel_values"], [str(s) for s in z["names"]]
                for img, n in zip(pix, nm):
                    patches, grid = patchify_np(img[None], geom)
                    feeds.append(graph_inputs(patches, grid, vc))
                    names.append(f"{size}/{n}")
                    samples.append({"name": names[-1], "split": split, "index": len(names) - 1, "size": size,
                                    "patches": int(len(patches))})
            splits[split] = Samples(feeds, None, names)
        return CalibrationSet(splits, samples, {"sizes": list(settings["sizes"])})
