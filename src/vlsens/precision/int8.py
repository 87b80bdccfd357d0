"""Stage: a mixed-precision profile that is built and verified, for a deployment target.

1. **Search** with the engine's switch model (any set of INT8 ops costs one pass over the
   evaluation set): the longest prefix of the ranking (least sensitive first) that meets the
   target, by bisection, then a greedy pass over the remaining ops in rank order, each kept only if
   the combined model still meets the target (interactions are re-measured, not assumed). The
   value the search sees for its choice is the **estimate**.
2. **Build** the chosen set with ``quantize_static`` (the engine's settings and calibration cache)
   and measure it in the target's arithmetic (:mod:`vlsens.quantize.target`: ``ort-cpu`` = ONNX
   Runtime's integer kernels in a default session; the others = fake quantization). With the
   run's saturation guard the two agree to float rounding, so the first build normally ships.
3. **Repair**, only when the built model misses the target: (a) the search is run again with the
   target shifted by the measured gap (estimate - built) and that choice is built; (b) if it still
   misses, bisection over built models along the sensitivity ranking (the k most sensitive chosen
   ops back to float, k found in log2(n) builds). The met build with the largest INT8 share of the
   weights ships; ``profile.yaml`` says for every op what was measured.
4. **Objective** ``latency``: subsets of the shipped set that leave the smallest ops in float
   (:data:`LATENCY_FRACTIONS` of its INT8 weights) are built, measured and timed on the target's
   provider; the fastest one that meets the target ships. With ``accuracy`` the shipped model is
   timed only. Either way FP32 / FP16 are timed in the same process and a profile slower than FP32
   says so on the console.
5. Write ``profile.yaml``, ``nodes_to_exclude.json`` (for ``quantize_static``),
   ``inc_op_name_dict.json`` (Intel Neural Compressor's ``op_name_dict``), the model and
   ``eval.json``. A target that no INT8 op can meet is reported as ``status: unreachable``.

Every build is written into a folder of its own (compact data file, checked) and only the
shipped one is kept, so a profile's model file holds exactly one model's bytes.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vlsens.core.artifacts import file_entries, verify
from vlsens.core.errors import VlsensError
from vlsens.core.fsutil import publish, staging_dir, write_json, write_yaml
from vlsens.core.metrics import Metrics
from vlsens.core.onnxutil import copy_model, data_path, make_session
from vlsens.core.paths import PROFILE_FILES
from vlsens.precision.wide import explain_wide, precision_of, search_wide
from vlsens.quantize.qdq import quantize, quantized_ops, wide_quantized, wide_tensors
from vlsens.quantize.target import arithmetic_note, cpu_features, measurement_providers, target_of
from vlsens.sensitivity.engine import Engine
from vlsens.sensitivity.ranking import read_csv

log = logging.getLogger(__name__)

#: Profile metrics; ``kl`` and ``top1`` exist for text graphs (logits) only.
HIGHER_IS_BETTER = {"cosine": True, "sqnr_db": True, "mse": False, "kl": False, "top1": True}
#: Objective ``latency``: candidates keep the largest INT8 ops of the shipped set covering these
#: fractions of its INT8 weights (the smallest ops, whose Q/DQ can cost more than they save, go
#: back to float first; activation x activation MatMuls have no weights and go first).
LATENCY_FRACTIONS = (0.99, 0.95, 0.8, 0.5)
OBJECTIVES = ("accuracy", "latency")
#: Metrics whose perfect value is 1: a target shifted to 1 or beyond is met by the float model only.
PERFECT_ONE = ("cosine", "top1")


def meets(metrics: dict, metric: str, value: float) -> bool:
    m = metrics[metric]
    return m >= value if HIGHER_IS_BETTER[metric] else m <= value


def shortfall(metrics: dict, metric: str, value: float) -> float:
    """How far ``metrics`` is on the bad side of ``value`` (> 0: misses; in the metric's units)."""
    m = float(metrics[metric])
    return value - m if HIGHER_IS_BETTER[metric] else m - value


def search(ranking: Sequence[str], evaluate: Callable[[list[str]], dict], metric: str, value: float,
           max_evals: int = 200, weights: dict[str, int] | None = None) -> tuple[list[str], list[dict]]:
    """Largest INT8 set found by prefix bisection + greedy refinement. Returns (set, trace); with
    ``weights`` (op -> weight parameters) each step also records its INT8 share of the weights.
    The chosen set's own metrics are the last trace entry that meets the target (:func:`estimate_of`)."""
    trace: list[dict] = []
    total = sum(weights.values()) if weights else 0

    def ok(ops: list[str], step: str) -> bool:
        m = evaluate(ops)
        trace.append({"step": step, "int8_ops": len(ops), **m, "meets": meets(m, metric, value)})
        if weights is not None:
            trace[-1]["int8_weight_share"] = sum(weights[o] for o in ops) / total if total else 0.0
        return trace[-1]["meets"]

    order = list(ranking)  # least sensitive first
    lo, hi = 0, len(order)  # prefix lo is known good (empty = float); find the largest good prefix
    if ok(order, "all"):
        return order, trace
    while hi - lo > 1 and len(trace) < max_evals:
        mid = (lo + hi) // 2
        if ok(order[:mid], f"prefix {mid}"):
            lo = mid
        else:
            hi = mid
    chosen = order[:lo]
    for op in order[lo:]:
        if len(trace) >= max_evals:
            break
        if ok(chosen + [op], f"add {op}"):
            chosen.append(op)
    return chosen, trace


def estimate_of(trace: list[dict]) -> dict | None:
    """The search's metrics for its chosen set (every passing step grows the chosen set, so the
    last one is the choice); None when nothing met the target (the choice is the float model)."""
    ok = [t for t in trace if t["meets"]]
    return ok[-1] if ok else None


def inc_op_name_dict(excluded: Sequence[str], op_types: dict[str, str]) -> dict:
    """Intel Neural Compressor's ``op_name_dict`` keeping ``excluded`` in FP32. INC matches keys as
    regular expressions (``fullmatch``) against *its* node names, and it renames every Gemm to
    ``<name>_MatMul`` (+ ``<name>_Add``) before quantizing: keys are escaped names, with that
    suffix allowed for Gemms (tests/test_inc.py checks them against INC's real names)."""
    import re

    fp32 = {"activation": {"dtype": ["fp32"]}, "weight": {"dtype": ["fp32"]}}
    return {re.escape(n) + ("(_MatMul)?" if op_types.get(n) == "Gemm" else ""): fp32 for n in excluded}


# --------------------------------------------------------------------------------------------
# Measuring built models in the target's arithmetic
# --------------------------------------------------------------------------------------------

def target_session(model: str | Path, settings: dict, threads: int = 0, quantized: bool = True):
    """A session that runs ``model`` as the deployment target does. Returns (session, mode).

    ``ort-cpu``: ORT's default optimizations on the CPU provider (Q/DQ fused into integer kernels).
    Fake-quant targets: their own provider where ORT has it (CUDA), else a basic-optimization CPU
    session, where Q/DQ stay fake quantization. A float model (``quantized=False``) always gets the
    default optimizations. FP16 Q/DQ graphs that ORT's CPU fusions reject (FP16 scales in QLinear*
    kernels) fall back to basic optimizations, and the mode says so."""
    target = target_of(settings)
    providers, on_target = measurement_providers(target)
    basic = quantized and target.arithmetic == "fake-quant" and not on_target
    try:
        sess = make_session(model, threads=threads, providers=providers, basic=basic)
        return sess, ("basic (fake quantization)" if basic else "default")
    except Exception as e:  # noqa: BLE001  (ORT raises its own Fail / InvalidGraph types)
        if basic:
            raise
        log.info("default session refused %s (%s); using basic optimizations (recorded in eval.json)", model, str(e)[:160])
        return (make_session(model, threads=threads, providers=providers, basic=True),
                "basic (default optimizations refused the graph: fake quantization)")


def time_session(sess, feed: dict, runs: int = 10) -> float:
    """Median milliseconds of ``runs`` calls after one warm-up call."""
    return time_sessions({"": sess}, feed, runs)[""]


def time_sessions(sessions: dict, feed: dict, runs: int = 10) -> dict[str, float]:
    """Median milliseconds of each session over ``runs`` rounds, each round calling every session
    once in turn (after one warm-up call each): a slow phase of the machine falls on all of them
    alike, so their ratio holds where back-to-back medians would not."""
    for sess in sessions.values():
        sess.run(None, feed)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(runs):
        for k, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, feed)
            times[k].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def measure(sess, float_session, samples, logits: bool, cases: list | None = None) -> dict:
    """Metrics of ``sess``'s outputs against the float model's, feed by feed (sums only kept);
    ``cases``: each feed's own metrics appended (the spread over the evaluation set)."""
    acc = Metrics(logits)
    for feed, valid in zip(samples.feeds, samples.valid):
        out, ref = sess.run(None, feed)[0], float_session.run(None, feed)[0]
        acc.add(out, ref, valid)
        if cases is not None:
            cases.append(Metrics(logits).add(out, ref, valid).result())
    return acc.result()


