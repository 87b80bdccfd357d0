"""INC's private adaptor calls, captured into one typed object.

INC has no public per-op API. :class:`MseOrderCapture` wraps, for the duration of one
``quantization.fit`` (:meth:`MseOrderCapture.patched`), the three private methods of
``ONNXRUNTIMEAdaptor`` pinned in :data:`vlsens.sensitivity.inc.settings.PRIVATE_API`:

* ``_get_mse_order``: the op list and INC's MSE per op (the first call is the fallback stage over
  every INT8 op); with ``stop=True`` the run ends right after it (:class:`Stop`);
* ``_calculate_mse``: the float and quantized outputs behind each MSE, from which cosine and SQNR
  are computed with :mod:`vlsens.core.metrics` (the ``ort`` engine's implementation);
* ``_inference_model_on_batches``: redirected to the evaluation set (:class:`Loader`), so INC
  scores ops on the same images as ``ort`` (it calibrates on the calibration set).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlsens.core.job import Progress
from vlsens.core.metrics import output_metrics
from vlsens.sensitivity.inc.names import Node


class Loader:
    """INC dataloader: (batch, label) pairs in the graph's batch size."""

    def __init__(self, data: np.ndarray, batch: int = 1):
        self.data, self.batch_size = data, batch

    def __iter__(self):
        n = len(self.data) - len(self.data) % self.batch_size
        for i in range(0, n, self.batch_size):
            yield self.data[i:i + self.batch_size], 0

    def __len__(self):
        return len(self.data) // self.batch_size


class Stop(BaseException):
    """Raised inside INC once the per-op scores are captured (sensitivity mode). A BaseException:
    ``quantization.fit`` swallows every ``Exception`` (and KeyboardInterrupt) and only logs it."""


@dataclass
class MseOrderCapture:
    """What one mse_v2 run revealed: the ops INC scored, their MSE, and the outputs behind it."""

    evals: np.ndarray  # the evaluation set INC's inference is redirected to
    batch: int
    max_ops: int | None = None  # score only the first N ops (None: all)
    stop: bool = True  # end the run after the first per-op stage (sensitivity mode)
    calls: int = 0
    all_ops: list[tuple[str, str]] = field(default_factory=list)  # (name, type) INC would score
    ops: list[tuple[str, str]] = field(default_factory=list)  # the ones scored
    inc_nodes: list[Node] = field(default_factory=list)  # INC's (pre-optimized) graph
    inc_inits: dict[str, int] = field(default_factory=dict)  # its initializers' sizes
    mse: dict | None = None  # INC's MSE per (name, type)
    outputs: list[tuple[float, dict]] = field(default_factory=list)  # per comparison: INC's MSE, our metrics
    inference_end: list[float] = field(default_factory=list)
    t0: float = 0.0
    t1: float = 0.0
    progress: Progress | None = None  # progress lines while INC scores the ops (the first stage)

    @property
    def complete(self) -> bool:
        return self.mse is not None

    def seconds_per_op(self) -> float:
        """From the end of the float reference pass to the last op's score."""
        start = next((t for t in self.inference_end if t >= self.t0), self.t0)
        return (self.t1 - start) / max(len(self.ops), 1)

    @contextmanager
    def patched(self, adaptor_cls) -> Iterator["MseOrderCapture"]:
        cap = self

        def wrap_mse_order(orig):
            def f(self, fp32_model, tune_cfg, replace_cfgs, ops_lst, dataloader, output_op_names,
                  confidence_batches):
                cap.calls += 1
                if cap.calls > 1:  # later fallback rounds of a tuning run: not ours to record
                    return orig(self, fp32_model, tune_cfg, replace_cfgs, ops_lst, dataloader, output_op_names,
                                confidence_batches)
                cap.all_ops = [tuple(o) for o in ops_lst]
                chosen = list(ops_lst)[:cap.max_ops] if cap.max_ops else list(ops_lst)
                cap.inc_nodes = [Node.of(n) for n in fp32_model.model.graph.node]
                cap.inc_inits = {i.name: int(np.prod(i.dims)) for i in fp32_model.model.graph.initializer}
                cap.t0 = time.perf_counter()
                cap.progress = Progress("sensitivity (inc)", len(chosen), "ops")
                cap.mse = orig(self, fp32_model, tune_cfg, replace_cfgs, chosen, dataloader, output_op_names,
                               confidence_batches)
                cap.t1 = time.perf_counter()
                cap.progress = None
                cap.ops = [tuple(o) for o in chosen]
                if cap.stop:
                    raise Stop
                return cap.mse

            return f

        def wrap_calc(orig):
            def f(self, fp32_output, q_output):
                value = orig(self, fp32_output, q_output)
                ref = np.concatenate([np.asarray(a).ravel() for a in fp32_output])
                out = np.concatenate([np.asarray(a).ravel() for a in q_output])
                cap.outputs.append((float(value), output_metrics(out, ref)))
                if cap.progress is not None:  # one comparison per op scored
                    cap.progress.step()
                return value

            return f

        with _patched(adaptor_cls, "_get_mse_order", wrap_mse_order), \
                _patched(adaptor_cls, "_calculate_mse", wrap_calc), \
                redirected_inference(adaptor_cls, cap.evals, cap.batch,
                                     after=lambda: cap.inference_end.append(time.perf_counter())):
            yield self


@contextmanager
def redirected_inference(adaptor_cls, evals: np.ndarray, batch: int, after=None) -> Iterator[None]:
    """``_inference_model_on_batches`` redirected to the evaluation set; ``after()`` is called when
    each inference pass ends."""

    def wrap(orig):
        def f(self, model, tune_cfg, dataloader, output_op_name, iterations):
            out = orig(self, model, tune_cfg, Loader(evals, batch), output_op_name, len(evals) // batch)
            if after is not None:
                after()
            return out

        return f

    with _patched(adaptor_cls, "_inference_model_on_batches", wrap):
        yield


class _ErrorCatcher(logging.Handler):
    """Collects the errors ``quantization.fit`` logs instead of raising (it swallows exceptions)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "Unexpected exception" in msg:
            self.messages.append(msg)


@contextmanager
def inc_errors() -> Iterator[_ErrorCatcher]:
    catcher = _ErrorCatcher()
    logger = logging.getLogger("neural_compressor")
    logger.addHandler(catcher)
    try:
        yield catcher
    finally:
        logger.removeHandler(catcher)


@contextmanager
def _patched(cls, name: str, wrapper) -> Iterator[None]:
    original = getattr(cls, name)
    setattr(cls, name, wrapper(original))
    try:
        yield
    finally:
        setattr(cls, name, original)


@contextmanager
def workspace(path: str | Path | None) -> Iterator[None]:
    """INC writes into ``./nc_workspace`` unless told otherwise: keep it inside the job's folder."""
    if path is None:
        yield
        return
    from neural_compressor.config import options

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    before = options.workspace
    options.workspace = str(path) + "/"
    try:
        yield
    finally:
        options.workspace = before
