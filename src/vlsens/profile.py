"""Stage: a mixed-precision profile that is built and verified.

1. Search with the engine's switch model (any set of INT8 ops costs one pass over the evaluation
   set): the longest prefix of the ranking (least sensitive first) that meets the target, by
   bisection, then a greedy pass over the remaining ops in rank order, each kept only if the
   combined model still meets the target (interactions are re-measured, not assumed).
2. Build the real model: ``quantize_static`` with exactly the chosen ops and the engine's
   calibration cache, and measure it with a normal ONNX Runtime session (default graph
   optimizations, INT8 kernels where ORT fuses them). If it misses the target, the most
   sensitive INT8 op goes back to float and the model is rebuilt, until it meets the target.
3. Write ``profile.yaml``, ``nodes_to_exclude.json`` (for ``quantize_static``),
   ``inc_op_name_dict.json`` (Intel Neural Compressor's ``op_name_dict``), the model and
   ``eval.json``. A target that no INT8 op can meet is reported as ``status: unreachable``.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence


from vlsens.artifacts import file_entries, verify
from vlsens.errors import VlsensError
from vlsens.fsutil import publish, staging_dir, write_json, write_yaml
from vlsens.metrics import Metrics
from vlsens.onnxutil import copy_model, data_path, make_session
from vlsens.paths import PROFILE_FILES
from vlsens.quant import quantize, quantized_ops
from vlsens.sensitivity.engine import Engine, is_logits
from vlsens.sensitivity.ranking import read_csv

log = logging.getLogger(__name__)

#: Profile metrics; ``kl`` and ``top1`` exist for text graphs (logits) only.
HIGHER_IS_BETTER = {"cosine": True, "sqnr_db": True, "mse": False, "kl": False, "top1": True}


def meets(metrics: dict, metric: str, value: float) -> bool:
    m = metrics[metric]
    return m >= value if HIGHER_IS_BETTER[metric] else m <= value


def search(ranking: Sequence[str], evaluate: Callable[[list[str]], dict], metric: str, value: float,
           max_evals: int = 200, weights: dict[str, int] | None = None) -> tuple[list[str], list[dict]]:
    """Largest INT8 set found by prefix bisection + greedy refinement. Returns (set, trace); with
    ``weights`` (op -> weight parameters) each step also records its INT8 share of the weights."""
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


def inc_op_name_dict(excluded: Sequence[str], op_types: dict[str, str]) -> dict:
    """Intel Neural Compressor's ``op_name_dict`` keeping ``excluded`` in FP32. INC matches keys as
    regular expressions (``fullmatch``) against *its* node names, and it renames every Gemm to
    ``<name>_MatMul`` (+ ``<name>_Add``) before quantizing: keys are escaped names, with that
    suffix allowed for Gemms (tests/test_inc.py checks them against INC's real names)."""
    import re

    fp32 = {"activation": {"dtype": ["fp32"]}, "weight": {"dtype": ["fp32"]}}
    return {re.escape(n) + ("(_MatMul)?" if op_types.get(n) == "Gemm" else ""): fp32 for n in excluded}


def deployment_session(model: str | Path, threads: int = 0):
    """A normal session (default optimizations); FP16 Q/DQ graphs that ORT's fusions reject
    (fp16 scales in QLinear* kernels) fall back to basic optimizations. Returns (session, mode)."""
    try:
        return make_session(model, threads=threads), "default"
    except Exception as e:  # noqa: BLE001  (ORT raises its own Fail / InvalidGraph types)
        log.info("default session refused %s (%s); using basic optimizations (recorded in eval.json)", model, str(e)[:160])
        return make_session(model, threads=threads, basic=True), "basic (default optimizations refused the graph)"


def latency_ms(model: str | Path, feed: dict, runs: int = 10, threads: int = 0) -> float:
    sess, _ = deployment_session(model, threads)
    sess.run(None, feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def deployed_metrics(model: str | Path, float_session, samples, threads: int = 0) -> tuple[dict, str]:
    """Metrics of ``model`` (a :func:`deployment_session`) against the float model's deployed
    outputs, feed by feed (nothing accumulated but sums). Returns (metrics, session mode)."""
    sess, mode = deployment_session(model, threads)
    acc = Metrics(is_logits(sess))
    for feed, valid in zip(samples.feeds, samples.valid):
        acc.add(sess.run(None, feed)[0], float_session.run(None, feed)[0], valid)
    return acc.result(), mode


def _search(eng_dir: Engine, evals, ranking: list[str], metric: str, value: float, max_evals: int,
            threads: int, weights: dict[str, int]) -> tuple[list[str], list, bool, float]:
    """The search on the engine: (chosen ops, trace, graph has logits, seconds searching). Its
    session ends here, so the built model is measured with one session at a time."""
    engine = eng_dir.session(evals, threads)
    if metric in ("kl", "top1") and not engine.logits:
        raise VlsensError(f"profile.metric: '{metric}' needs a graph with logits (text); use cosine, sqnr_db or mse")
    reference = eng_dir.reference()
    t0 = time.perf_counter()
    chosen, trace = search(ranking, lambda ops: engine.evaluate(ops, reference), metric, value, max_evals, weights)
    return chosen, trace, engine.logits, time.perf_counter() - t0


def build_profile(engine_dir: str | Path, ranking_csv: str | Path, eval_npz: str | Path,
                  base_models: dict[str, str | Path], out_dir: str | Path, metric: str, value: float,
                  max_evals: int = 200, variant: str = "fp32", threads: int = 0,
                  fail_if_unreachable: bool = False) -> dict:
    eng_dir = Engine(engine_dir)
    base_models = {k: verify(p) for k, p in base_models.items()}
    rows = {r["op"]: r for r in read_csv(ranking_csv)}
    ranking = [r["op"] for r in sorted(rows.values(), key=lambda r: -int(r["rank"]))]  # least sensitive first
    evals = eng_dir.samples(eval_npz)
    weights = {n: int(r["weight_params"]) for n, r in rows.items()}
    chosen, trace, logits, search_s = _search(eng_dir, evals, ranking, metric, value, max_evals, threads, weights)

    out_dir = Path(out_dir)
    float_session, _ = deployment_session(eng_dir.float_model, threads)
    by_sensitivity = sorted(chosen, key=lambda n: int(rows[n]["rank"]))  # most sensitive first
    rebuilds = []
    with staging_dir(out_dir / "model.onnx") as tmp:
        while True:
            if chosen:
                model = quantize(eng_dir.float_model, tmp / "model.onnx", chosen, eng_dir.settings, eng_dir.cache)
            else:  # quantize_static reads nodes_to_quantize=[] as "every op": the float model it is
                model = copy_model(eng_dir.float_model, tmp / "model.onnx")
            built = quantized_ops(model, list(rows))
            if built != set(chosen):
                raise VlsensError(
                    f"profile: the built model quantizes {len(built)} op(s) but the profile chose {len(chosen)} "
                    f"(only built: {sorted(built - set(chosen))[:5]}, only chosen: {sorted(set(chosen) - built)[:5]}); "
                    "nothing was written.")
            measured, mode = deployed_metrics(model, float_session, evals, threads)
            rebuilds.append({"int8_ops": len(chosen), **measured, "session": mode})
            if meets(measured, metric, value) or not chosen:
                break
            drop = by_sensitivity.pop(0)
            chosen.remove(drop)
            log.info("built model misses the target (%s); %s back to float", measured, drop)
        status = "met" if chosen else "unreachable"
        excluded = [n for n in ranking[::-1] if n not in set(chosen)]
        feed = evals.feeds[0]
        weights_total = sum(int(rows[n]["weight_params"]) for n in rows)
        weights_int8 = sum(int(rows[n]["weight_params"]) for n in chosen)
        size = model.stat().st_size + data_path(model).stat().st_size
        eval_record = {
            "variant": variant,
            "status": status,
            "target": {"metric": metric, "value": value,
                       "direction": ">=" if HIGHER_IS_BETTER[metric] else "<="},
            "measured": measured,
            "meets_target": meets(measured, metric, value),
            "measured_against": "the float base model, ONNX Runtime, evaluation set"
                                + (" (real tokens only)" if logits else ""),
            "session": mode,
            "int8_ops": len(chosen),
            "quantizable_ops": len(rows),
            "int8_op_share": len(chosen) / len(rows),
            "int8_weight_share": weights_int8 / weights_total if weights_total else 0.0,
            "model_bytes": size,
            "latency_ms": {
                "int8_mixed": latency_ms(model, feed, threads=threads),
                **{k: latency_ms(p, feed, threads=threads) for k, p in base_models.items()},
            },
            "latency_note": "median of 10 runs, batch of the graph, ONNX Runtime CPU (or CUDA when present)",
            "search": {"evaluations": len(trace), "seconds": search_s, "trace": trace},
            "rebuilds": rebuilds,
            "eval_images": evals.count,
            "settings": eng_dir.meta["settings"],
        }
        if status == "unreachable":
            msg = (f"profile target {metric} {eval_record['target']['direction']} {value} is unreachable with any "
                   f"INT8 op ({variant}): the profile keeps every op in float and its model.onnx is the float model")
            if fail_if_unreachable:
                raise VlsensError(f"{msg}. fail_if_unreachable is set, so nothing was written; loosen the target "
                                  "or unset fail_if_unreachable to accept an all-float profile.")
            log.warning("%s (set fail_if_unreachable: true to make this an error)", msg)
        chosen_set = set(chosen)
        profile = {
            "target": eval_record["target"],
            "status": status,
            "measured": measured,
            "ops": {},
        }
        for n in ranking[::-1]:
            r = rows[n]
            why = (f"rank {r['rank']}/{len(rows)} (MSE {float(r['mse']):.3g} alone); the combined model meets the target"
                   if n in chosen_set else
                   f"rank {r['rank']}/{len(rows)} (MSE {float(r['mse']):.3g} alone); INT8 here breaks the target")
            profile["ops"][n] = {"precision": "int8" if n in chosen_set else ("fp16" if variant.startswith("fp16") else "fp32"),
                                 "op_type": r["op_type"], "block": r["block"], "role": r["role"], "why": why}
        f = {k: tmp / v for k, v in PROFILE_FILES.items()}
        write_yaml(f["profile"], profile)
        write_json(f["exclude"], {"nodes_to_exclude": excluded})
        write_json(f["inc"], inc_op_name_dict(excluded, {n: rows[n]["op_type"] for n in rows}))
        eval_record["files"] = file_entries([model])
        write_json(f["eval"], eval_record)
        publish({out_dir / v: f[k] for k, v in PROFILE_FILES.items()}, last=out_dir / PROFILE_FILES["model"])
    return eval_record
