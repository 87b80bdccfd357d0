"""The Qwen2.5-VL vision tower: sizes, patchify, preprocessing, the fixed-size export wrapper and
the transformers reference.

Layout facts (transformers' ``Qwen2VLImageProcessor``): an image of C x H x W is repeated
``temporal_patch_size`` times along time and cut into ``patch_size`` squares, ordered so that the
``merge_size`` x ``merge_size`` squares that the merger joins are adjacent. That is a pure
reshape/permute of the normalized image, which :func:`patchify` reproduces inside the graph.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from vlsens.errors import ConfigError
from vlsens.images import ImageRef, open_rgb, resize_exact

log = logging.getLogger(__name__)

SIZE_RE = re.compile(r"^(\d+)x(\d+)$")


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


def parse_size(text: str, key: str = "vision.sizes", factor: int = 28) -> tuple[int, int]:
    """Parse ``HxW`` and check that both sides are positive multiples of ``factor``.

    The error names the key, the value, and the nearest valid sizes.
    """
    m = SIZE_RE.match(str(text).strip())
    if not m:
        raise ConfigError(f"{key}: '{text}' is not of the form HxW (for example 224x224 or 224x336).")
    h, w = int(m.group(1)), int(m.group(2))
    if h > 0 and w > 0 and h % factor == 0 and w % factor == 0:
        return h, w
    near = nearest_valid_sizes(h, w, factor)
    raise ConfigError(
        f"{key}: size '{text}' is invalid: height and width must be positive multiples of {factor} "
        f"(patch 14 x merge 2). Nearest valid sizes: {', '.join(near)}."
    )


def nearest_valid_sizes(h: int, w: int, factor: int = 28) -> list[str]:
    def around(v: int) -> list[int]:
        lo = max(factor, (v // factor) * factor)
        hi = lo if v <= lo and v % factor == 0 else lo + factor
        return sorted({lo, hi}, key=lambda x: (abs(x - v), x))

    cands = sorted(
        {(a, b) for a in around(h) for b in around(w)},
        key=lambda s: (abs(s[0] - h) + abs(s[1] - w), s),
    )
    return [f"{a}x{b}" for a, b in cands[:3]]


def size_str(h: int, w: int) -> str:
    return f"{h}x{w}"


# --------------------------------------------------------------------------------------------
# Patchify (torch, traced into the graph) and its numpy inverse
# --------------------------------------------------------------------------------------------

def patchify(pixel_values, geom: Geometry):
    """(B, C, H, W) normalized images -> (B*gh*gw, C*T*p*p) patches in the processor's order."""
    p, m, t = geom.patch_size, geom.merge_size, geom.temporal_patch_size
    b, c, h, w = pixel_values.shape
    gh, gw = h // p, w // p
    x = pixel_values.unsqueeze(1).expand(b, t, c, h, w)
    x = x.reshape(b, t, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(b * gh * gw, c * t * p * p)


def patchify_np(pixel_values: np.ndarray, geom: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """numpy :func:`patchify` for (B, C, H, W) images of one size: (patches, grid_thw)."""
    p, m, t = geom.patch_size, geom.merge_size, geom.temporal_patch_size
    b, c, h, w = pixel_values.shape
    gh, gw = h // p, w // p
    x = np.broadcast_to(pixel_values[:, None], (b, t, c, h, w))
    x = x.reshape(b, t, c, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return (np.ascontiguousarray(x.reshape(b * gh * gw, c * t * p * p), dtype=np.float32),
            np.array([[1, gh, gw]] * b, dtype=np.int64))


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


def preprocess_nchw(image_processor, images: Sequence, height: int, width: int) -> np.ndarray:
    """Processor-exact normalized images as an (N, 3, H, W) float32 batch (the graph's input)."""
    geom = Geometry(
        int(image_processor.patch_size),
        int(image_processor.merge_size),
        int(image_processor.temporal_patch_size),
    )
    inp = processor_inputs(image_processor, images, height, width)
    return unpatchify(inp["pixel_values"], inp["image_grid_thw"], geom)


# --------------------------------------------------------------------------------------------
# Fixed-size export wrapper
# --------------------------------------------------------------------------------------------

def fixed_size_module(visual, height: int, width: int, batch: int):
    """An ``nn.Module``: (batch, 3, H, W) normalized images -> (batch, tokens, out_hidden) features.

    Patchify and ``grid_thw`` live inside; tracing bakes the window index, cu_seqlens and rotary
    tables for this size.
    """
    import torch

    geom = Geometry.from_config(visual.config)
    gh, gw = height // geom.patch_size, width // geom.patch_size

    class FixedSizeVision(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = visual
            self.register_buffer(
                "grid_thw", torch.tensor([[1, gh, gw]] * batch, dtype=torch.int64), persistent=False
            )

        def forward(self, pixel_values):
            patches = patchify(pixel_values, geom)
            merged = self.visual(patches, grid_thw=self.grid_thw).pooler_output
            return merged.reshape(batch, geom.tokens(height, width), merged.shape[-1])

    return FixedSizeVision().eval()


# --------------------------------------------------------------------------------------------
# The transformers reference
# --------------------------------------------------------------------------------------------

@dataclass
class Reference:
    """Real preprocessed images and transformers' vision features for one size."""

    pixel_values: np.ndarray  # (N, 3, H, W) float32, the graph input
    features: np.ndarray  # (N, tokens, D) float32, transformers' output
    names: list[str]
    sha256: list[str]

    def save(self, path: str | Path) -> None:
        from vlsens.fsutil import savez

        savez(path, {"pixel_values": self.pixel_values, "features": self.features,
                             "names": np.array(self.names), "sha256": np.array(self.sha256)})

    @classmethod
    def load(cls, path: str | Path) -> "Reference":
        with np.load(path, allow_pickle=False) as z:
            return cls(
                pixel_values=z["pixel_values"],
                features=z["features"],
                names=[str(s) for s in z["names"]],
                sha256=[str(s) for s in z["sha256"]],
            )

    @property
    def inputs(self) -> list[dict]:
        return [{"image": n, "sha256": s} for n, s in zip(self.names, self.sha256)]


def compute_reference(checkpoint: str | Path, refs: Sequence[ImageRef], height: int, width: int,
                      device: str = "cpu") -> Reference:
    """transformers' own path: processor patches -> ``model.model.get_image_features``."""
    import torch

    from vlsens.checkpoint import load_image_processor, load_model

    processor = load_image_processor(checkpoint)
    model = load_model(checkpoint, device=device)
    geom = Geometry.from_config(model.config.vision_config)
    pil = [open_rgb(r) for r in refs]
    inp = processor_inputs(processor, pil, height, width)
    with torch.no_grad():
        out = model.model.get_image_features(
            pixel_values=torch.from_numpy(inp["pixel_values"]).to(device),
            image_grid_thw=torch.from_numpy(inp["image_grid_thw"]).to(device),
        )
    feats = torch.stack([f.float().cpu() for f in out.pooler_output]).numpy()
    pixel_values = unpatchify(inp["pixel_values"], inp["image_grid_thw"], geom)
    return Reference(pixel_values, feats, [r.name for r in refs], [r.sha256() for r in refs])
