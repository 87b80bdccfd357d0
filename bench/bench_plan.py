#!/usr/bin/env python
"""The whole-VLM plan of a finished run beside the anchors: every deploy folder on the folders'
measure (``measure/compare.json``: KL per generated step against the fp32 folder through
onnxruntime-genai, per modality, paired intervals) and the measured front (``budget/measured.json``:
each plan's estimate against its built folder, each anchor against the best plan within its bytes).

    python bench/bench_plan.py --results results/tiny

Reads the run's records (the run itself is ``make run``); the table is written to
``docs/benchmarks/plan-<model>.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(root: Path) -> None:
    from vlsens.budget import report
    from vlsens.deploy import peers

    compare = json.loads((root / "measure" / "compare.json").read_text())
    measured = json.loads((root / "budget" / "measured.json").read_text())
    print("## Every folder on the measure\n")
    print(peers.markdown(compare))
    print("## The measured front beside the anchors\n")
    print(report.markdown(measured))
    s = measured.get("search") or {}
    ev, sec = s.get("evaluations") or {}, s.get("seconds") or {}
    if ev:
        print(f"Search: {ev.get('measured')} decoder assignments measured ({ev.get('asked')} asked) in "
              f"{sec.get('total', 0):.1f} s; the figure: {root / 'budget' / 'front.png'}.")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/tiny", help="results/<model> of a finished run")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    results = Path(ap.parse_args().results)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _publish import published

    with published(f"plan-{results.name}", f"The whole-VLM plan of {results}"):
        main(results)
