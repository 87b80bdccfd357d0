"""Tower ``vision_fixed``: the vision tower at one image size, ``vision/<H>x<W>``.

The graph takes ``pixel_values``, a float32 ``(batch, 3, H, W)`` batch normalized by the
checkpoint's image processor (``vision.batch_size`` images per call), and returns
``vision_features`` ``(batch, H*W/factor^2, out_hidden_size)``: the merged tokens the language
model reads (factor 28; Qwen3-VL: 32, and its DeepStack maps side by side on the feature axis,
:mod:`vlsens.model.family`). Patchify, ``grid_thw``, window index, ``cu_seqlens`` and rotary tables are inside the graph,
baked for that size by tracing the stock encoder (the TorchScript exporter; the dynamo exporter
trips on the data-dependent window index).

Reference: one case per parity image, transformers' own path end to end (processor patches ->
the family's ``get_image_features``); the graph gets the same pixels as an NCHW image, so the
gate also checks the in-graph patchify. Calibration: images through the processor at exactly
H x W, split by content into disjoint calibration and evaluation sets (stacked layout, plus the
NPU archive).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.config import check_sizes, check_variants
from vlsens.core.job import Progress
from vlsens.core.sizes import parse_size
from vlsens.data.calibration import CalibrationSet, load_images, split_refs
from vlsens.data.cases import Case, Cases
from vlsens.data.images import ImageRef, header, open_rgb
from vlsens.data.samples import Samples, fit_batch
from vlsens.export.towers.base import Tower
from vlsens.model.vision import Geometry, patchify, preprocess_nchw, processor_inputs, unpatchify
from vlsens.model.vision import planted_site as vision_planted_site

log = logging.getLogger(__name__)

INPUT, OUTPUT = "pixel_values", "vision_features"


def joined_features(out):
    """The vision tower's output as one tensor: the merged tokens, then (Qwen3-VL) each DeepStack
    map, side by side on the feature axis (:func:`vlsens.model.family.split_features` splits them)."""
    import torch

    extra = list(getattr(out, "deepstack_features", None) or [])
    return torch.cat([out.pooler_output, *extra], dim=-1) if extra else out.pooler_output


def image_features(model, pixel_values, grid_thw, video: bool = False) -> list[np.ndarray]:
    """transformers' ``get_image_features`` (``video``: ``get_video_features``) per image or clip,
    as numpy: merged tokens (and DeepStack maps joined as :func:`joined_features` does)."""
    import torch

    with torch.no_grad():
        if video:
            out = model.model.get_video_features(pixel_values_videos=pixel_values, video_grid_thw=grid_thw,
                                                 return_dict=True)
        else:
            out = model.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid_thw, return_dict=True)
    per = [list(out.pooler_output)]
    per += [list(maps) for maps in (getattr(out, "deepstack_features", None) or [])]
    return [torch.cat([p[i] for p in per], dim=-1).float().cpu().numpy() for i in range(len(per[0]))]


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
            merged = joined_features(self.visual(patches, grid_thw=self.grid_thw))
            return merged.reshape(batch, geom.tokens(height, width), merged.shape[-1])

    return FixedSizeVision().eval()


def compute_reference(checkpoint: str | Path, refs: Sequence[ImageRef], height: int, width: int,
                      device: str = "cpu") -> Cases:
    """transformers' own path: processor patches -> ``model.model.get_image_features``; one case
    per image (its NCHW pixels in, its merged tokens out)."""
    import torch

    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_image_processor

    processor = load_image_processor(checkpoint)
    model = load_model(checkpoint, device=device, part="vision")
    geom = Geometry.from_config(model.config.vision_config)
    inp = processor_inputs(processor, [open_rgb(r) for r in refs], height, width)
    feats = [f[None] for f in image_features(model, torch.from_numpy(inp["pixel_values"]).to(device),
                                             torch.from_numpy(inp["image_grid_thw"]).to(device))]
    pixels = unpatchify(inp["pixel_values"], inp["image_grid_thw"], geom)
    cases = Cases(source=f"transformers {type(model.model).__name__}.get_image_features (PyTorch, float32)")
    for r, x, f in zip(refs, pixels, feats):
        cases.add(Case(r.name, "model.onnx", {INPUT: x[None]}, f, meta={"image": r.name, "sha256": r.sha256()}))
    return cases


class FixedVision(Tower):
    kind = "vision_fixed"
    pattern = r"vision/[0-9]+x[0-9]+"
    engines = ("ort", "inc")
    npu_archive = True
    cuttable = True
    calibration_runs_model = False  # the image processor's PIL path only
    section_key = "vision"

    planted_site = staticmethod(vision_planted_site)  # (block, role) of the preset's vision outlier

    @classmethod
    def graphs(cls, config, spec=None) -> list[str]:
        from vlsens.model.family import size_rule

        return [f"vision/{s}" for s in check_sizes(list(config["vision"]["sizes"]), rule=size_rule(config))]

    @property
    def size(self) -> tuple[int, int]:
        return parse_size(self.graph.split("/", 1)[1], **self.size_rule)

    def check(self, plan) -> None:
        check_variants(self.variants(), self.analysed_variants(), self.key("variants"), self.key("sensitivity_variants"))

    def reference_settings(self) -> dict:
        return {}

    #: The graph's input: (batch, 3, H, W) float32, normalized as the image processor does.
    input_name: str = INPUT

    def pixels(self, processor, images: Sequence) -> np.ndarray:
        """The graph's input for PIL images (calibration)."""
        return preprocess_nchw(processor, images, *self.size)

    def module(self, checkpoint, fixed):
        """The module exported: the fixed-size vision module itself."""
        return fixed

    def export_settings(self) -> dict:
        e = self.config["export"]
        return {"batch_size": self.config["vision"]["batch_size"], "opset": e["opset"],
                "attn_implementation": e["attn_implementation"]}

    def calibration_settings(self) -> dict:
        c = self.config["calibration"]
        return {k: c[k] for k in ("num_calib", "num_eval", "seed", "skip_unreadable")}

    def calibration_inputs(self, model, manifests) -> dict:
        return {"images": manifests["calibration_images"]}

    def reference(self, checkpoint, images, settings, device="cpu") -> Cases:
        return compute_reference(checkpoint, images, *self.size, device=device)

    def export(self, checkpoint, cases, workdir, settings):
        import torch

        from vlsens.core.onnxutil import resave
        from vlsens.model.loading import load_model

        h, w = self.size
        batch, opset, attn = settings["batch_size"], settings["opset"], settings["attn_implementation"]
        model = load_model(checkpoint, attn_implementation=attn, part="vision")
        module = self.module(checkpoint, fixed_size_module(model.model.visual, h, w, batch))
        example = torch.from_numpy(fit_batch(cases.feeds("model.onnx"), batch)[0][self.input_name].copy())
        raw = workdir / "raw" / "model.onnx"
        raw.parent.mkdir(parents=True)
        with torch.no_grad():
            torch.onnx.export(module, (example,), str(raw), dynamo=False, opset_version=opset,
                              input_names=[self.input_name], output_names=[OUTPUT], do_constant_folding=True)
        del model, module
        # Above 2 GB the legacy exporter writes one file per tensor: re-saved with one data file.
        staged = resave(raw, workdir / "model.onnx")
        return {"model.onnx": staged}, {"exporter": "torch.onnx.export(dynamo=False)", "opset": opset,
                                        "batch": batch, "attn_implementation": attn, "height": h, "width": w}

    def calibration(self, checkpoint, inputs, settings) -> CalibrationSet:
        from vlsens.data.inputs import image_refs
        from vlsens.model.processor import load_image_processor

        h, w = self.size
        refs, images, shas = load_images(image_refs(inputs["images"]), settings["skip_unreadable"])
        split = split_refs(refs, shas, settings["num_calib"], settings["num_eval"], settings["seed"])
        processor = load_image_processor(checkpoint)
        splits, samples = {}, []
        progress = Progress("calibration", sum(len(idx) for idx in split.values()), "images")
        for name, idx in split.items():
            parts = []
            for i in idx:  # one image at a time (the processor treats each on its own): progress lines
                parts.append(self.pixels(processor, [images[i]]))
                progress.step()
            pixels = np.concatenate(parts) if parts else self.pixels(processor, [])
            splits[name] = Samples.from_arrays({self.input_name: pixels}, 1, [refs[i].name for i in idx])
            for j, i in enumerate(idx):
                samples.append({"name": refs[i].name, "split": name, "index": j, "source": str(refs[i].path),
                                "sha256": shas[i], **header(refs[i])})
        return CalibrationSet(splits, samples, {"height": h, "width": w, "seed": settings["seed"]}, stacked=True)



class SectionVision(FixedVision):
    """A fixed-size graph kind with its own config section ``vision.<kind>`` (``sizes``,
    ``variants``, ``sensitivity_variants``) and graph names ``vision/<H>x<W><suffix>``: the
    uint8-input and video-step towers."""

    suffix: str = ""

    @classmethod
    def graphs(cls, config, spec=None) -> list[str]:
        from vlsens.model.family import size_rule

        sizes = list(config["vision"][cls.section_key.split(".")[1]]["sizes"])
        if not sizes:
            return []
        return [f"vision/{s}{cls.suffix}" for s in check_sizes(sizes, f"{cls.section_key}.sizes", size_rule(config))]

    @property
    def size(self) -> tuple[int, int]:
        return parse_size(self.graph.split("/", 1)[1].removesuffix(self.suffix), **self.size_rule)


