#!/usr/bin/env python
"""The W8A16 engine at real widths, on prepared engine folders (``sensitivity_prepare`` for
``quant.target: npu``): for a sample of ops spread over the tower, each op alone at W8A8 and at
W8A16 in the same session (the seconds of each pass and their ratio), and the all-W8A8 and
all-W8A16 models, per engine (fp32 and fp32-smooth side by side).

    python bench/bench_npu_engine.py results/3b/sensitivity/vision/448x448/{fp32,fp32-smooth}/engine \\
        --eval results/3b/calib/vision/448x448/eval.npz --ops 12 [--publish]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def measure(engine_dir: Path, eval_npz: Path, n_ops: int, threads: int) -> dict:
    from vlsens.sensitivity.engine import Engine

    eng = Engine(engine_dir)
    if not eng.wide:
        sys.exit(f"{engine_dir}: not an engine with 16-bit activations (quant.target npu / qnn)")
    ops = [o for o in eng.ops]
    step = max(1, len(ops) // n_ops)
    sample = ops[::step][:n_ops]
    ref = eng.reference()
    t0 = time.perf_counter()
    with __import__("tempfile").TemporaryDirectory(dir=engine_dir.parent) as scratch:
        session = eng.session(eval_npz, threads, cache_dir=scratch)
        setup = time.perf_counter() - t0
        session.evaluate((), ref)  # warm-up
        rows = []
        for op in sample:
            t = time.perf_counter()
            a8 = session.evaluate([op.name], ref)
            t8 = time.perf_counter() - t
            t = time.perf_counter()
            a16 = session.evaluate([op.name], ref, [op.name])
            t16 = time.perf_counter() - t
            rows.append({"op": op.name, "role": op.role, "a8": a8["cosine"], "a16": a16["cosine"], "t8": t8, "t16": t16})
        names = [o.name for o in ops]
        whole = {"all_a8": session.evaluate(names, ref)["cosine"], "all_a16": session.evaluate(names, ref, names)["cosine"]}
    return {"rows": rows, "setup": setup, "ops": len(ops), **whole, "images": eng.samples(eval_npz).count}


def main(engines: list[Path], eval_npz: Path, n_ops: int, threads: int) -> None:
    results = {e: measure(e, eval_npz, n_ops, threads) for e in engines}
    for e, r in results.items():
        name = e.parent.name
        print(f"\n{e} ({r['ops']} ops, {r['images']} evaluation image(s); suffix cache filled in {r['setup']:.0f} s)\n")
        print("| op | role | cosine W8A8 alone | cosine W8A16 alone | s W8A8 | s W8A16 | W8A16 / W8A8 |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for x in r["rows"]:
            print(f"| {x['op']} | {x['role']} | {x['a8']:.7f} | {x['a16']:.7f} | {x['t8']:.2f} | {x['t16']:.2f} | "
                  f"{x['t16'] / x['t8']:.2f}x |")
        ratios = [x["t16"] / x["t8"] for x in r["rows"]]
        total8, total16 = sum(x["t8"] for x in r["rows"]), sum(x["t16"] for x in r["rows"])
        print(f"\n{name}: the W8A16 pass over these ops {total16:.1f} s against {total8:.1f} s at W8A8 "
              f"({total16 / total8:.2f}x; per op median {statistics.median(ratios):.2f}x, "
              f"{min(ratios):.2f}x .. {max(ratios):.2f}x). Every op at W8A8: cosine {r['all_a8']:.6f}; "
              f"every op at W8A16: {r['all_a16']:.6f}.")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path, nargs="+", help="prepared engine folders (sensitivity/<graph>/<variant>/engine)")
    ap.add_argument("--eval", type=Path, required=True, help="the graph's calib/<graph>/eval.npz")
    ap.add_argument("--ops", type=int, default=12, help="ops sampled evenly over the tower (default 12)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default=None, help="docs/benchmarks/<name>.md (default npu-engine-<model>)")
    ap.add_argument("--publish", action="store_true", help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _publish import published

    model = a.engines[0].resolve().parents[4].name
    with published(a.name or f"npu-engine-{model}", "The W8A16 engine at real widths"):
        main(a.engines, a.eval, a.ops, a.threads)
