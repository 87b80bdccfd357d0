"""Parity gates: an ONNX artifact against transformers' PyTorch output on real images.

The record (``parity.json`` next to the model) has these stable keys:

``artifact``      path of the model checked
``variant``       fp32, fp16, fp32-sim, fp16-sim, ...
``passed``        bool
``metrics``       worst case over the inputs: ``max_abs_diff``, ``max_rel_error`` (max abs diff
                  divided by the reference's max abs value), ``mean_abs_diff``, ``min_cosine``
``per_input``     the same metrics for each image, with ``image`` and ``sha256``
``tolerance``     ``min_cosine`` and ``max_rel_error`` the artifact had to meet
``reference``     what the ONNX output was compared with
``inputs``        the images used (name, sha256), ``input_shape``
``providers``     ONNX Runtime execution providers used
``versions``      library versions
``extra``         stage-specific facts (e.g. FP16 fallback nodes)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from vlsens.errors import ParityError
from vlsens.onnxutil import make_session
from vlsens.versions import RECORD_LIBRARIES, versions

log = logging.getLogger(__name__)


def compare(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """Difference metrics between two arrays of the same shape (computed in float64)."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(expected, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {np.shape(actual)} vs {np.shape(expected)}")
    diff = np.abs(a - b)
    scale = float(np.max(np.abs(b))) or 1.0
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
    finite = bool(np.isfinite(a).all())
    return {
        "max_abs_diff": float(diff.max()) if finite else float("inf"),
        "mean_abs_diff": float(diff.mean()) if finite else float("inf"),
        "max_rel_error": float(diff.max() / scale) if finite else float("inf"),
        "cosine": cos if finite else -1.0,
    }


def run_batched(session, input_name: str, data: np.ndarray, batch: int) -> np.ndarray:
    """Run ``session`` over ``data`` in chunks of the graph's fixed ``batch`` size."""
    n = len(data)
    if n % batch:  # pad the last batch by repeating inputs; padded outputs are dropped
        data = np.concatenate([data, data[np.arange(batch - n % batch) % n]], axis=0)
    outs = [session.run(None, {input_name: data[i:i + batch]})[0] for i in range(0, len(data), batch)]
    return np.concatenate(outs, axis=0)[:n]


def check_vision(model_path: str | Path, reference, tolerance: dict, variant: str,
                 threads: int = 0, device: str = "auto", extra: dict[str, Any] | None = None,
                 artifact: str | Path | None = None) -> dict:
    """Compare a fixed-size vision graph with the transformers reference.

    Returns the parity record; raises :class:`ParityError` (carrying the record) when any input
    misses ``tolerance``.
    """
    sess = make_session(model_path, threads=threads, device=device)
    inp = sess.get_inputs()[0]
    batch = inp.shape[0] if isinstance(inp.shape[0], int) else 1
    out = run_batched(sess, inp.name, reference.pixel_values, batch)
    per_input = []
    for i, (name, sha) in enumerate(zip(reference.names, reference.sha256)):
        m = compare(out[i], reference.features[i])
        per_input.append({"image": name, "sha256": sha, **m})
    record = make_record(
        artifact or model_path, variant, per_input, tolerance,
        reference="transformers Qwen2_5_VLModel.get_image_features (PyTorch, float32)",
        inputs=reference.inputs, input_shape=list(reference.pixel_values.shape),
        providers=sess.get_providers(), extra=extra,
    )
    gate(record)
    return record


def make_record(artifact, variant, per_input, tolerance, reference, inputs, input_shape,
                providers, extra=None) -> dict:
    metrics = {
        "max_abs_diff": max(p["max_abs_diff"] for p in per_input),
        "mean_abs_diff": float(np.mean([p["mean_abs_diff"] for p in per_input])),
        "max_rel_error": max(p["max_rel_error"] for p in per_input),
        "min_cosine": min(p["cosine"] for p in per_input),
    }
    tol = {"min_cosine": float(tolerance["min_cosine"]), "max_rel_error": float(tolerance["max_rel_error"])}
    passed = metrics["min_cosine"] >= tol["min_cosine"] and metrics["max_rel_error"] <= tol["max_rel_error"]
    return {
        "artifact": str(artifact),
        "variant": variant,
        "passed": bool(passed),
        "metrics": metrics,
        "per_input": per_input,
        "tolerance": tol,
        "reference": reference,
        "inputs": inputs,
        "input_shape": input_shape,
        "providers": list(providers),
        "versions": versions(*RECORD_LIBRARIES),
        "extra": extra or {},
    }


def gate(record: dict) -> None:
    """Raise :class:`ParityError` unless the record passed."""
    if record["passed"]:
        log.info("parity passed for %s: %s", record["artifact"], record["metrics"])
        return
    m, t = record["metrics"], record["tolerance"]
    raise ParityError(
        f"parity gate failed for {record['artifact']} ({record['variant']}): "
        f"min cosine {m['min_cosine']:.8f} (needs >= {t['min_cosine']}), "
        f"max relative error {m['max_rel_error']:.3e} (needs <= {t['max_rel_error']}). "
        "No model was written.",
        record,
    )
