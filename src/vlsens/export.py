"""Stage: PyTorch -> ONNX for the vision tower at one fixed image size."""

from __future__ import annotations

import logging
from pathlib import Path

from vlsens import parity
from vlsens.artifacts import publish_model
from vlsens.checkpoint import load_model
from vlsens.fsutil import staging_dir
from vlsens.onnxutil import check_model, resave
from vlsens.vision import Reference, fixed_size_module

log = logging.getLogger(__name__)


def export_vision_fixed(checkpoint: str | Path, reference_path: str | Path, out_model: str | Path,
                        out_parity: str | Path, height: int, width: int, tolerance: dict,
                        batch: int = 1, opset: int = 19, attn_implementation: str = "eager",
                        threads: int = 0, device: str = "auto") -> dict:
    """Export the vision tower for ``height`` x ``width`` with the TorchScript exporter, gate it
    against the transformers reference and publish ``model.onnx`` + data + ``parity.json``.

    The stock encoder exports at a fixed size with ``dynamo=False`` (the dynamo exporter trips on
    the data-dependent window index). Legacy export writes one file per tensor for models over
    2 GB, so it exports into a scratch folder and the result is re-saved with one data file.
    """
    import torch

    out_model = Path(out_model)
    ref = Reference.load(reference_path)
    model = load_model(checkpoint, attn_implementation=attn_implementation)
    module = fixed_size_module(model.model.visual, height, width, batch)
    example = torch.from_numpy(ref.pixel_values[:batch].copy())
    if example.shape[0] < batch:
        example = example.repeat((batch + example.shape[0] - 1) // example.shape[0], 1, 1, 1)[:batch]
    with staging_dir(out_model) as tmp:
        raw = tmp / "raw" / "model.onnx"
        raw.parent.mkdir()
        with torch.no_grad():
            torch.onnx.export(
                module, (example,), str(raw), dynamo=False, opset_version=opset,
                input_names=["pixel_values"], output_names=["vision_features"],
                do_constant_folding=True,
            )
        del model, module
        staged = resave(raw, tmp / out_model.name)
        check_model(staged)
        record = parity.check_vision(
            staged, ref, tolerance, variant="fp32", threads=threads, device=device, artifact=out_model,
            extra={"exporter": "torch.onnx.export(dynamo=False)", "opset": opset, "batch": batch,
                   "attn_implementation": attn_implementation, "height": height, "width": width},
        )
        publish_model(staged, record, out_model, out_parity)
    return record
