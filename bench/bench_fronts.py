#!/usr/bin/env python
"""Two finished runs of one checkpoint, front against front at equal bytes: for each plan folder of
run B (the baseline), the best plan folder of run A within its bytes (as each anchor is met), both
measured on the same cases (the folders' measure: KL per generated step against the fp32 folder
through onnxruntime-genai); the ratio of mean KLs A / B with its paired bootstrap interval, on all
prompts and on image prompts. Prints a table.

    python bench/bench_fronts.py --a results/held-out-awq --b results/held-out

The runs must share the checkpoint and the measure's cases (a case missing from either side is an
error); their reference (the fp32 folder) is the same graph, so their KLs are on one scale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _plans(root: Path) -> dict[str, dict]:
    """``{plan name: its measure}`` of a run's plan folders."""
    from vlsens.budget.report import PLAN_PREFIX

    out = {}
    for f in sorted((root / "measure").glob(f"{PLAN_PREFIX}*.json")):
        out[f.stem[len(PLAN_PREFIX):]] = json.loads(f.read_text())
    if not out:
        sys.exit(f"{root}: no plan folder measured (measure/{PLAN_PREFIX}*.json)")
    return out


def _cell(p: dict) -> str:
    lo, hi = p["interval"]
    verdict = "better" if p["better"] else "worse" if p["worse"] else "not separated"
    return f"{p['ratio']:.2f} [{lo:.2f}, {hi:.2f}] {verdict}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, type=Path, help="results/<model> of run A")
    ap.add_argument("--b", required=True, type=Path, help="results/<model> of run B (the baseline)")
    ap.add_argument("--publish", action="store_true", help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    from vlsens.budget.report import _image_rows
    from vlsens.deploy.measure import paired

    plans_a, plans_b = _plans(a.a), _plans(a.b)
    ref_a = json.loads((a.a / "measure" / "compare.json").read_text()).get("reference")
    ref_b = json.loads((a.b / "measure" / "compare.json").read_text()).get("reference")
    print(f"A: {a.a} ({len(plans_a)} plans), B: {a.b} ({len(plans_b)} plans); references: "
          f"{'the same' if ref_a == ref_b else 'DIFFERENT'}\n")
    print("| plan B | MB B | KL B | best plan A within B's bytes | MB A | KL A | A / B, all prompts | image prompts |")
    print("| --- | ---: | ---: | --- | ---: | ---: | --- | --- |")
    ratios = []
    for name, b in sorted(plans_b.items(), key=lambda kv: kv[1]["bytes"]):
        fits = {n: p for n, p in plans_a.items() if p["bytes"] <= b["bytes"]}
        if not fits:
            print(f"| {name} | {b['bytes'] / 1e6:.3f} | {b['mean_kl']:.3g} | none within its bytes | | | | |")
            continue
        na, m = min(fits.items(), key=lambda kv: kv[1]["mean_kl"])
        every, image = paired(m["cases"], b["cases"]), paired(_image_rows(m["cases"]), _image_rows(b["cases"]))
        ratios.append(every)
        print(f"| {name} | {b['bytes'] / 1e6:.3f} | {b['mean_kl']:.3g} | {na} | {m['bytes'] / 1e6:.3f} | "
              f"{m['mean_kl']:.3g} | {_cell(every)} | {_cell(image)} |")
    better = sum(r["better"] for r in ratios)
    worse = sum(r["worse"] for r in ratios)
    print(f"\nOf {len(ratios)} plans of B with a plan of A within their bytes: {better} better, {worse} worse, "
          f"{len(ratios) - better - worse} not separated (95 % paired bootstrap interval over the cases, resampled "
          "within each modality). MB: the folder's bytes.")


if __name__ == "__main__":
    from _publish import published

    name = "-".join(Path(sys.argv[sys.argv.index(k) + 1]).name for k in ("--a", "--b") if k in sys.argv) or "run"
    with published(f"fronts-{name}", "Two runs' fronts at equal bytes"):
        main()
