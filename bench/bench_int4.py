#!/usr/bin/env python
"""The int4 deploy folders of a finished run side by side (the run's ``deploy/int4.json``, written
by rule ``deploy_int4``), with the int4-mixed profile's comparison with llama.cpp's heuristic at
the heuristic's own weight bytes (engine nbits' arithmetic, from the profile's parity record).

    python bench/bench_int4.py --results results/tiny [--exhaustive]

``--exhaustive`` measures every INT4/INT8 assignment that fits the heuristic's weight bytes in
the engine's switch session (feasible where the decoder has few MatMuls: 12 208 assignments,
about two minutes, on the tiny preset's 15) and prints the best: the lowest KL any per-MatMul
choice of the two widths reaches at that size, the bound for the 0.5x goal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/tiny", help="results/<model> of a finished run")
    ap.add_argument("--exhaustive", action="store_true",
                    help="measure every INT4/INT8 assignment within the heuristic's bytes (small decoders)")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    from vlsens.deploy.compare import markdown

    root = Path(a.results)
    table = json.loads((root / "deploy" / "int4.json").read_text())
    print("Deploy folders through onnxruntime-genai (KL and top-1 against the fp32 folder, teacher-forced on its "
          "greedy tokens; tok/s over the evaluation cases):\n")
    print(markdown(table))
    rec = root / "profile" / "decoder" / "fp32-nbits" / "parity.json"
    if rec.is_file():
        g = json.loads(rec.read_text())["extra"]["graphs"]["model.onnx"]
        s = g["search"]
        print(f"int4-mixed profile: {s['ops']['int4']} INT4, {s['ops']['int8']} INT8, {s['ops']['float']} float "
              f"MatMuls; KL {s['built']['kl']:.3g} per token on the evaluation set (target {s['target']:g}); "
              f"weights {g['weight_bytes']} bytes.")
        h = s.get("at_heuristic_bytes")
        if h:
            print(f"\nAt the heuristic's weight bytes ({h['other_weight_bytes']}), same arithmetic (engine nbits): "
                  f"k_quant_mixed KL {h['other_error']:.3g}, vlsens' assignment {h['vlsens_error']:.3g} "
                  f"({h['vlsens_weight_bytes']} bytes): {h['error_ratio']:.2f}x the heuristic's KL.")
            print(f"MatMuls above INT4, heuristic: {sorted(h['other_not_int4'])}")
            print(f"MatMuls above INT4, vlsens at those bytes: {sorted(h['vlsens_not_int4'])}")
            if a.exhaustive:
                exhaustive(root, h)


def exhaustive(root: Path, h: dict) -> None:
    import itertools
    import time

    import pandas as pd

    from vlsens.sensitivity import nbits as nb

    sens = root / "sensitivity" / "decoder" / "fp32"
    e = nb.Prepared(sens / "nbits-engine")
    eng, ref = e.session(root / "calib" / "decoder" / "eval.npz", threads=2), e.reference()
    rows = pd.read_csv(sens / "nbits.csv").to_dict("records")
    names = [r["op"] for r in rows]
    extra = {r["op"]: r["bytes_int8"] - r["bytes_int4"] for r in rows}
    room = h["other_weight_bytes"] - sum(r["bytes_int4"] for r in rows)
    if len(names) > 24:
        print(f"\n--exhaustive: {len(names)} MatMuls, too many assignments to measure; skipped.")
        return
    fits = [c for k in range(len(names) + 1) for c in itertools.combinations(names, k)
            if sum(extra[n] for n in c) <= room]
    t0 = time.perf_counter()
    best = min((nb.error(eng.evaluate({**dict.fromkeys(names, 4), **dict.fromkeys(c, 8)}, ref), True), c)
               for c in fits)
    print(f"\nEvery INT4/INT8 assignment within those bytes measured ({len(fits)}, {time.perf_counter() - t0:.0f} s): "
          f"the best has KL {best[0]:.3g}, {best[0] / h['other_error']:.2f}x the heuristic's, with "
          f"{sorted(best[1])} in INT8; vlsens' search found {h['error_ratio']:.2f}x.")


if __name__ == "__main__":
    from _publish import published

    results = sys.argv[sys.argv.index("--results") + 1] if "--results" in sys.argv else "results/tiny"
    with published(f"int4-{Path(results).name}", f"INT4 decoders of {results}"):
        main()