@dataclass
class Build:
    """One built model of the profile: its INT8 ops, where it lies, what it measured."""

    ops: list[str]
    model: Path
    measured: dict
    session: str
    weight_share: float
    reason: str
    meets: bool
    latency_ms: float | None = None
    extra: dict = field(default_factory=dict)
    #: the ops among :attr:`ops` at 16-bit activations (W8A16)
    wide: list[str] = field(default_factory=list)

    def record(self, metric: str) -> dict:
        r = {"int8_ops": len(self.ops), "int8_weight_share": self.weight_share, **self.measured,
             **({"a16_ops": len(self.wide)} if self.wide else {}),
             "session": self.session, "reason": self.reason, "meets": self.meets, **self.extra}
        if self.latency_ms is not None:
            r["latency_ms"] = self.latency_ms
        return r


class Builder:
    """Builds INT8 sets of one engine into private folders and measures them in the target's
    arithmetic against the float model; one session at a time."""

    def __init__(self, eng: Engine, evals, scratch: Path, weights: dict[str, int], metric: str, value: float,
                 threads: int = 0, latency_runs: int = 10):
        self.eng, self.evals, self.scratch = eng, evals, Path(scratch)
        self.weights, self.total = weights, sum(weights.values())
        self.metric, self.value, self.threads, self.latency_runs = metric, value, threads, latency_runs
        self.settings = eng.meta["settings"]
        self.float_session, _ = target_session(eng.float_model, self.settings, threads, quantized=False)
        self.builds: list[Build] = []

    def share(self, ops) -> float:
        return sum(self.weights[o] for o in ops) / self.total if self.total else 0.0

    def build(self, ops: Sequence[str], reason: str, timed: bool = False, wide: Sequence[str] = (), **extra) -> Build:
        """``ops`` quantized, ``wide`` (among them) at 16-bit activations: the tensors next to them
        get the settings' wide type (:func:`vlsens.quantize.qdq.wide_tensors`)."""
        ops = list(ops)
        wide = [o for o in wide if o in set(ops)]
        folder = self.scratch / f"build{len(self.builds)}"
        if ops:
            model = quantize(self.eng.float_model, folder / "model.onnx", ops, self.eng.settings, self.eng.cache,
                             wide_tensors=wide_tensors(self.eng.switches.tensors, wide))
        else:  # quantize_static reads nodes_to_quantize=[] as "every op": the float model it is
            model = copy_model(self.eng.float_model, folder / "model.onnx")
        got = quantized_ops(model, list(self.weights))
        want_wide = set(wide_tensors(self.eng.switches.tensors, wide)) if ops else set()
        got_wide = wide_quantized(model) if self.eng.wide else set()
        if got_wide != want_wide:
            raise VlsensError(f"profile: the built model has {len(got_wide)} 16-bit activation tensor(s) where the "
                              f"profile chose {len(want_wide)} (only built: {sorted(got_wide - want_wide)[:3]}, only "
                              f"chosen: {sorted(want_wide - got_wide)[:3]}); nothing was written.")
        if got != set(ops):
            raise VlsensError(
                f"profile: the built model quantizes {len(got)} op(s) but the profile chose {len(ops)} "
                f"(only built: {sorted(got - set(ops))[:5]}, only chosen: {sorted(set(ops) - got)[:5]}); "
                "nothing was written.")
        sess, mode = target_session(model, self.settings, self.threads)
        cases: list[dict] = []
        measured = measure(sess, self.float_session, self.evals, self.eng.logits, cases)
        extra = {**extra, "per_case": {self.metric: [c[self.metric] for c in cases]}}
        lat = time_session(sess, self.evals.feeds[0], self.latency_runs) if timed else None
        del sess
        b = Build(ops, model, measured, mode, self.share(ops), reason, meets(measured, self.metric, self.value), lat,
                  extra, wide)
        self.builds.append(b)
        log.info("build %d (%s): %d INT8 op(s), %s %.6g (%s)%s", len(self.builds) - 1, reason, len(ops), self.metric,
                 measured[self.metric], "meets" if b.meets else "misses",
                 f", {lat:.2f} ms" if lat is not None else "")
        return b

    def time(self, b: Build) -> float:
        if b.latency_ms is None:
            sess, _ = target_session(b.model, self.settings, self.threads)
            b.latency_ms = time_session(sess, self.evals.feeds[0], self.latency_runs)
        return b.latency_ms

    def compare(self, b: Build, floats: dict[str, str | Path]) -> dict[str, float]:
        """``b`` (as ``int8_mixed``) and each float model of ``floats``, timed in the same
        interleaved rounds (:func:`time_sessions`)."""
        sessions = {"int8_mixed": target_session(b.model, self.settings, self.threads)[0],
                    **{k: target_session(p, self.settings, self.threads, quantized=False)[0] for k, p in floats.items()}}
        return time_sessions(sessions, self.evals.feeds[0], self.latency_runs)

    def discard_except(self, keep: Build) -> None:
        """Remove every other build's folder (a real-size INT8 model is GBs)."""
        for b in self.builds:
            if b is not keep and b.model.parent.exists():
                shutil.rmtree(b.model.parent, ignore_errors=True)


