"""Tower ``vision_uint8``: the fixed-size vision graph with the input NPU toolchains want.

Graph ``vision/<H>x<W>-u8`` takes ``image``, ``(batch, H, W, 3)`` uint8 RGB, already resized to
H x W (the processor's own bicubic resize, :func:`vlsens.data.images.resize_exact`), and does the rest
of the image processor inside: rescale (1/255), normalize (the checkpoint's mean and std), NHWC ->
NCHW, patchify. Its parity cases are the fixed-size graph's (transformers' features on the
processor's path) with the uint8 image as input, so the gate proves the in-graph preprocessing
equals the processor's. The calibration set (and its ``.tar`` of ``.npy``) holds the same uint8
images, the layout a quantizer of this graph calibrates with.

Engine ``ort`` only: INC's ONNX adaptor expects float inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vlsens.core.errors import VlsensError
from vlsens.data.cases import Case, Cases
from vlsens.data.images import open_rgb, resize_exact
from vlsens.export.towers.vision_fixed import INPUT, SectionVision, compute_reference

IMAGE = "image"
SUFFIX = "-u8"


def uint8_images(processor, images: Sequence, height: int, width: int) -> np.ndarray:
    """(N, H, W, 3) uint8: the images resized exactly as the processor path resizes them."""
    resample = getattr(processor, "resample", None)
    out = [np.asarray(resize_exact(im, height, width, resample).convert("RGB"), dtype=np.uint8) for im in images]
    return np.stack(out) if out else np.zeros((0, height, width, 3), dtype=np.uint8)


def normalize(processor, u8: np.ndarray) -> np.ndarray:
    """The processor's rescale and normalize of (N, H, W, 3) uint8, as (N, 3, H, W) float32."""
    x = u8.astype(np.float32).transpose(0, 3, 1, 2) * np.float32(processor.rescale_factor)
    mean = np.asarray(processor.image_mean, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(processor.image_std, dtype=np.float32).reshape(1, 3, 1, 1)
    return (x - mean) / std


def uint8_module(fixed, processor):
    """``fixed`` (normalized NCHW in) taking uint8 NHWC: the processor's rescale and normalize run
    first. The module is ``fixed`` itself with a new ``forward``, so the exported op names are the
    float graph's (``/visual/blocks.N/...``) and rankings of the two graphs line up."""
    import torch

    scale = float(processor.rescale_factor)
    fixed.register_buffer("mean", torch.tensor(processor.image_mean, dtype=torch.float32).view(1, 3, 1, 1),
                          persistent=False)
    fixed.register_buffer("std", torch.tensor(processor.image_std, dtype=torch.float32).view(1, 3, 1, 1),
                          persistent=False)
    normalized_forward = fixed.forward

    def forward(image):
        x = image.permute(0, 3, 1, 2).to(torch.float32) * scale
        return normalized_forward((x - fixed.mean) / fixed.std)

    fixed.forward = forward
    return fixed


class Uint8Vision(SectionVision):
    kind = "vision_uint8"
    section_key, suffix = "vision.uint8", SUFFIX
    pattern = r"vision/[0-9]+x[0-9]+-u8"
    engines = ("ort",)
    input_name = IMAGE

    def reference(self, checkpoint, images, settings, device="cpu") -> Cases:
        """The fixed-size graph's cases (transformers on the processor's path), each fed the uint8
        image instead; the numpy rescale + normalize of that image must give the processor's
        pixels (checked here, so a layout slip fails before any export)."""
        from vlsens.model.processor import load_image_processor

        h, w = self.size
        floats = compute_reference(checkpoint, images, h, w, device=device)
        processor = load_image_processor(checkpoint)
        u8 = uint8_images(processor, [open_rgb(r) for r in images], h, w)
        cases = Cases(source=floats.source + "; input: the processor-resized uint8 RGB image (NHWC)")
        for case, img in zip(floats, u8):
            gap = float(np.abs(normalize(processor, img[None]) - case.inputs[INPUT]).max())
            if gap > 1e-5:
                raise VlsensError(f"{self.graph}: rescaling and normalizing the uint8 image of {case.name} differs "
                                  f"from the image processor's pixels by {gap:.3g}; the processor does more than "
                                  f"rescale + normalize after its resize ({type(processor).__name__})")
            cases.add(Case(case.name, case.graph, {IMAGE: img[None]}, case.expected, meta=dict(case.meta)))
        return cases

    def pixels(self, processor, images: Sequence) -> np.ndarray:
        return uint8_images(processor, images, *self.size)

    def module(self, checkpoint, fixed):
        from vlsens.model.processor import load_image_processor

        return uint8_module(fixed, load_image_processor(checkpoint))
