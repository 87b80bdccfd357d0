#!/usr/bin/env python
"""The decoder MatMuls' estimate against their measure, on a finished run whose plan measured
every MatMul (``plan.decoder_measured: all``, e.g. ``make run CONFIG=config/deep.yaml``): engine
nbits on the run's own engine (``budget/nbits-engine/``) and evaluation set (the measure's cases,
``budget/decoder.npz``) with only ``m`` MatMuls measured and the rest priced by their output
error (:func:`vlsens.sensitivity.nbits.sensitivity` with ``measured=m``), beside the run's full
table (``budget/nbits.csv``). With ``--price-cases``, each ``m`` is also run with every op alone
priced on that many of the measure's cases (stratified by modality,
:func:`vlsens.deploy.cases.pricing_cases`), the output errors taken on the same cases, and
published as ``decoder-estimate-<results>-cases``; ``--max-evals`` other than 20 adds ``-evals<E>``.

It prints, per ``m``: how the estimated table ranks every MatMul against the measure (Spearman's
rho at INT4 and INT8, over all MatMuls and over the estimated ones), measure / estimate per
estimated MatMul (spread, over those whose measure is above the table's noise: the largest
negative measure), the fit (depth term taken or not), the scoring's time against the full
table's, and the decoder's curve: at each of the search's byte budgets the assignment the search
finds from either table (the same engine, the same number of measured assignments), its KL
measured on the engine, and the ratio.

    python bench/bench_decoder_estimate.py --results results/deep [--measured 24 36 72] [--price-cases 3 6 12]
        [--max-evals 20] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))


def estimated(results: Path, m: int, threads: int, price: int | None = None) -> tuple[list[dict], dict, float]:
    """The table with ``m`` MatMuls measured (rows, summary, seconds), priced on ``price`` of the
    measure's cases (None: all)."""
    import pandas as pd

    from vlsens.deploy.cases import load_cases, pricing_cases
    from vlsens.sensitivity import nbits as nb

    on = None
    if price is not None:
        on = pricing_cases(load_cases(results / "measure" / "cases"), price)

    with tempfile.TemporaryDirectory(prefix="vlsens-decoder-estimate-") as work:
        t0 = time.perf_counter()
        summary = nb.sensitivity(results / "budget" / "nbits-engine", results / "budget" / "decoder.npz",
                                 Path(work) / "nbits.csv", Path(work) / "nbits.json", threads, measured=m,
                                 price_on=on)
        seconds = time.perf_counter() - t0
        rows = pd.read_csv(Path(work) / "nbits.csv").to_dict("records")
    return rows, summary, seconds


def curves(results: Path, tables: dict[str, list[dict]], max_evals: int, threads: int) -> dict[str, list[dict]]:
    """Per table, the decoder's curve the search finds from it at the run's budgets, every point
    measured on the engine (:func:`vlsens.budget.front.decoder_curve`)."""
    from vlsens.budget.front import Measured, assignment_bytes, budgets_between, decoder_curve, shipped_rows
    from vlsens.sensitivity import nbits as nb

    eng_dir = nb.Prepared(results / "budget" / "nbits-engine")
    eng, ref = eng_dir.session(results / "budget" / "decoder.npz", threads), eng_dir.reference()
    measure = Measured(lambda a: nb.error(eng.evaluate(a, ref), True))
    out = {}
    for name, rows in tables.items():
        rows = shipped_rows(eng_dir, rows)
        low = assignment_bytes(rows, {r["op"]: 4 for r in rows})
        out[name] = decoder_curve(measure, rows, budgets_between(low, assignment_bytes(rows, {})), max_evals)
    return out


def rho_cells(exact: dict, rows: list[dict], b: int) -> tuple[str, str]:
    from vlsens.core.metrics import spearman

    ops = [r["op"] for r in rows]
    est = [float(r[f"error_int{b}"]) for r in rows]
    ex = [float(exact[o][f"error_int{b}"]) for o in ops]
    rest = [(e, x) for r, e, x in zip(rows, est, ex, strict=True) if not r.get("measured", 1)]
    a = spearman(ex, est)
    r = spearman([x for _, x in rest], [e for e, _ in rest]) if len(rest) >= 3 else None
    return f"{a:.2f}", "" if r is None else f"{r:.2f}"