def _search(eng: Engine, evals, ranking: list[str], metric: str, value: float, max_evals: int,
            threads: int, weights: dict[str, int], rows: dict | None = None
            ) -> tuple[list[str], list[str], list, bool, float]:
    """The search on the engine: (chosen ops, the W8A16 ones among them, trace, graph has logits,
    seconds searching); an engine with 16-bit activations searches W8A8 / W8A16 / float per op
    (:func:`vlsens.precision.wide.search_wide`, ``rows``: the sensitivity rows by op). Its session
    ends here, so the built model is measured with one session at a time."""
    engine = eng.session(evals, threads)
    if metric in ("kl", "top1") and not engine.logits:
        raise VlsensError(f"profile.metric: '{metric}' needs a graph with logits (text); use cosine, sqnr_db or mse")
    reference = eng.reference()
    t0 = time.perf_counter()
    if engine.wide:
        chosen, wide, trace = search_wide(ranking, rows, lambda ops, w: engine.evaluate(ops, reference, w),
                                          lambda m: meets(m, metric, value), max_evals, weights)
    else:
        wide = []
        chosen, trace = search(ranking, lambda ops: engine.evaluate(ops, reference), metric, value, max_evals,
                               weights)
    return chosen, wide, trace, engine.logits, time.perf_counter() - t0


