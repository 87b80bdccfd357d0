#!/usr/bin/env python
"""Engine nbits at a decoder's full depth, on the measure's cases: what a price and a forward cost.

The whole-VLM plan's largest projected term is the engine's prices (``plan.decoder_measured``
MatMuls, each alone at INT4 and at INT8 over the measure's positions), then the search's
measured assignments (whole forwards). Their cost at 36 layers was projected from a fit on short
prompts (5 s + 87 ms a position). This bench prepares the engine as ``budget_nbits`` does on a
finished run's fp32 folder and measure (default ``make scale-int4``'s ``results/3b-full``; RTN,
the run's block size, lm_head at the read positions only), then times on the suffix engine a
whole float forward, a whole all-INT4 forward, and the price (INT4 and INT8) of MatMuls spread
over the depth -- a price starts at the MatMul's segment, so an early MatMul costs more than a
late one -- and prints them with the engine's preparation and peak memory.

    python bench/bench_engine_depth.py [--results results/3b-full] [--ops 6] [--publish]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from bench_decoder_errors import peak_gb, timed  # noqa: E402
from bench_read_rows import feeds  # noqa: E402


def spread(ops: list[str], count: int) -> list[str]:
    """``count`` of ``ops`` (graph order) evenly spaced from the first to the last."""
    if count >= len(ops):
        return list(ops)
    return [ops[round(i * (len(ops) - 1) / (count - 1))] for i in range(count)] if count > 1 else [ops[0]]


def run(results: Path, work: Path, count: int, threads: int, block_size: int) -> dict:
    from vlsens.quantize.nbits import NBitsSettings
    from vlsens.sensitivity import nbits as nb

    facts = feeds(results, work)
    model, evaluation = results / "deploy" / "fp32" / "decoder.onnx", work / "feeds.npz"
    settings = NBitsSettings(algorithm="rtn", block_size=block_size, symmetric=True, accuracy_level=4)
    _, t_prepare = timed(lambda: nb.prepare(model, evaluation, work / "engine", settings, threads, logits=True))
    eng_dir = nb.Prepared(work / "engine")
    (work / "cache").mkdir()
    eng, t_session = timed(lambda: eng_dir.session(evaluation, threads, cache_dir=work / "cache"))
    ref = eng_dir.reference()
    _, t_cached = timed(lambda: eng.evaluate({}, ref))  # no MatMul changed: the suffix cache's float pass
    m4, t_int4 = timed(lambda: eng.evaluate(dict.fromkeys(eng_dir.ops, 4), ref))
    prices = []
    for op in spread(list(eng_dir.ops), count):
        (k4, s4), (k8, s8) = (timed(lambda b=b, op=op: eng.evaluate({op: b}, ref)) for b in (4, 8))
        prices.append({"op": op, "int4_s": s4, "int8_s": s8, "kl_int4": k4.get("kl"), "kl_int8": k8.get("kl")})
    eng = None  # the suffix engine and its cached float pass freed before the switch model is loaded again
    plain = eng_dir.session(evaluation, threads)  # the switch model whole, no suffix cache: a real float forward
    _, t_float = timed(lambda: plain.evaluate({}, ref))
    return {"facts": facts, "ops": len(eng_dir.ops), "prepare": t_prepare, "session": t_session, "cached": t_cached,
            "float": t_float, "int4": t_int4, "kl_all_int4": m4.get("kl"), "prices": prices, "peak": peak_gb()}


def report(results: Path, r: dict, threads: int, block_size: int) -> None:
    f = r["facts"]
    positions = sum(c["sequence"] for c in f["per_case"])
    print(f"{results}: the measure's {f['cases']} cases, {positions} positions ({f['positions']} read); "
          f"{r['ops']} MatMuls; RTN in blocks of {block_size}; {threads} threads; suffix engine.\n")
    print("| step | seconds |")
    print("| --- | ---: |")
    print(f"| prepare (float, all-INT4 and all-INT8 models, switch model, reference) | {r['prepare']:.0f} |")
    print(f"| session and suffix cache (one float pass) | {r['session']:.0f} |")
    print(f"| all float on the suffix engine (no MatMul changed: its cached float pass, nothing recomputed) | "
          f"{r['cached']:.1f} |")
    print(f"| whole forward, all INT4 (from the first segment; KL {r['kl_all_int4']:.4g}) | {r['int4']:.1f} |")
    print(f"| whole forward, all float (the switch model without the suffix cache) | {r['float']:.1f} |")
    print(f"\nPeak {r['peak']:.1f} GB (memory-mapped weight files counted).\n")
    print("| MatMul alone | INT4 s | INT8 s | price s | KL INT4 | KL INT8 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for p in r["prices"]:
        print(f"| {p['op']} | {p['int4_s']:.1f} | {p['int8_s']:.1f} | {p['int4_s'] + p['int8_s']:.1f} | "
              f"{p['kl_int4']:.3g} | {p['kl_int8']:.3g} |")
    mean = sum(p["int4_s"] + p["int8_s"] for p in r["prices"]) / len(r["prices"])
    top = max(p["int4_s"] + p["int8_s"] for p in r["prices"])
    print(f"\nMean price {mean:.1f} s ({1000 * mean / positions:.1f} ms a position), "
          f"{mean / r['float']:.2f}x a float forward: {24 * mean / 3600:.2f} h for 24 MatMuls, "
          f"{36 * mean / 3600:.2f} h for 36 (at the costliest price here, {top:.1f} s: {24 * top / 3600:.2f} h for 24). "
          f"Float forward {1000 * r['float'] / positions:.1f} ms a position; "
          f"all-INT4 {r['int4'] / r['float']:.2f}x float.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/3b-full"))
    ap.add_argument("--ops", type=int, default=6, help="MatMuls priced, spread over the depth")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    from _publish import published

    with tempfile.TemporaryDirectory(prefix="vlsens-engine-depth-", dir=args.results) as work:
        r = run(args.results, Path(work), args.ops, args.threads, args.block_size)
    with published(f"engine-depth-{args.results.name}", "Engine nbits at full depth on the measure's cases",
                   results=args.results):
        report(args.results, r, args.threads, args.block_size)


if __name__ == "__main__":
    main()