def report(results: Path, exact_rows: list[dict], exact_summary: dict, exact_seconds: float | None,
           runs: dict[str, tuple], curve: dict[str, list[dict]]) -> None:
    exact = {r["op"]: r for r in exact_rows}
    noise = max([0.0] + [-float(r[f"error_int{b}"]) for r in exact_rows for b in (4, 8)])
    n = len(exact_rows)
    print(f"{results}: {n} decoder MatMuls, evaluation set {exact_summary.get('setup_seconds', 0):.1f} s to set up; "
          f"the full table measured every MatMul at INT4 and INT8 "
          f"({exact_summary['seconds_per_op']:.3f} s per MatMul, {exact_summary['seconds_per_op'] * n:.1f} s of scoring"
          + (f"; the job {exact_seconds:.0f} s" if exact_seconds else "") + f"). Noise: {noise:.3g} (largest negative KL).\n")
    print("| table | priced on: cases (positions) | rho INT4, all / estimated | rho INT8, all / estimated | measure / "
          "estimate INT4, estimated (min, median, max) | depth term | scoring s (with the output errors) |")
    print("| --- | --- | --- | --- | --- | --- | ---: |")
    for name, (rows, summary, seconds) in runs.items():
        ratios = [float(exact[r["op"]]["error_int4"]) / float(r["error_int4"]) for r in rows
                  if not r.get("measured", 1) and float(exact[r["op"]]["error_int4"]) > noise and float(r["error_int4"]) > 0]
        spread = f"{min(ratios):.2f}, {np.median(ratios):.2f}, {max(ratios):.2f} ({len(ratios)})" if ratios else "-"
        r4, r8 = rho_cells(exact, rows, 4), rho_cells(exact, rows, 8)
        dcell = "-"
        if summary.get("estimate"):
            depth = summary["estimate"]["widths"]["4"]["depth"]
            rms = depth["held_out_rms_log"]
            dcell = ("taken" if depth["used"] else "not taken") + (
                f" (held out {rms['role']:.2f} / {rms['role+depth']:.2f})" if rms["role"] is not None else "")
        on = summary.get("priced_on")
        where = "every case" if on is None else f"{len(on['cases'])} of {on['of']} ({on['positions']} of {on['positions_of']})"
        print(f"| {name} | {where} | {r4[0]} / {r4[1]} | {r8[0]} / {r8[1]} | {spread} | {dcell} | {seconds:.1f} |")
    print()
    names = list(curve)
    print("Decoder curve: at each budget the search's assignment from each table, measured on the engine "
          "(KL per token); ratio = estimated table's / full table's.\n")
    print("| budget bytes | " + " | ".join(f"{k}: KL (bytes)" for k in names) + " | " +
          " | ".join(f"{k} / full" for k in names[1:]) + " |")
    print("| ---: |" + " --- |" * len(names) + " ---: |" * (len(names) - 1))
    ratios: dict[str, list[float]] = {k: [] for k in names[1:]}
    for i, p in enumerate(curve[names[0]]):
        cells = [f"{curve[k][i]['kl']:.3g} ({curve[k][i]['bytes']})" for k in names]
        rs = []
        for k in names[1:]:
            r = curve[k][i]["kl"] / p["kl"] if p["kl"] > 0 else float("nan")
            ratios[k].append(r)
            rs.append(f"{r:.2f}")
        print(f"| {p['budget']} | " + " | ".join(cells) + " | " + " | ".join(rs) + " |")
    print()
    for k, rs in ratios.items():
        inner = [r for r in rs[1:-1] if np.isfinite(r)]
        if inner:
            print(f"{k}: between the ends, KL / the full table's at the same budget: geometric mean "
                  f"{float(np.exp(np.mean(np.log(inner)))):.2f}, range {min(inner):.2f} .. {max(inner):.2f} "
                  f"({len(inner)} budgets).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/deep"))
    ap.add_argument("--measured", type=int, nargs="+", default=[24, 36, 72])
    ap.add_argument("--price-cases", type=int, nargs="*", default=[],
                    help="also price each table's measured MatMuls on that many of the measure's cases")
    ap.add_argument("--max-evals", type=int, default=20, help="measured assignments per budget in each search")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    import pandas as pd
    from _publish import published

    exact_rows = pd.read_csv(args.results / "budget" / "nbits.csv").to_dict("records")
    exact_summary = json.loads((args.results / "budget" / "nbits.json").read_text())
    if "estimate" in exact_summary:
        raise SystemExit(f"{args.results}: its table was estimated (plan.decoder_measured); this needs a full one")
    bench = args.results / "benchmarks" / "budget_nbits.tsv"
    exact_seconds = float(bench.read_text().splitlines()[1].split("\t")[0]) if bench.is_file() else None
    n = len(exact_rows)
    runs = {}
    for m in args.measured:
        for price in [None, *args.price_cases]:
            label = ("every MatMul" if m >= n else f"{m} measured") + ("" if price is None else f", {price} cases")
            if m < n or price is not None:  # the full table is the run's own
                runs[label] = estimated(args.results, m, args.threads, price)
    tables = {"full": exact_rows, **{k: rows for k, (rows, _, _) in runs.items()}}
    curve = curves(args.results, tables, args.max_evals, args.threads)
    evals = "" if args.max_evals == 20 else f"-evals{args.max_evals}"
    with published(f"decoder-estimate-{args.results.name}" + ("-cases" if args.price_cases else "") + evals,
                   f"The decoder MatMuls' estimate of {args.results}" + (
                       ", priced on subsets of the cases" if args.price_cases else "") + (
                       f", {args.max_evals} measured assignments per budget" if evals else ""),
                   results=args.results):
        report(args.results, exact_rows, exact_summary, exact_seconds, runs, curve)


if __name__ == "__main__":
    main()