def repair(builder: Builder, chosen: list[str], by_sensitivity: list[str], wide: Sequence[str] = ()) -> list[Build]:
    """Bisection over built models: the smallest k such that ``chosen`` without its k most
    sensitive ops (``by_sensitivity``: most sensitive first) meets the target when built. The
    build with k = 0 is known to miss and k = len(chosen) is the float model; about log2(n)
    builds. Returns the builds made (those that meet among them)."""
    order = [o for o in by_sensitivity if o in set(chosen)]
    lo, hi, made = 0, len(order), []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        dropped = set(order[:mid])
        b = builder.build([o for o in chosen if o not in dropped], f"repair: {mid} most sensitive back to float",
                          wide=wide, dropped=mid)
        made.append(b)
        if b.meets:
            hi = mid
        else:
            lo = mid
    return made


def latency_candidates(shipped: list[str], weights: dict[str, int],
                       fractions: Sequence[float] = LATENCY_FRACTIONS) -> list[tuple[float, list[str]]]:
    """Subsets of ``shipped`` keeping its largest INT8 ops (by weight parameters) that cover each
    fraction of its INT8 weights; distinct, non-empty, smaller than ``shipped``."""
    by_size = sorted(shipped, key=lambda o: -weights[o])
    total = sum(weights[o] for o in shipped)
    out, seen = [], {len(shipped)}
    for f in fractions:
        acc, keep = 0, []
        for o in by_size:
            if total and acc >= f * total:
                break
            keep.append(o)
            acc += weights[o]
        if keep and len(keep) not in seen:
            seen.add(len(keep))
            out.append((f, [o for o in shipped if o in set(keep)]))
    return out


