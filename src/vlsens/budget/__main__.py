"""``python -m vlsens.budget results/<model> [...]``: the recommended folder of each finished run,
and where its measured front is (what ``make run`` prints last)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _roots(argv: list[str]) -> list[str]:
    """Result folders from the arguments; ``--config FILE``: the model that config names (it extends
    config/config.yaml, as the workflow reads it)."""
    if argv[:1] != ["--config"]:
        return argv or ["results/tiny"]
    from vlsens.config import run_model_name

    return [f"results/{run_model_name('config/config.yaml', [argv[1]])}"]


def main(argv: list[str]) -> int:
    for root in _roots(argv):
        record = Path(root) / "budget" / "measured.json"
        if not record.is_file():
            print(f"{root}: no measured front ({record} missing)")
            continue
        r = json.loads(record.read_text())
        rec = r.get("recommended")
        met = sum(1 for v in r["versus"] if v.get("met"))
        print(f"{root}: {len(r['plans'])} plans built and measured; the goal met against {met} of {len(r['versus'])} "
              f"anchors ({record.with_name('measured.md')}, {record.with_name('front.png')})")
        if rec:
            acc = f"accuracy {100 * rec['accuracy']['accuracy']:.1f} %, " if "accuracy" in rec else ""
            print(f"  recommended: {Path(root) / 'deploy' / rec['folder']} ({rec['bytes'] / 1e6:.3f} MB of graphs and "
                  f"weights, {acc}KL {rec['kl']:.3g} per step): {rec['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
