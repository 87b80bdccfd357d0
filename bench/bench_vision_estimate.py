#!/usr/bin/env python
"""The vision Linears' estimate against their measure, on a finished run (``make run``): every
Linear's INT4 KL measured end to end (the run's own ``budget/vision.csv``, ``plan.vision_measured:
all``) beside the estimate of ``plan.vision_measured: m`` (only ``m`` Linears measured, the rest
from their INT4 output error, :func:`vlsens.budget.vision.output_errors`), and the mixed curve's
points measured whole in either order.

It prints, per ``m``: how the estimate ranks all Linears against their measure (Spearman's rho,
of the KLs that order the curve, measured where measured, and of the estimates alone; the share
of the measure's costliest quarter found in the curve's), the measure over the estimate per
Linear not measured and per measured Linear held out (spread), the curve's points (KL at k Linears
INT4, measured whole, in the measure's order and in the estimate's), and the job's time.

With ``--refit``, on a run that measured only some Linears (``plan.vision_measured: m``, the 3B
scale run), it fits the run's own stored measures again with either fit of the estimate (per role,
and per role with the depth term, :class:`vlsens.budget.vision.Fit`) and prints how each predicts
the measured Linears held out, and which one :func:`vlsens.budget.vision.choose_depth` takes.

With ``--reorder``, on such a run whose stored curve was measured in another fit's order, it runs
the ``budget_vision`` job again with the run's own number of measured Linears (the fit
:func:`vlsens.budget.vision.choose_depth` takes now) and prints the stored curve beside the new
one, point by point, with how many of the first ``k`` Linears the two orders share, and the
measured Linears' KLs of both runs side by side (the measure repeated).

    python bench/bench_vision_estimate.py --results results/tiny [--measured 4 8] [--publish]
    python bench/bench_vision_estimate.py --results results/3b --refit [--publish]
    python bench/bench_vision_estimate.py --results results/3b --reorder [--publish]
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


def job_inputs(results: Path) -> tuple[dict, dict]:
    """The ``budget_vision`` job's inputs and settings, read from the finished run in ``results``."""
    import yaml

    from vlsens.core import paths
    from vlsens.deploy import DECODER_GRAPH, vision_source

    model, root = results.name, results.parent.parent if results.parent.name == "results" else Path(".")
    at = {k: root / paths.fill(v, model=model) for k, v in {
        "fp32_folder": paths.fill(paths.DEPLOY, precision="fp32"),
        "decoder_model": f"{paths.fill(paths.VARIANT, graph=DECODER_GRAPH, variant='fp32')}/{paths.MAIN}",
        "reference": paths.MEASURE_REFERENCE, "cases": paths.MEASURE_CASES,
        **{f"vision_{f}": vision_source(f) for f in ("fp32", "int4", "int8-wo")}}.items()}
    missing = [str(p) for p in at.values() if not p.exists()]
    if missing:
        sys.exit(f"{results}: not a finished run with plan.vision mixed ({', '.join(missing[:3])} missing): make run")
    run = yaml.safe_load((results / "run.yaml").read_text()) if (results / "run.yaml").is_file() else None
    settings = (run or {}).get("deploy", {}).get("nbits")
    if settings is None:  # the default config's, as the run used it
        settings = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["deploy"]["nbits"]
    ckpt = results / "checkpoint"
    return {**{k: str(v) for k, v in at.items()}, "checkpoint": str(ckpt)}, settings