@dataclass(frozen=True)
class ProfileSettings:
    """The profile's knobs (the config's ``profile`` section): the target (``metric`` meets
    ``value``), the search's budget ``max_evals``, the ``objective`` (:data:`OBJECTIVES`), the runs
    per timing ``latency_runs``, whether an unreachable target is an error
    (``fail_if_unreachable``), and the sessions' ``threads``."""

    metric: str
    value: float
    max_evals: int = 200
    objective: str = "accuracy"
    latency_runs: int = 10
    fail_if_unreachable: bool = False
    threads: int = 0


class _Run:
    """What the steps of one :func:`build_profile` share: its settings, the engine, the ranking, the
    evaluation set, and the searches' traces and seconds."""

    def __init__(self, engine_dir, ranking_csv, eval_npz, base_models: dict, out_dir: Path,
                 settings: ProfileSettings, variant: str):
        self.settings, self.variant, self.out_dir = settings, variant, out_dir
        self.eng = Engine(engine_dir)
        self.base_models = {k: verify(p) for k, p in base_models.items()}
        self.rows = {r["op"]: r for r in read_csv(ranking_csv)}
        # least sensitive first
        self.ranking = [r["op"] for r in sorted(self.rows.values(), key=lambda r: -int(r["rank"]))]
        self.by_sensitivity = self.ranking[::-1]
        self.evals = self.eng.samples(eval_npz)
        self.weights = {n: int(r["weight_params"]) for n, r in self.rows.items()}
        self.traces: dict[str, list] = {}
        #: each search's W8A16 ops (empty without 16-bit activations)
        self.wide: dict[str, list[str]] = {}
        self.search_s = 0.0
        self.logits = False

    def search(self, value: float, key: str) -> list[str]:
        """The search for ``metric`` meeting ``value`` (:func:`_search`); its trace kept under ``key``."""
        s = self.settings
        chosen, wide, trace, logits, seconds = _search(self.eng, self.evals, self.ranking, s.metric, value,
                                                       s.max_evals, s.threads, self.weights, self.rows)
        self.wide[key] = wide
        if not self.traces:
            self.logits = logits
        self.traces[key] = trace
        self.search_s += seconds
        return chosen


def _build_choice(run: _Run, builder: Builder, chosen: list[str]) -> float | None:
    """Steps 2 and 3: the search's choice built; when it misses, (a) the search again for the
    target shifted by the measured gap, built, (b) bisection over built models when that misses
    too. Returns the gap (built - estimate; None without an INT8 choice)."""
    s = run.settings
    metric, value = s.metric, s.value
    estimate = estimate_of(run.traces["search"])
    first = builder.build(chosen, "the search's choice", timed=s.objective == "latency", wide=run.wide["search"])
    gap = None if estimate is None or not chosen else float(first.measured[metric]) - float(estimate[metric])
    if chosen and not first.meets:
        # (a) the search again, for a target shifted by the gap the built model showed
        miss = shortfall(first.measured, metric, value) + max(0.0, -shortfall(estimate, metric, value))
        shifted = value + miss if HIGHER_IS_BETTER[metric] else value - miss
        log.warning("the built model misses the target (%s %.6g, estimate %.6g); searching again for %s %.6g",
                    metric, first.measured[metric], estimate[metric], metric, shifted)
        if (shifted < 1.0) if metric in PERFECT_ONE else (HIGHER_IS_BETTER[metric] or shifted > 0):
            again = run.search(shifted, "corrected search")
            if again and set(again) != set(chosen):
                builder.build(again, f"the search again, for {metric} {shifted:.6g}", timed=s.objective == "latency",
                              wide=run.wide["corrected search"])
        # (b) bisection over built models along the ranking
        if not any(b.meets and b.ops for b in builder.builds):
            repair(builder, chosen, run.by_sensitivity, run.wide["search"])
    return gap


