#!/usr/bin/env python
"""Task accuracy of every folder of a finished run on the trained preset, and the goals it is held
to: fp32 >= 90 % per modality; at least two INT4 anchors lose a resolved amount against fp32; at
each anchor's bytes the plan's drop is at most 0.5x the anchor's (or not resolved from zero where
the anchor's is); the recommended folder's accuracy. Beside it, the per-case KL spread of the
measure (the trained model's distributions are peaked: KL no longer counts top-1 flips alone).

    python bench/bench_accuracy.py --results results/tiny [--wall SECONDS --baseline SECONDS]
        [--random-results DIR]

Reads the run's records (``measure/accuracy.json``, ``budget/measured.json``, ``recommend.json``,
``measure/<folder>.json``); the run itself is ``make run``. ``--wall`` / ``--baseline``: the
measured wall time of ``make run`` and of the run it is compared with (the 1.2x goal);
``--random-results``: the same config's run on the random-weight preset, whose per-case KL spread
is printed beside the trained model's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MODALITIES = ("text", "image", "images")
INT4_ANCHORS = ("int4-rtn", "int4-k_quant", "int4-k_quant_mixed")


def _pct(a: dict) -> str:
    return f"{100 * a['accuracy']:.1f} [{100 * a['low']:.1f}, {100 * a['high']:.1f}]"


def goals(acc: dict, rec: dict | None) -> list[tuple[str, str, bool]]:
    """(goal, measured, met) rows."""
    rows = acc["rows"]
    fp32 = rows["fp32"]["modalities"]
    out = [("fp32 >= 90 % per modality", ", ".join(f"{m} {_pct(fp32[m])}" for m in MODALITIES),
            all(fp32[m]["accuracy"] >= 0.9 for m in MODALITIES))]
    anchors = [a for a in rows if a in INT4_ANCHORS or a.startswith("peer-")]
    losing = [a for a in anchors if rows[a].get("below_fp32")]
    out.append(("at least two INT4 anchors lose a resolved amount against fp32",
                f"{len(losing)} of {len(anchors)}: {', '.join(losing) or 'none'}", len(losing) >= 2))
    for plan, p in acc.get("plans_vs_anchors", {}).items():
        a_drop, p_drop = -p["drops"]["anchor"], -p["drops"]["plan"]
        a_resolved = rows[p["anchor"]].get("below_fp32", False)
        p_resolved = rows[plan].get("below_fp32", False)
        met = (p_drop <= 0.5 * a_drop) if a_drop > 0 else not p_resolved
        if a_resolved and not p_resolved:
            met = True
        out.append((f"{plan} at {p['anchor']}'s bytes: drop <= 0.5x the anchor's (or not resolved where the anchor's is)",
                    f"drop against fp32: plan {100 * p_drop:+.1f} pt ({'resolved' if p_resolved else 'not resolved'}), "
                    f"anchor {100 * a_drop:+.1f} pt ({'resolved' if a_resolved else 'not resolved'})", met))
    if rec:
        cpu = rec["devices"]["cpu"]
        if cpu.get("folder"):
            r = rows.get(cpu["folder"])
            out.append(("recommended CPU folder: accuracy not resolved below fp32", f"{cpu['folder']}: "
                        + ", ".join(f"{m} {_pct(r['modalities'][m])}" for m in MODALITIES),
                        not r.get("below_fp32", False)))
    return out


def case_kls(root: Path) -> dict[str, list[float]]:
    """Per folder of a finished run, the KL per generated step of each of the measure's cases."""
    out = {}
    for f in sorted((root / "measure").glob("*.json")):
        try:
            m = json.loads(f.read_text())
        except json.JSONDecodeError:
            continue
        if "cases" not in m or not isinstance(m["cases"], list) or not m["cases"] or "kl" not in m["cases"][0]:
            continue
        out[m["folder"]] = [c["kl"] for c in m["cases"]]
    return out


def _spread(kls: list[float] | None) -> str:
    if not kls:
        return "- | - | - | - | -"
    lo = min(kls)
    return (f"{statistics.fmean(kls):.3g} | {statistics.median(kls):.3g} | {lo:.3g} | {max(kls):.3g} | "
            f"{(max(kls) / lo) if lo > 0 else float('inf'):.3g}")


def kl_spread(root: Path, random_root: Path | None = None) -> list[str]:
    """The per-case KL spread of every folder; with ``random_root`` (a run of the same config on the
    random-weight preset), the random model's beside it."""
    trained = case_kls(root)
    random = case_kls(random_root) if random_root else {}
    cols = "mean KL per step | median | min | max | max / min"
    head = f"| folder | cases | {cols} |" + (f" random weights: {cols} |" if random else "")
    lines = [head, "| --- | ---: |" + " ---: |" * (5 + (5 if random else 0))]
    for name, kls in trained.items():
        lines.append(f"| {name} | {len(kls)} | {_spread(kls)} |" + (f" {_spread(random.get(name))} |" if random else ""))
    return lines


def main(root: Path, wall: float | None, baseline: float | None, random_root: Path | None = None,
         random_wall: float | None = None) -> None:
    from vlsens.deploy.accuracy import markdown

    acc = json.loads((root / "measure" / "accuracy.json").read_text())
    rec_path = root / "recommend.json"
    rec = json.loads(rec_path.read_text()) if rec_path.is_file() else None
    print(markdown(acc))
    print("## Goals\n\n| goal | measured | met |\n| --- | --- | --- |")
    rows = goals(acc, rec)
    if wall and baseline:
        rows.append(("make run's DAG within 1.2x of the run before the trained preset", f"{wall:.0f} s against {baseline:.0f} s: "
                     f"{wall / baseline:.2f}x", wall <= 1.2 * baseline))
    for g, m, ok in rows:
        print(f"| {g} | {m} | {'yes' if ok else 'NO'} |")
    if wall and random_wall:
        print(f"\nThe same code and config on the random-weight preset (no task to answer, the photos for "
              f"calibration): {random_wall:.0f} s of DAG; the trained preset takes {wall / random_wall:.2f}x of it.")
    print("\n## KL per case on the measure's cases (teacher-forced on fp32's answers)\n")
    if random_root:
        print(f"Beside it, the same config on the random-weight preset ({random_root}): its near-uniform "
              "next-token distributions give KL that counts top-1 flips.\n")
    print("\n".join(kl_spread(root, random_root)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/tiny", help="results/<model> of a finished run")
    ap.add_argument("--wall", type=float, help="make run's measured wall time, seconds")
    ap.add_argument("--baseline", type=float, help="the compared run's wall time, seconds")
    ap.add_argument("--random-results", type=Path, help="results/<model> of the same config on random weights")
    ap.add_argument("--random-wall", type=float, help="that run's wall time, seconds")
    ap.add_argument("--publish", action="store_true", help="write the table to docs/benchmarks/ (default: results/bench/)")
    args = ap.parse_args()
    results = Path(args.results)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _publish import published

    with published(f"accuracy-{results.name}", f"Task accuracy of every folder of {results}", results=results):
        main(results, args.wall, args.baseline, args.random_results, args.random_wall)