def spearman(a, b) -> float:
    ra, rb = (np.argsort(np.argsort(np.asarray(x, float))) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def run_estimate(inputs: dict, settings: dict, measured: int) -> dict:
    from vlsens.budget.build import vision_job

    with tempfile.TemporaryDirectory(prefix="bench-vision-estimate-") as work:
        out = {"csv": f"{work}/vision.csv", "summary": f"{work}/vision.json"}
        t = time.perf_counter()
        vision_job(inputs, out, settings, measured)
        seconds = time.perf_counter() - t
        import pandas as pd

        return {"rows": pd.read_csv(out["csv"]).to_dict("records"), "record": json.loads(Path(out["summary"]).read_text()),
                "seconds": seconds}


def report(results: Path, exact_rows: list[dict], exact_record: dict, exact_seconds: float | None,
           runs: dict[int, dict]) -> None:
    kl = {r["op"]: float(r["kl_int4"]) for r in exact_rows}
    n = len(kl)
    q = max(n // 4, 1)
    top = set(sorted(kl, key=lambda op: -kl[op])[:q])
    print(f"{results}: {n} vision Linears; the measure: each alone at INT4 in the fp32 folder, end to end "
          f"({exact_seconds:.0f} s for the job)" if exact_seconds else "")
    print()
    print("| Linears measured | estimated | rho: the curve's KLs | rho: estimates alone | costliest quarter found | "
          "measure / estimate, estimated Linears (min, median, max) | measure / held-out estimate, measured Linears "
          "(min, median, max) | depth term (held-out RMS log miss: role / role+depth) | job s |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- | --- | ---: |")
    for m, r in sorted(runs.items()):
        est = {x["op"]: float(x["kl_estimate"]) for x in r["rows"]}
        used = {x["op"]: float(x["kl_int4"]) for x in r["rows"]}  # measured where measured: what orders the curve
        ops = sorted(kl)
        rho = spearman([kl[o] for o in ops], [used[o] for o in ops])
        rho_est = spearman([kl[o] for o in ops], [est[o] for o in ops])
        found = len(top & set(sorted(used, key=lambda op: -used[op])[:q]))
        free = [kl[x["op"]] / est[x["op"]] for x in r["rows"] if not x["measured"] and est[x["op"]] > 0]
        mo = r["record"]["estimate"]["measured_over_estimate"]
        print(f"| {m} | {n - m} | {rho:.2f} | {rho_est:.2f} | {found} of {q} | {min(free):.2f}, {np.median(free):.2f}, "
              f"{max(free):.2f} | {mo['min']:.2f}, {mo['median']:.2f}, {mo['max']:.2f} | "
              f"{depth_cell(r['record']['estimate'].get('depth'))} | {r['seconds']:.0f} |")
    print()
    print("The curve's points, measured whole (KL at k Linears INT4, the rest INT8 weight-only; MB as the folder "
          "ships the vision graph):")
    print()
    head = " | ".join(f"order of m = {m}: KL (MB)" for m in sorted(runs))
    print(f"| k | order of the measure: KL (MB) | {head} |")
    print("| ---: | ---: |" + " ---: |" * len(runs))
    exact = {p["int4"]: p for p in exact_record["points"]}
    others = {m: {p["int4"]: p for p in r["record"]["points"]} for m, r in runs.items()}
    for k in sorted(exact):
        cells = " | ".join(f"{others[m][k]['kl']:.3g} ({others[m][k]['bytes'] / 1e6:.3f})" for m in sorted(runs))
        print(f"| {k} | {exact[k]['kl']:.3g} ({exact[k]['bytes'] / 1e6:.3f}) | {cells} |")


def depth_cell(depth: dict | None) -> str:
    if not depth:
        return "-"
    rms = depth["held_out_rms_log"]
    cells = " / ".join("-" if rms[k] is None else f"{rms[k]:.2f}" for k in ("role", "role+depth"))
    return (f"**used**, first block {depth['first_over_last']:.3g}x the last: {cells}" if depth["used"]
            else f"not used: {cells}")


def refit(results: Path) -> None:
    """Both fits of the estimate on the run's own measured Linears, each measured one held out."""
    import math

    import pandas as pd

    from vlsens.budget.vision import _points, block_count, choose_depth, held_out

    rows = pd.read_csv(results / "budget" / "vision.csv").to_dict("records")
    errors = {r["op"]: {"all": float(r["output_error"])} for r in rows}
    blocks = block_count(r["op"] for r in rows)
    by_row = _points(rows, errors, blocks)
    done, points = [rows[i] for i in by_row], list(by_row.values())
    print(f"{results}: {len(rows)} vision Linears in {blocks} blocks, {len(done)} measured end to end (the run's "
          f"budget/vision.csv); each measured Linear estimated from the other measured ones:")
    print()
    print("| fit | held-out RMS log miss | rho: measure vs held-out estimate | measure / held-out estimate (min, median, "
          "max) | the same, blocks only (min, max) |")
    print("| --- | ---: | ---: | --- | --- |")
    for name, depth in (("per role", False), ("per role + depth", True)):
        res = held_out(points, depth)
        ratio = [math.exp(x) for x in res]
        est = [float(r["kl_int4"]) / q for r, q in zip(done, ratio)]
        inner = [q for r, q in zip(done, ratio) if "blocks." in r["op"]]
        print(f"| {name} | {math.sqrt(sum(x * x for x in res) / len(res)):.2f} | "
              f"{spearman([float(r['kl_int4']) for r in done], est):.2f} | {min(ratio):.2f}, {np.median(ratio):.2f}, "
              f"{max(ratio):.2f} | {min(inner):.2f}, {max(inner):.2f} |")
    print()
    print(f"The run's choice (vlsens.budget.vision.choose_depth): {depth_cell(choose_depth(points))}.")


def reorder(results: Path, stored_rows: list[dict], stored: dict, new: dict) -> None:
    """The stored curve beside the one the job measures now (:func:`run_estimate`), in their orders."""
    from vlsens.budget.vision import order_of

    rows = new["rows"]
    before, after = ([r["op"] for r in (x[i] for i in order_of(x))] for x in (stored_rows, rows))
    depth = new["record"]["estimate"].get("depth")
    print(f"{results}: {len(rows)} vision Linears, {new['record']['estimate']['measured']} measured end to end; the "
          f"stored curve was ordered by the fit of its time (depth term: "
          f"{depth_cell(stored['estimate'].get('depth'))}), the new one by today's ({depth_cell(depth)}); "
          f"job {new['seconds']:.0f} s")
    print()
    print("| k (Linears INT4) | stored: KL | new: KL | new / stored | MB (stored, new) | first k shared |")
    print("| ---: | ---: | ---: | ---: | --- | ---: |")
    old = {p["int4"]: p for p in stored["points"]}
    for p in new["record"]["points"]:
        k, o = p["int4"], old.get(p["int4"])
        if o is None:
            continue
        print(f"| {k} | {o['kl']:.4g} | {p['kl']:.4g} | {p['kl'] / o['kl']:.2f} | {o['bytes'] / 1e6:.1f}, "
              f"{p['bytes'] / 1e6:.1f} | {len(set(before[:k]) & set(after[:k]))} of {k} |")
    print()
    was = {r["op"]: r for r in stored_rows if r["measured"]}
    again = [(r["op"], float(was[r["op"]]["kl_int4"]), float(r["kl_int4"])) for r in rows if r["measured"] and r["op"] in was]
    if again:
        ratio = [b / a for _, a, b in again if a > 0]
        print(f"The measure repeated: {len(again)} Linears measured in both runs, new / stored KL "
              f"{min(ratio):.4f} .. {max(ratio):.4f}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/tiny"))
    ap.add_argument("--measured", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--refit", action="store_true", help="fit a partly measured run's own measures again")
    ap.add_argument("--reorder", action="store_true", help="measure a partly measured run's curve again in today's order")
    ap.add_argument("--nbits", nargs="+", default=[], metavar="KEY=VALUE",
                    help="deploy.nbits settings the run's job used, where the run has no run.yaml (make scale: "
                         "algorithm=rtn block_size=128)")
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    import pandas as pd
    import yaml
    from _publish import published

    if args.refit:
        with published(f"vision-estimate-refit-{args.results.name}",
                       f"The vision Linears' estimate fitted again on {args.results}'s measures", results=args.results):
            refit(args.results)
        return

    inputs, settings = job_inputs(args.results)
    settings = {**settings, **{k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.nbits)}}
    if args.reorder:
        stored = json.loads((args.results / "budget" / "vision.json").read_text())
        stored_rows = pd.read_csv(args.results / "budget" / "vision.csv").to_dict("records")
        new = run_estimate(inputs, settings, stored["estimate"]["measured"])
        with published(f"vision-curve-reordered-{args.results.name}", f"The vision curve of {args.results} in "
                       "today's order", results=args.results):
            reorder(args.results, stored_rows, stored, new)
        return
    exact_rows = pd.read_csv(args.results / "budget" / "vision.csv").to_dict("records")
    exact_record = json.loads((args.results / "budget" / "vision.json").read_text())
    bench = args.results / "benchmarks" / "budget_vision.tsv"
    exact_seconds = float(bench.read_text().splitlines()[1].split("\t")[0]) if bench.is_file() else None
    runs = {m: run_estimate(inputs, settings, m) for m in args.measured}
    with published(f"vision-estimate-{args.results.name}", f"The vision Linears' estimate of {args.results}",
                   results=args.results):
        report(args.results, exact_rows, exact_record, exact_seconds, runs)


if __name__ == "__main__":
    main()