def _ship(run: _Run, builder: Builder, chosen: list[str]) -> tuple[str, Build, Build]:
    """Steps 3 and 4: (status, the shipped build, the build the accuracy objective ships): the met
    build with the largest INT8 share of the weights (else the float model), then with objective
    ``latency`` the fastest met candidate among its subsets (:func:`latency_candidates`)."""
    met = [b for b in builder.builds if b.meets and b.ops]
    if met:
        shipped = max(met, key=lambda b: (b.weight_share, len(b.ops)))
        status = "met"
    else:
        shipped = builder.builds[-1] if not chosen else builder.build([], "float (no INT8 set meets the target)")
        status = "unreachable"
    accuracy_choice = shipped
    candidates = []
    if run.settings.objective == "latency" and status == "met":
        builder.time(shipped)
        for f, subset in latency_candidates(shipped.ops, run.weights):
            candidates.append(builder.build(subset, f"latency candidate: largest ops, {f:.0%} of the INT8 weights",
                                            timed=True, fraction=f))
        fastest = min([shipped] + [c for c in candidates if c.meets], key=lambda b: b.latency_ms)
        shipped = fastest
    return status, shipped, accuracy_choice


def _eval_record(run: _Run, builder: Builder, chosen: list[str], status: str, shipped: Build, gap: float | None,
                 lat: dict) -> dict:
    """``eval.json`` of the shipped build (without its ``files``); warns when a met profile is
    slower than FP32."""
    s, settings = run.settings, run.eng.meta["settings"]
    metric, value = s.metric, s.value
    estimate = estimate_of(run.traces["search"])
    speedup = {f"vs_{k}": lat[k] / lat["int8_mixed"] for k in run.base_models if lat["int8_mixed"]}
    measured = shipped.measured
    providers, on_target = measurement_providers(target_of(settings))
    model = shipped.model
    size = model.stat().st_size + data_path(model).stat().st_size
    float_bytes = run.eng.float_model.stat().st_size + data_path(run.eng.float_model).stat().st_size
    if status == "met" and "fp32" in lat and lat["int8_mixed"] > lat["fp32"]:
        log.warning("profile %s (%s): the INT8-mixed model is slower than FP32 on %s (%.3g ms vs %.3g ms); "
                    "%s", run.variant, run.out_dir, providers[0], lat["int8_mixed"], lat["fp32"],
                    "objective: latency found no faster candidate" if s.objective == "latency" else
                    "objective: latency would look for a faster subset")
    return {
        "variant": run.variant,
        "status": status,
        "objective": s.objective,
        "target": {"metric": metric, "value": value, "direction": ">=" if HIGHER_IS_BETTER[metric] else "<="},
        "quant_target": {**{k: v for k, v in target_of(settings).__dict__.items()},
                         "note": arithmetic_note(settings), "measured_on": providers,
                         "on_target": on_target, "cpu": cpu_features()},
        "measured": measured,
        "measured_per_case": shipped.extra.get("per_case"),
        "meets_target": meets(measured, metric, value),
        "measured_against": "the float base model, ONNX Runtime, evaluation set"
                            + (" (real tokens only)" if run.logits else ""),
        "session": shipped.session,
        "estimate": ({k: estimate[k] for k in measured if k in estimate} if estimate is not None else None),
        "estimate_gap": gap,
        "search_choice": {"int8_ops": len(chosen), "int8_weight_share": builder.share(chosen)},
        "int8_ops": len(shipped.ops),
        "quantizable_ops": len(run.rows),
        "int8_op_share": len(shipped.ops) / len(run.rows),
        "int8_weight_share": shipped.weight_share,
        **(_wide_record(run, builder, shipped) if run.eng.wide else {}),
        "model_bytes": size,
        "float_model_bytes": float_bytes,
        "latency_ms": lat,
        "speedup": speedup,
        "latency_note": (f"median of {s.latency_runs} interleaved rounds after a warm-up, batch of the graph, one process, "
                         f"{providers[0]}" + ("" if on_target else " (not the target's own provider)")),
        "search": {"evaluations": sum(len(t) for t in run.traces.values()), "seconds": run.search_s,
                   "trace": run.traces["search"],
                   **({"corrected_trace": run.traces["corrected search"]} if "corrected search" in run.traces
                      else {})},
        "builds": [b.record(metric) for b in builder.builds],
        "rebuilds": sum(1 for b in builder.builds[1:] if not b.reason.startswith(("latency", "float"))),
        "eval_images": run.evals.count,
        "settings": settings,
    }


