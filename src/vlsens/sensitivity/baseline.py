"""The reference method the engine is checked against: one ``quantize_static`` model and one
fresh session per op (what a user would write by hand; the engine must give the same numbers)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.metrics import Metrics
from vlsens.core.onnxutil import make_session
from vlsens.quantize.qdq import Op, QuantSettings, quantize
from vlsens.sensitivity.engine import as_samples


def model_outputs(model: str | Path, inputs, threads: int = 0) -> list[np.ndarray]:
    """Outputs of a model, one per feed (basic optimizations: the engine's arithmetic)."""
    sess = make_session(model, threads=threads, basic=True)
    return [sess.run(None, feed)[0] for feed in as_samples(inputs, sess).feeds]


def straightforward_sensitivity(float_model: str | Path, ops: Sequence[Op], settings: QuantSettings,
                                cache: str | Path, inputs, reference: Sequence[np.ndarray], scratch: str | Path,
                                threads: int = 0, *, logits: bool) -> tuple[list[dict], float, list[list[np.ndarray]]]:
    """Rows, seconds per op, and each op's outputs per feed (``logits``: as the engine's)."""
    scratch = Path(scratch)
    sess = make_session(float_model, threads=threads, basic=True)
    samples = as_samples(inputs, sess)
    del sess
    rows, outs, t0 = [], [], time.perf_counter()
    for k, op in enumerate(ops):
        d = scratch / f"op{k}"
        path = quantize(float_model, d / "model.onnx", [op.name], settings, cache)
        out = model_outputs(path, samples, threads)
        acc = Metrics(logits)
        for o, r, v in zip(out, reference, samples.valid):
            acc.add(o, r, v)
        outs.append(out)
        rows.append({**op.as_row(), **acc.result()})
        shutil.rmtree(d, ignore_errors=True)
    return rows, (time.perf_counter() - t0) / max(len(ops), 1), outs
