#!/usr/bin/env python
"""The int4 deploy folders of a finished run side by side (the run's ``deploy/int4.json``, written
by rule ``deploy_int4``), with the int4-mixed profile's comparison with llama.cpp's heuristic at
the heuristic's own weight bytes (engine nbits' arithmetic, from the profile's parity record).

    python bench/bench_int4.py --results results/tiny
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


if __name__ == "__main__":
    from _publish import published

    results = sys.argv[sys.argv.index("--results") + 1] if "--results" in sys.argv else "results/tiny"
    with published(f"int4-{Path(results).name}", f"INT4 decoders of {results}"):
        main()