def _wide_record(run: _Run, builder: Builder, shipped: Build) -> dict:
    """eval.json's counts of a profile with 16-bit activations: W8A8 / W8A16 / float ops and
    weight shares (``int8_weight_share`` counts both 8-bit kinds)."""
    share = builder.share
    wide = list(shipped.wide)
    narrow = [o for o in shipped.ops if o not in set(wide)]
    floats = [o for o in run.rows if o not in set(shipped.ops)]
    return {"a16_ops": len(wide), "a16_op_share": len(wide) / len(run.rows), "a16_weight_share": share(wide),
            "a8_ops": len(narrow), "a8_weight_share": share(narrow), "float_ops": len(floats),
            "float_weight_share": share(floats), "activation_wide": run.eng.settings.activation_wide,
            "precisions": {"a16": wide, "float": floats}}


def _unreachable(run: _Run, eval_record: dict) -> None:
    """An unreachable target: an error with ``fail_if_unreachable`` (nothing written), else a warning."""
    s = run.settings
    msg = (f"profile target {s.metric} {eval_record['target']['direction']} {s.value} is unreachable with any "
           f"INT8 op ({run.variant}): the profile keeps every op in float and its model.onnx is the float model")
    if s.fail_if_unreachable:
        raise VlsensError(f"{msg}. fail_if_unreachable is set, so nothing was written; loosen the target "
                          "or unset fail_if_unreachable to accept an all-float profile.")
    log.warning("%s (set fail_if_unreachable: true to make this an error)", msg)


def _profile_yaml(run: _Run, eval_record: dict, builder: Builder, chosen: list[str], shipped: Build,
                  accuracy_choice: Build) -> dict:
    """``profile.yaml``: the target, the status and every op's precision and why."""
    s = run.settings
    profile = {
        "target": eval_record["target"],
        "quant_target": eval_record["quant_target"]["name"],
        "objective": s.objective,
        "status": eval_record["status"],
        "measured": shipped.measured,
        "ops": {},
    }
    if run.eng.wide:
        whys = explain_wide(run.rows, run.ranking, shipped.ops, shipped.wide, run.traces["search"], shipped.measured,
                            s.metric, s.value, eval_record["target"]["direction"])
        profile["activations"] = {"a8": run.eng.settings.activation_type, "a16": run.eng.settings.activation_wide}
    else:
        whys = explain(run.rows, run.ranking, chosen, run.traces, builder.builds, shipped, accuracy_choice, s.metric,
                       s.value)
    chosen_set, wide_set = set(shipped.ops), set(shipped.wide)
    float_name = "fp16" if run.variant.startswith("fp16") else "fp32"
    for n in run.by_sensitivity:
        r = run.rows[n]
        profile["ops"][n] = {"precision": precision_of(n, chosen_set, wide_set, float_name),
                             "op_type": r["op_type"], "block": r["block"], "role": r["role"], "why": whys[n]}
    return profile


def _publish(run: _Run, tmp: Path, shipped: Build, profile: dict, eval_record: dict) -> None:
    """Step 5: the shipped model moved into ``tmp``, the profile's files written there and published
    into the output folder (``model.onnx`` last)."""
    rows, out_dir = run.rows, run.out_dir
    excluded = [n for n in run.by_sensitivity if n not in set(shipped.ops)]
    f = {k: tmp / v for k, v in PROFILE_FILES.items()}
    staged_model = tmp / "model.onnx"
    model = shipped.model
    for src in (data_path(model), model):  # the data file keeps its name: the model still finds it
        os.replace(src, tmp / src.name)
    write_yaml(f["profile"], profile)
    write_json(f["exclude"], {"nodes_to_exclude": excluded})
    write_json(f["inc"], inc_op_name_dict(excluded, {n: rows[n]["op_type"] for n in rows}))
    eval_record["files"] = file_entries([staged_model])
    write_json(f["eval"], eval_record)
    publish({out_dir / v: f[k] for k, v in PROFILE_FILES.items()}, last=out_dir / PROFILE_FILES["model"])


