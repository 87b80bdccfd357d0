"""Parity gates: ONNX graphs against transformers' PyTorch outputs on real inputs.

:func:`check` runs every parity case (:mod:`vlsens.data.cases`) through the graph file it names, one
session per file, and compares the output with the reference at the case's valid positions
(:mod:`vlsens.core.metrics`). A graph with a fixed batch gets each case in that batch (padded rows
dropped). The record (``parity.json`` next to the model; schema
``workflow/schemas/records/parity.schema.yaml``) has these stable keys:

``artifact``      the model folder or file checked
``variant``       fp32, fp16, fp32-sim, fp16-sim
``passed``        bool
``metrics``       worst case over the cases: ``max_abs_diff``, ``max_rel_error`` (max abs diff
                  divided by the reference's max abs value), ``mean_abs_diff``, ``min_cosine``, and
                  for logits ``min_top1_agreement``
``per_input``     the same metrics for each case, with ``case``, ``graph``, ``shape`` (of its first
                  input) and the case's facts (fixed-size vision: ``image``, ``sha256``)
``tolerance``     ``min_cosine`` and ``max_rel_error`` the artifact had to meet
``reference``     what the ONNX outputs were compared with
``inputs``        the cases (``case``, ``graph`` and their facts); ``input_shape``: each case's
                  first input shape
``providers``     ONNX Runtime execution providers used
``versions``      library versions
``extra``         stage facts (exporter and opset; FP16 fallback nodes; onnxsim node counts)
``files``         bytes and sha256 of every graph file and its data, and the rule that wrote them
                  (added when the model is published, :mod:`vlsens.core.artifacts`)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from vlsens.core.errors import ParityError
from vlsens.core.metrics import compare
from vlsens.core.onnxutil import make_session
from vlsens.core.versions import RECORD_LIBRARIES, versions
from vlsens.data.cases import Cases
from vlsens.data.samples import run_fitted

log = logging.getLogger(__name__)


def check(models: dict[str, Path], cases: Cases, tolerance: dict, variant: str, threads: int = 0,
          device: str = "auto", extra: dict[str, Any] | None = None, artifact: str | Path | None = None,
          open_session=None) -> dict:
    """The parity record of ``models`` (``{graph file: path}``) on every case; raises
    :class:`ParityError` (carrying the record) when any case misses ``tolerance``."""
    per_input, providers, _ = measure(models, cases, threads, device, open_session=open_session)
    record = make_record(artifact or next(iter(models.values())), variant, per_input, tolerance, cases.source,
                         providers, extra)
    gate(record)
    return record


def measure(models: dict[str, Path], cases: Cases, threads: int = 0, device: str = "auto",
            also: Cases | None = None, open_session=None) -> tuple[list[dict], list[str], list[dict]]:
    """``(per_input, providers, also_per_input)``: every case's metrics, the providers that ran
    them, and the same outputs' metrics against ``also`` (other cases with the same names and
    inputs: another reference; empty without it). ``open_session(path)``: what runs a graph
    (default an ONNX Runtime session; :mod:`vlsens.variants.bfloat16` brings its own where ORT has no kernels)."""
    missing = [g for g in cases.graphs if g not in models]
    if missing:
        raise ParityError(f"parity cases name graph(s) {missing} that were not given ({sorted(models)})")
    per_input, second, providers = [], [], []
    others = {c.name: c for c in also} if also is not None else {}
    for graph in cases.graphs:
        t0 = time.perf_counter()
        sess = (open_session(models[graph]) if open_session is not None
                else make_session(models[graph], threads=threads, device=device))
        providers = sess.get_providers()
        todo = list(cases.for_graph(graph))
        log.info("parity: %s session ready in %.1f s, %d case(s)", graph, time.perf_counter() - t0, len(todo))
        for k, c in enumerate(todo, 1):
            t1 = time.perf_counter()
            out = run_fitted(sess, c.inputs)
            head = {"case": c.name, "graph": graph, "shape": list(np.shape(next(iter(c.inputs.values())))), **c.meta}
            per_input.append({**head, **compare(out, c.expected, c.valid, c.logits)})
            log.info("parity: %s case %d/%d (%s): cosine %.8f, max rel error %.2e (%.1f s)", graph, k, len(todo),
                     c.name, per_input[-1]["cosine"], per_input[-1]["max_rel_error"], time.perf_counter() - t1)
            if c.name in others:
                o = others[c.name]
                second.append({**head, **compare(out, o.expected, o.valid, o.logits)})
        del sess
    return per_input, providers, second


def summary(per_input: list[dict]) -> dict:
    """``{"metrics": worst case over the cases}``."""
    metrics = {
        "max_abs_diff": max(p["max_abs_diff"] for p in per_input),
        "mean_abs_diff": float(np.mean([p["mean_abs_diff"] for p in per_input])),
        "max_rel_error": max(p["max_rel_error"] for p in per_input),
        "min_cosine": min(p["cosine"] for p in per_input),
    }
    if any("top1_agreement" in p for p in per_input):
        metrics["min_top1_agreement"] = min(p["top1_agreement"] for p in per_input if "top1_agreement" in p)
    return {"metrics": metrics}


def make_record(artifact, variant, per_input, tolerance, reference, providers, extra=None) -> dict:
    metrics = summary(per_input)["metrics"]
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
        "inputs": [{k: v for k, v in p.items() if k not in _METRIC_KEYS and k != "shape"} for p in per_input],
        "input_shape": [p["shape"] for p in per_input],
        "providers": list(providers),
        "versions": versions(*RECORD_LIBRARIES),
        "extra": extra or {},
    }


_METRIC_KEYS = {"max_abs_diff", "mean_abs_diff", "max_rel_error", "cosine", "top1_agreement", "positions"}


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
