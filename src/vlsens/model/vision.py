"""Qwen2.5-VL vision geometry shared by the vision towers, their calibration sets and the runtime:
patchify, its inverse, and preprocessing with the checkpoint's own image processor.

Layout facts (transformers' ``Qwen2VLImageProcessor``): an image of C x H x W is repeated
``temporal_patch_size`` times along time and cut into ``patch_size`` squares, ordered so that the
``merge_size`` x ``merge_size`` squares that the merger joins are adjacent. That is a pure
reshape/permute of the normalized image, which :func:`patchify` reproduces inside the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vlsens.data.images import resize_exact

#: The op that reads a planted vision outlier (``model.tiny.outlier.site``), as a ranking role.
PLANTED_ROLE = {"attn": "attn.qkv", "proj": "attn.proj", "mlp": "mlp.down_proj"}


def planted_site(preset: dict) -> tuple[int, str] | None:
    """The vision towers' :meth:`~vlsens.export.towers.base.Tower.planted_site`: ``outlier``'s block and the
    role of the op that reads it."""
    o = preset.get("outlier")
    return (int(o["block"]), PLANTED_ROLE[o.get("site", "attn")]) if o else None


@dataclass(frozen=True)
class Geometry:
    """Patch geometry of a vision tower (Qwen2.5-VL: 14, 2, 2)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_config(cls, vision_config) -> "Geometry":
        return cls(
            int(vision_config.patch_size),
            int(vision_config.spatial_merge_size),
            int(vision_config.temporal_patch_size),
        )

    def tokens(self, height: int, width: int) -> int:
        """Number of merged vision tokens (LM positions) for one image."""
        return (height // self.factor) * (width // self.factor)


# --------------------------------------------------------------------------------------------
# Patchify (torch, traced into the graph) and its numpy inverse
# --------------------------------------------------------------------------------------------

def patchify(pixel_values, geom: Geometry):
    """(B, C, H, W) normalized images -> (B*gh*gw, C*T*p*p) patches in the processor's order
    (a still image is its own frame ``temporal_patch_size`` times)."""
    b, c, h, w = pixel_values.shape
    return patchify_clip(pixel_values.unsqueeze(1).expand(b, geom.temporal_patch_size, c, h, w), geom)


def patchify_clip(frames, geom: Geometry):
    """(B, T, C, H, W) normalized frames, T = ``temporal_patch_size`` (one temporal step each) ->
    (B*gh*gw, C*T*p*p) patches in the video processor's order."""
    p, m = geom.patch_size, geom.merge_size
    b, t, c, h, w = frames.shape
    gh, gw = h // p, w // p
    x = frames.reshape(b, t, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(b * gh * gw, c * t * p * p)


def patchify_np(pixel_values: np.ndarray, geom: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """numpy :func:`patchify` for (B, C, H, W) images of one size: (patches, grid_thw). A still
    image is a clip of ``temporal_patch_size`` copies of itself (as the processor repeats it)."""
    parts = [patchify_frames(np.repeat(img[None], geom.temporal_patch_size, axis=0), geom) for img in pixel_values]
    return np.concatenate([p for p, _ in parts]), np.concatenate([g for _, g in parts])


def patchify_frames(frames: np.ndarray, geom: "Geometry") -> tuple[np.ndarray, np.ndarray]:
    """(T, C, H, W) normalized frames of one clip -> (patches, grid_thw) in the layout of
    transformers' Qwen2-VL video processor: consecutive frames pair up along the temporal patch
    axis (``grid_t = T / temporal_patch_size``; an odd last frame is repeated, as there)."""
    p, m, t = geom.patch_size, geom.merge_size, geom.temporal_patch_size
    frames = np.asarray(frames, dtype=np.float32)
    if pad := -len(frames) % t:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    n, c, h, w = frames.shape
    gt, gh, gw = n // t, h // p, w // p
    x = frames.reshape(gt, t, c, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return (np.ascontiguousarray(x.reshape(gt * gh * gw, c * t * p * p)),
            np.array([[gt, gh, gw]], dtype=np.int64))


def unpatchify(patches: np.ndarray, grids: np.ndarray, geom: Geometry, channels: int = 3) -> np.ndarray:
    """Inverse of the processor's patch layout for single-frame images of one size -> (N, C, H, W).

    Takes temporal copy 0 (the processor repeats a still image ``temporal_patch_size`` times).
    """
    p, m, t = geom.patch_size, geom.merge_size, geom.temporal_patch_size
    grids = np.asarray(grids)
    if not (grids[:, 0] == 1).all() or len({tuple(g) for g in grids.tolist()}) != 1:
        raise ValueError("unpatchify needs single-frame images that all have the same grid")
    n = len(grids)
    _, gh, gw = (int(v) for v in grids[0])
    x = patches.reshape(n, gh // m, gw // m, m, m, channels, t, p, p)
    x = x[:, :, :, :, :, :, 0]  # (n, gh/m, gw/m, m, m, C, p, p)
    x = x.transpose(0, 5, 1, 3, 6, 2, 4, 7)  # (n, C, gh/m, m, p, gw/m, m, p)
    return np.ascontiguousarray(x.reshape(n, channels, gh * p, gw * p))


# --------------------------------------------------------------------------------------------
# Preprocessing with the checkpoint's own image processor
# --------------------------------------------------------------------------------------------

def processor_inputs(image_processor, images: Sequence, height: int, width: int) -> dict:
    """Run the checkpoint's image processor on PIL images resized to exactly ``height`` x ``width``.

    The processor's own resize picks a size near the original aspect ratio, so images are first
    resized with the processor's resampling filter; the processor then rescales, normalizes and
    patchifies them. Returns numpy ``pixel_values`` (patches) and ``image_grid_thw``.
    """
    resample = getattr(image_processor, "resample", None)
    resized = [resize_exact(im, height, width, resample) for im in images]
    out = image_processor(images=resized, do_resize=False, return_tensors="np")
    return {"pixel_values": np.asarray(out["pixel_values"], dtype=np.float32),
            "image_grid_thw": np.asarray(out["image_grid_thw"], dtype=np.int64)}


def clip_frames(image_processor, image, frames: int, height: int, width: int) -> np.ndarray:
    """(frames, 3, H, W) normalized frames of a synthetic clip of ``image``
    (:func:`vlsens.data.images.shifted_clip`), each frame through the image processor at exactly H x W."""
    from vlsens.data.images import shifted_clip

    clip = shifted_clip(image, frames, height, width, resample=getattr(image_processor, "resample", None))
    return np.concatenate([preprocess_nchw(image_processor, [f], height, width) for f in clip])


def preprocess_nchw(image_processor, images: Sequence, height: int, width: int) -> np.ndarray:
    """Processor-exact normalized images as an (N, 3, H, W) float32 batch (the graph's input)."""
    geom = Geometry(
        int(image_processor.patch_size),
        int(image_processor.merge_size),
        int(image_processor.temporal_patch_size),
    )
    inp = processor_inputs(image_processor, images, height, width)
    return unpatchify(inp["pixel_values"], inp["image_grid_thw"], geom)
