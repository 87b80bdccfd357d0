"""Tower ``vision_video``: the vision tower for one temporal step of a video, ``vision/<H>x<W>-t2``.

A video's frames are paired along the temporal patch axis (``temporal_patch_size`` = 2 frames per
step, ``grid_t = frames / 2``), and every step attends alone: ``cu_seqlens`` has one segment per
step, the window index and rotary (and Qwen3-VL's position-table) inputs are the same for every
step. So a clip is encoded step by step by one fixed-size graph whose index tensors are baked for
H x W -- the layout NPU toolchains compile. The graph takes ``frames``, ``(batch, 2, 3, H, W)``
float32 normalized by the checkpoint's image processor (two consecutive frames), and returns that
step's merged tokens ``(batch, H*W/factor^2, out_hidden)`` (Qwen3-VL: with its DeepStack maps
side by side, :func:`vlsens.model.family.split_features`).

Reference: per parity image a clip of ``vision.video.frames`` shifted frames
(:func:`vlsens.model.vision.clip_frames`), transformers' ``get_video_features`` on the *whole* clip, cut
into its steps: case *i* feeds frames 2i, 2i+1 and expects the clip's step-*i* tokens, so the gate
proves that step-by-step encoding equals the whole-clip forward. Calibration: one 2-frame clip per
calibration image (the same split as the still-image graphs), also as the NPU ``.tar``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vlsens.data.cases import Case, Cases
from vlsens.data.images import open_rgb
from vlsens.export.towers.vision_fixed import SectionVision, image_features
from vlsens.model.vision import Geometry, clip_frames, patchify_clip, patchify_frames

FRAMES = "frames"
SUFFIX = "-t2"


def step_module(fixed):
    """``fixed`` (one normalized NCHW image in, repeated over the temporal patch) taking two real
    frames ``(batch, 2, 3, H, W)``: the patchify is the video processor's, the rest is ``fixed``'s
    (same op names as the still-image graph)."""
    from vlsens.export.towers.vision_fixed import joined_features

    visual, grid = fixed.visual, fixed.grid_thw
    geom = Geometry.from_config(visual.config)

    def forward(frames):
        merged = joined_features(visual(patchify_clip(frames, geom), grid_thw=grid))
        return merged.reshape(frames.shape[0], -1, merged.shape[-1])

    fixed.forward = forward
    return fixed


class VideoStepVision(SectionVision):
    kind = "vision_video"
    section_key, suffix = "vision.video", SUFFIX
    pattern = r"vision/[0-9]+x[0-9]+-t2"
    engines = ("ort",)  # one 5-D input; INC's adaptor is set up for NCHW images
    input_name = FRAMES

    def reference_settings(self) -> dict:
        return {"frames": int(self.config["vision"]["video"]["frames"])}

    def reference(self, checkpoint, images, settings, device="cpu") -> Cases:
        import torch

        from vlsens.model.loading import load_model
        from vlsens.model.processor import load_image_processor

        h, w = self.size
        n = int(settings["frames"])
        processor = load_image_processor(checkpoint)
        model = load_model(checkpoint, device=device, part="vision")
        geom = Geometry.from_config(model.config.vision_config)
        cases = Cases(source=f"transformers {type(model.model).__name__}.get_video_features on the whole clip "
                             "(PyTorch, float32), cut into temporal steps")
        per_step = (h // geom.factor) * (w // geom.factor)
        for ref in images:
            frames = clip_frames(processor, open_rgb(ref), n, h, w)
            pv, grid = patchify_frames(frames, geom)
            feats = image_features(model, torch.from_numpy(pv).to(device), torch.from_numpy(grid).to(device),
                                   video=True)[0]
            if pad := -len(frames) % geom.temporal_patch_size:  # an odd last frame is repeated, as there
                frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
            for i in range(int(grid[0, 0])):
                t = geom.temporal_patch_size
                cases.add(Case(f"{ref.name}@step{i}", "model.onnx", {FRAMES: frames[None, t * i:t * (i + 1)]},
                               feats[None, per_step * i:per_step * (i + 1)],
                               meta={"image": ref.name, "sha256": ref.sha256(), "frames": n, "step": i}))
        return cases

    def pixels(self, processor, images: Sequence) -> np.ndarray:
        """One 2-frame clip per image: (N, 2, 3, H, W)."""
        h, w = self.size
        out = [clip_frames(processor, im, 2, h, w)[None] for im in images]
        return np.concatenate(out) if out else np.zeros((0, 2, 3, h, w), dtype=np.float32)

    def module(self, checkpoint, fixed):
        return step_module(fixed)
