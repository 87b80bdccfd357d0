"""Variants of a verified model folder: FP16 and onnxsim, for any tower.

A variant stage transforms every graph file of the source folder that the reference cases name
(``model.onnx``; the text tower's ``embeds.onnx`` too), feeding each transform that graph's own
parity inputs (the FP16 range analysis observes activations on them; onnxsim's check runs on
them), then gates the result on every case and publishes the folder (``model.onnx`` last). The
transforms are pure ONNX -> ONNX: :func:`vlsens.fp16.convert_fp16`,
:func:`vlsens.simplify.simplify_model`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from vlsens import parity, paths
from vlsens.artifacts import publish_models, verify
from vlsens.cases import Cases
from vlsens.fsutil import staging_dir
from vlsens.onnxutil import input_batch
from vlsens.samples import fit_batch

log = logging.getLogger(__name__)

#: ``transform(source graph, feeds, staged graph) -> facts for the record``
Transform = Callable[[Path, list, Path], dict]


def build_variant(src_dir: str | Path, reference: str | Path, out_dir: str | Path, tolerance: dict,
                  variant: str, transform: Transform, threads: int = 0, device: str = "auto") -> dict:
    """``out_dir``: every graph file of ``src_dir`` that the cases name, transformed, gated and
    published (``model.onnx`` last)."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    cases = Cases.load(reference)
    files = [paths.MAIN] + [g for g in cases.graphs if g != paths.MAIN]
    with staging_dir(out_dir / paths.MAIN) as tmp:
        staged, facts = {}, {}
        for f in files:
            src = verify(src_dir / f)
            staged[f] = tmp / f
            facts[f] = transform(src, fit_batch(cases.feeds(f), input_batch(src)[1]), staged[f])
        record = parity.check(staged, cases, tolerance, variant, threads, device,
                              extra={"source": str(src_dir), "graphs": facts}, artifact=out_dir)
        publish_models(staged, record, out_dir)
    return record


def fp16(src_dir, reference, out_dir, tolerance: dict, max_activation: float, max_initializer: float,
         threads: int = 0, device: str = "auto") -> dict:
    """FP16 (I/O FP32) with the range-based FP32 fallback measured on the parity inputs."""
    from vlsens.fp16 import convert_fp16

    return build_variant(src_dir, reference, out_dir, tolerance, "fp16",
                         lambda src, feeds, staged: convert_fp16(src, feeds, staged, max_activation, max_initializer,
                                                                 threads, device), threads, device)


def simplify(src_dir, reference, out_dir, tolerance: dict, variant: str, check_max_bytes: int,
             threads: int = 0, device: str = "auto") -> dict:
    """onnxsim, its own check fed the first parity input (up to ``check_max_bytes``; FP32 sources
    only: on an FP16 source onnxsim fuses the Cast pairs around the FP32 islands, which changes
    rounding by more than its check's FP32 tolerance, so the parity gate alone judges FP16)."""
    from vlsens.simplify import simplify_model

    if variant.startswith("fp16"):
        check_max_bytes = 0
    return build_variant(src_dir, reference, out_dir, tolerance, variant,
                         lambda src, feeds, staged: simplify_model(src, feeds[0], staged, check_max_bytes),
                         threads, device)