def build_profile(engine_dir: str | Path, ranking_csv: str | Path, eval_npz: str | Path,
                  base_models: dict[str, str | Path], out_dir: str | Path, settings: ProfileSettings,
                  variant: str = "fp32") -> dict:
    """The profile of the module's steps 1-5 into ``out_dir`` (staged; ``model.onnx`` last);
    ``base_models``: the float models timed beside it (``{"fp32": ..., "fp16": ...}``). Returns
    ``eval.json``'s record."""
    if settings.objective not in OBJECTIVES:
        raise VlsensError(f"profile.objective: '{settings.objective}' (valid: {', '.join(OBJECTIVES)})")
    run = _Run(engine_dir, ranking_csv, eval_npz, base_models, Path(out_dir), settings, variant)
    chosen = run.search(settings.value, "search")
    with staging_dir(run.out_dir / "model.onnx") as tmp:
        builder = Builder(run.eng, run.evals, tmp / "builds", run.weights, settings.metric, settings.value,
                          settings.threads, settings.latency_runs)
        gap = _build_choice(run, builder, chosen)
        status, shipped, accuracy_choice = _ship(run, builder, chosen)
        lat = builder.compare(shipped, run.base_models)
        builder.discard_except(shipped)
        eval_record = _eval_record(run, builder, chosen, status, shipped, gap, lat)
        if status == "unreachable":
            _unreachable(run, eval_record)
        profile = _profile_yaml(run, eval_record, builder, chosen, shipped, accuracy_choice)
        _publish(run, tmp, shipped, profile, eval_record)
    return eval_record


def _fmt(x) -> str:
    return f"{float(x):.6g}"


def explain(rows: dict, ranking: list[str], chosen: list[str], traces: dict, builds: list[Build], shipped: Build,
            accuracy_choice: Build, metric: str, value: float) -> dict[str, str]:
    """What was measured for every op, in one sentence each (``profile.yaml``'s ``why``)."""
    n = len(rows)
    sign = ">=" if HIGHER_IS_BETTER[metric] else "<="
    tried: dict[str, dict] = {}
    for t in traces["search"]:
        if t["step"].startswith("add "):
            tried[t["step"][4:]] = t
    chosen_set, shipped_set = set(chosen), set(shipped.ops)
    repairs = [b for b in builds if b.reason.startswith("repair")]
    out = {}
    for name in ranking:
        r = rows[name]
        head = f"rank {r['rank']}/{n} (MSE {float(r['mse']):.3g} alone)"
        if name in shipped_set:
            out[name] = (f"{head}; INT8 in the shipped model, which measured {metric} {_fmt(shipped.measured[metric])} "
                         f"{sign} {value:g} ({shipped.session} session)")
        elif name not in chosen_set:
            t = tried.get(name)
            if t is not None:
                out[name] = (f"{head}; the search: with it INT8 the set's estimate was {metric} {_fmt(t[metric])}, "
                             f"which misses {sign} {value:g}")
            else:
                out[name] = f"{head}; not tried: the search stopped at profile.max_evals"
        elif name in set(accuracy_choice.ops):  # met as INT8, left float for speed
            out[name] = (f"{head}; INT8 met the target (built model {metric} {_fmt(accuracy_choice.measured[metric])}, "
                         f"{accuracy_choice.latency_ms:.3g} ms) but the shipped candidate without it is faster "
                         f"({shipped.latency_ms:.3g} ms)")
        else:  # chosen by the search, back to float after the built model missed
            ok = [b for b in repairs if b.meets and name not in set(b.ops)]
            bad = [b for b in builds if not b.meets and name in set(b.ops)]
            if ok and bad:  # the two builds closest to the boundary the repair found
                ok_b = min(ok, key=lambda b: b.extra.get("dropped", 0))
                bad_b = max(bad, key=lambda b: b.extra.get("dropped") or 0)
                out[name] = (f"{head}; chosen by the search, back to float after building: with the "
                             f"{bad_b.extra.get('dropped') or 0} most sensitive chosen ops in float (it INT8) the built "
                             f"model measured {metric} {_fmt(bad_b.measured[metric])}, which misses; with the "
                             f"{ok_b.extra.get('dropped')} most sensitive (it among them) {_fmt(ok_b.measured[metric])}")
            elif bad:
                out[name] = (f"{head}; chosen by the first search, whose built model measured {metric} "
                             f"{_fmt(bad[0].measured[metric])} (misses); the search for the shifted target left it in float")
            else:
                out[name] = f"{head}; chosen by the search, in float in the shipped build ({shipped.reason})"
    return out
