"""Variants of a verified model folder: FP16, BF16 and onnxsim, for any tower.

A variant stage transforms every graph file of the source folder that the reference cases name
(``model.onnx``; the text tower's ``embeds.onnx`` too), feeding each transform that graph's own
parity inputs (the FP16 range analysis observes activations on them; onnxsim's check runs on
them), then gates the result on every case and publishes the folder (``model.onnx`` last). The
transforms are pure ONNX -> ONNX: :func:`vlsens.variants.float16.convert_fp16`,
:func:`vlsens.variants.simplified.simplify_model`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vlsens.core import paths
from vlsens.core.artifacts import publish_models, verify
from vlsens.core.fsutil import staging_dir
from vlsens.core.onnxutil import input_batch
from vlsens.data.cases import Cases
from vlsens.data.samples import fit_batch
from vlsens.export import parity

log = logging.getLogger(__name__)

#: ``transform(source graph, feeds, staged graph) -> facts for the record``
Transform = Callable[[Path, list, Path], dict]


#: ``reference_for(staged graphs, cases) -> cases``: the expected outputs of a lossy variant with
#: its own weights (the cases' inputs unchanged)
Reference = Callable[[dict, Cases], Cases]


@dataclass(frozen=True)
class Gate:
    """How a variant folder is gated: the parity ``tolerance`` and where its graphs run (``threads``,
    ``device``; ``open_session(path)``: what opens a graph where ONNX Runtime's CPU provider cannot,
    :func:`vlsens.variants.bfloat16.session_opener`). With ``reference_for`` (a weight-only INT4
    variant, whose weights are not the checkpoint's) the gate is :func:`gate_own_weights`, the
    exact check within ``exact_tolerance`` (FP32's)."""

    tolerance: dict
    threads: int = 0
    device: str = "auto"
    reference_for: Reference | None = None
    exact_tolerance: dict | None = None
    open_session: Callable | None = None


def variant_folder(src_dir: str | Path, reference: str | Path, out_dir: str | Path, variant: str,
                   transform: Transform, gate: Gate) -> dict:
    """``out_dir``: every graph file of ``src_dir`` that the cases name, transformed, gated
    (:class:`Gate`) and published (``model.onnx`` last)."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    cases = Cases.load(reference)
    files = [paths.MAIN] + [g for g in cases.graphs if g != paths.MAIN]
    with staging_dir(out_dir / paths.MAIN) as tmp:
        staged, facts = {}, {}
        for f in files:
            src = verify(src_dir / f)
            staged[f] = tmp / f
            t0 = time.perf_counter()
            log.info("%s: transforming %s ...", variant, src)
            facts[f] = transform(src, fit_batch(cases.feeds(f), input_batch(src)[1]), staged[f])
            log.info("%s: %s written in %.1f s; gating", variant, f, time.perf_counter() - t0)
        extra = {"source": str(src_dir), "graphs": facts}
        if gate.reference_for is None:
            record = parity.check(staged, cases, gate.tolerance, variant, gate.threads, gate.device, extra=extra,
                                  artifact=out_dir, open_session=gate.open_session)
        else:
            record = gate_own_weights(staged, cases, gate.reference_for(staged, cases), gate, variant, extra, out_dir)
        publish_models(staged, record, out_dir)
    return record


def gate_own_weights(staged: dict, cases: Cases, own: Cases, gate: Gate, variant: str, extra: dict,
                     artifact) -> dict:
    """The parity gate of a weight-only quantized decoder, against ``own``: transformers run on
    the graph's own (dequantized) weights, so that a bad graph fails whatever the checkpoint's
    weights make of INT4:

    1. exact: the graph with float activations (``accuracy_level`` 0) within
       ``gate.exact_tolerance`` (FP32's): the export, the weight packing and the kernel, to rounding;
    2. as shipped (its ``accuracy_level``; 4 quantizes activations to INT8 per block) within
       ``gate.tolerance``: the record's ``metrics``.

    ``extra.float_reference``: the shipped graph against the checkpoint's model (``cases``), the
    quantization error, measured, not gated."""
    from vlsens.core.errors import ParityError
    from vlsens.quantize.nbits import float_activations_copy

    tolerance, exact_tolerance, threads, device = gate.tolerance, gate.exact_tolerance, gate.threads, gate.device
    main = staged[paths.MAIN]
    exact = float_activations_copy(main, main.with_name(".exact-" + main.name))
    try:
        per_exact, _, _ = parity.measure({**staged, paths.MAIN: exact}, own, threads, device)
    finally:
        exact.unlink(missing_ok=True)
    per_input, providers, vs_float = parity.measure(staged, own, threads, device, also=cases)
    ex = parity.summary(per_exact)["metrics"]
    exact_passed = (ex["min_cosine"] >= float(exact_tolerance["min_cosine"])
                    and ex["max_rel_error"] <= float(exact_tolerance["max_rel_error"]))
    extra["exact"] = {"note": "the graph with float activations (accuracy_level 0) against the same reference",
                      "tolerance": {k: float(v) for k, v in exact_tolerance.items()}, "passed": exact_passed,
                      "metrics": ex, "per_input": per_exact}
    extra["float_reference"] = {"reference": cases.source, "note": "the graph as shipped against the checkpoint's "
                                "own model: the quantization error, measured, not gated",
                                **parity.summary(vs_float), "per_input": vs_float}
    record = parity.make_record(artifact, variant, per_input, tolerance, own.source, providers, extra)
    if not exact_passed:
        record["passed"] = False
        raise ParityError(f"parity gate failed for {artifact} ({variant}): with float activations it differs from "
                          f"transformers on its own weights: min cosine {ex['min_cosine']:.8f} (needs >= "
                          f"{exact_tolerance['min_cosine']}), max relative error {ex['max_rel_error']:.3e} (needs <= "
                          f"{exact_tolerance['max_rel_error']}). No model was written.", record)
    parity.gate(record)
    return record


def fp16(src_dir, reference, out_dir, tolerance: dict, max_activation: float, max_initializer: float,
         threads: int = 0, device: str = "auto") -> dict:
    """FP16 (I/O FP32) with the range-based FP32 fallback measured on the parity inputs."""
    from vlsens.variants.float16 import convert_fp16

    return variant_folder(src_dir, reference, out_dir, "fp16",
                          lambda src, feeds, staged: convert_fp16(src, feeds, staged, max_activation, max_initializer,
                                                                  threads, device), Gate(tolerance, threads, device))


def bf16(src_dir, reference, out_dir, tolerance: dict, threads: int = 0, device: str = "auto") -> dict:
    """BF16 inside, float32 I/O (:mod:`vlsens.variants.bfloat16`), gated by whatever runs bfloat16 here
    (:func:`vlsens.variants.bfloat16.open_session`; the record's ``providers`` say which)."""
    from vlsens.variants import bfloat16 as _bf16

    return variant_folder(src_dir, reference, out_dir, "bf16", lambda src, feeds, staged: _bf16.convert_bf16(src, staged),
                          Gate(tolerance, threads, device, open_session=_bf16.session_opener(threads, device)))


def smooth(src_dir, reference, calib_npz, out_dir, tolerance: dict, settings: dict, threads: int = 0,
           device: str = "auto") -> dict:
    """``fp32-smooth``: outlier channels migrated into the weights where the graph allows
    (:mod:`vlsens.variants.smoothquant`), each block's strength measured on the calibration set with the
    target's quantization ``settings`` (``sensitivity.*`` resolved); gated at FP32's tolerance."""
    from vlsens.quantize.qdq import QuantSettings
    from vlsens.variants.smoothquant import smooth_model

    def transform(src, feeds, staged):
        return smooth_model(src, calib_npz, staged, QuantSettings.from_config(settings), threads)

    return variant_folder(src_dir, reference, out_dir, "fp32-smooth", transform, Gate(tolerance, threads, device))


def simplify(src_dir, reference, out_dir, tolerance: dict, variant: str, check_max_bytes: int,
             threads: int = 0, device: str = "auto") -> dict:
    """onnxsim, its own check fed the first parity input (up to ``check_max_bytes``; FP32 sources
    only: on an FP16 source onnxsim fuses the Cast pairs around the FP32 islands, which changes
    rounding by more than its check's FP32 tolerance, so the parity gate alone judges FP16)."""
    from vlsens.variants.simplified import simplify_model

    if variant.startswith("fp16"):
        check_max_bytes = 0
    return variant_folder(src_dir, reference, out_dir, variant,
                          lambda src, feeds, staged: simplify_model(src, feeds[0], staged, check_max_bytes),
                          Gate(tolerance, threads, device))
