"""The engine session: one ONNX Runtime session over the switch model evaluates any set of INT8
ops on the evaluation feeds, and :class:`Engine` is a prepared engine folder.

Outputs are compared feed by feed against float references kept on disk
(:class:`~vlsens.data.samples.ReferenceStore`) with :class:`~vlsens.core.metrics.Metrics`; graphs whose
output is ``logits`` are also measured by KL and top-1, over their valid (real-token) positions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.metrics import Metrics
from vlsens.core.onnxutil import input_batch, make_session
from vlsens.core.paths import ENGINE_FILES
from vlsens.data.samples import ReferenceStore, Samples
from vlsens.quantize.qdq import Op, QuantSettings
from vlsens.sensitivity.ranking import WIDE_SUFFIX
from vlsens.sensitivity.suffix import SKIP_INPUT, SuffixCache, SuffixPlan
from vlsens.sensitivity.switch import MASK_INPUT, WIDE_INPUT, SwitchMap


def as_samples(inputs, session) -> Samples:
    """:class:`~vlsens.data.samples.Samples` as given, or from one stacked array for the session's
    first input (cut into its fixed batch)."""
    if isinstance(inputs, Samples):
        return inputs
    name, batch = input_batch(session)
    return Samples.from_arrays({name: np.asarray(inputs)}, batch)


class SwitchEngine:
    """One session over the switch model; evaluates any set of INT8 ops on fixed inputs.

    With a :class:`~vlsens.sensitivity.suffix.SuffixCache` a set of ops is evaluated from the cut
    of its earliest op on (:mod:`vlsens.sensitivity.suffix`); without one, on the whole graph."""

    def __init__(self, switch_model: str | Path, switches: SwitchMap, inputs, logits: bool, threads: int = 0,
                 suffix: "SuffixCache | None" = None):
        self.switches = switches
        self.ops = switches.ops
        self.session = make_session(switch_model, threads=threads, basic=True)
        self.samples = as_samples(inputs, self.session)
        self.logits = bool(logits)  # the tower's word (Tower.logits), not a guess from output names
        self.output = self.session.get_outputs()[0].name
        self.suffix = suffix
        names = {i.name: i for i in self.session.get_inputs()}
        skip = names.get(SKIP_INPUT)
        self._no_skip = {SKIP_INPUT: np.zeros(skip.shape[0], dtype=bool)} if skip is not None else {}
        #: the switch model has 16-bit activations (W8A16 ops can be evaluated)
        self.wide = WIDE_INPUT in names

    def outputs(self, int8_ops: Sequence[str] = (), wide_ops: Sequence[str] = ()):
        """Output of every feed, one at a time (a generator: nothing is accumulated);
        ``wide_ops``: those of ``int8_ops`` at 16-bit activations (W8A16)."""
        switches = self.switches.feed(int8_ops, wide_ops, self.wide)
        group = self.suffix.plan.group_of(int8_ops) if self.suffix is not None else None
        for i, feed in enumerate(self.samples.feeds):
            start = self.suffix.feed(group, i) if group is not None else self._no_skip
            yield self.session.run([self.output], {**feed, **switches, **start})[0]

    def evaluate(self, int8_ops: Sequence[str], reference, wide_ops: Sequence[str] = ()) -> dict[str, float]:
        """Metrics against ``reference`` (a ReferenceStore or per-feed arrays), streamed."""
        acc = Metrics(self.logits)
        for i, out in enumerate(self.outputs(int8_ops, wide_ops)):
            acc.add(out, reference[i], self.samples.valid[i])
        return acc.result()


def float_pass(model: str | Path, inputs, threads: int = 0, keep: bool = False) -> tuple[list, float]:
    """One timed pass of a float model over ``inputs`` (the floor); outputs kept when ``keep``."""
    sess = make_session(model, threads=threads, basic=True)
    samples = as_samples(inputs, sess)
    sess.run(None, samples.feeds[0])  # warm-up
    outs, t0 = [], time.perf_counter()
    for feed in samples.feeds:
        out = sess.run(None, feed)[0]
        if keep:
            outs.append(out)
    return outs, time.perf_counter() - t0


def engine_sensitivity(engine: SwitchEngine, ops: Sequence[Op], reference) -> tuple[list[dict], float, float | None]:
    """Rows (without rank) for ``ops``, the mean seconds per op of the W8A8 pass and of the W8A16
    pass (None without 16-bit activations). With them, each op is measured at both widths in the
    same session: ``<metric>_a16`` beside every metric (:data:`WIDE_SUFFIX`)."""
    from vlsens.core.job import Progress

    engine.evaluate((), reference)  # warm-up: first-run allocations are not the op's cost
    rows, narrow_s, wide_s = [], 0.0, 0.0
    progress = Progress("sensitivity", len(ops), "ops")
    for op in ops:
        t0 = time.perf_counter()
        row = {**op.as_row(), **engine.evaluate([op.name], reference)}
        narrow_s += time.perf_counter() - t0
        if engine.wide:
            t0 = time.perf_counter()
            row.update({f"{k}{WIDE_SUFFIX}": v for k, v in engine.evaluate([op.name], reference, [op.name]).items()})
            wide_s += time.perf_counter() - t0
        rows.append(row)
        progress.step()
    n = max(len(ops), 1)
    return rows, narrow_s / n, (wide_s / n if engine.wide else None)


class Engine:
    """A prepared engine folder (:func:`vlsens.sensitivity.stages.prepare`): its files and
    ``engine.json`` (ops, switch map, settings, floor timing)."""

    def __init__(self, folder: str | Path):
        self.dir = Path(folder)
        self.meta = json.loads(self.path("meta").read_text())
        self.ops = [Op(**o) for o in self.meta["ops"]]
        self.switches = SwitchMap.from_json(self.meta["switches"])
        self.settings = QuantSettings.from_config(self.meta["settings"])
        self.suffix_plan = SuffixPlan.from_json(self.meta["suffix"]) if self.meta.get("suffix") else None
        self.logits = bool(self.meta["logits"])
        #: the engine measures 16-bit activations too (W8A16: targets with wide activations)
        self.wide = bool(self.meta.get("wide"))

    def path(self, key: str) -> Path:
        return self.dir / ENGINE_FILES[key]

    @property
    def float_model(self) -> Path:
        return self.path("float_model")

    @property
    def switch_model(self) -> Path:
        return self.path("switch")

    @property
    def cache(self) -> Path:
        return self.path("cache")

    def reference(self) -> ReferenceStore:
        return ReferenceStore(self.path("reference"))

    def float_outputs(self) -> np.ndarray:
        """The reference, concatenated (vision; text logits stay per feed: :meth:`reference`)."""
        return self.reference().concatenated()

    def samples(self, split_npz: str | Path) -> Samples:
        return Samples.load(split_npz, self.float_model)

    def session(self, eval_inputs, threads: int = 0, cache_dir: str | Path | None = None) -> SwitchEngine:
        """An engine session on ``eval_inputs``; with ``cache_dir`` (a private scratch folder) and a
        segmented switch model, the suffix engine (its cache filled there by one float pass)."""
        if isinstance(eval_inputs, (str, Path)):
            eval_inputs = self.samples(eval_inputs)
        suffix = None
        if cache_dir is not None and self.suffix_plan is not None and self.suffix_plan.segments:
            samples = eval_inputs if isinstance(eval_inputs, Samples) else None
            if samples is None:
                raise ValueError("the suffix engine needs its inputs as Samples")
            suffix = SuffixCache.fill(self.path("probe"), self.suffix_plan, samples.feeds, cache_dir,
                                      (MASK_INPUT, WIDE_INPUT) if self.wide else MASK_INPUT, self.switches.size,
                                      threads)
        return SwitchEngine(self.switch_model, self.switches, eval_inputs, self.logits, threads, suffix)
