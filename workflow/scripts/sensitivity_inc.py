"""Engine inc: INC mse_v2 per-op sensitivity -> inc.csv + inc.json; with --tune, INC's own
fallback run to the profile's target -> inc-tune/{model.onnx, eval.json}.

Runs with INC's own interpreter (the rules call ``<inc python> workflow/scripts/sensitivity_inc.py``),
not Snakemake's, so it takes command-line arguments instead of the ``snakemake`` object.
"""
import argparse
import json
import types
from pathlib import Path

import _vlsens  # noqa: F401  (src/ on sys.path: vlsens is not installed in INC's environment)

from vlsens.core.scripting import run

p = argparse.ArgumentParser(description=__doc__)
for name in ("model", "calib", "eval", "summary", "log"):
    p.add_argument(f"--{name}", required=True)
p.add_argument("--csv", help="sensitivity mode: the ranked CSV to write")
p.add_argument("--settings", required=True, help="QuantSettings as JSON")
p.add_argument("--max-ops", type=int, default=0, help="score only the first N ops (0: all)")
p.add_argument("--tune", action="store_true", help="INC's fallback run; --summary is <dir>/eval.json")
p.add_argument("--metric", default="cosine")
p.add_argument("--target", type=float, default=0.999)
p.add_argument("--max-trials", type=int, default=50)
p.add_argument("--threads", type=int, default=0)
args = p.parse_args()
if not args.tune and not args.csv:
    p.error("--csv is required without --tune")


def main(_sm):
    from vlsens.quantize.qdq import QuantSettings
    from vlsens.sensitivity.inc.stages import sensitivity_stage, tune_stage

    settings = QuantSettings.from_config(json.loads(args.settings))
    if args.tune:
        tune_stage(args.model, args.calib, args.eval, Path(args.summary).parent, settings, args.metric,
                   args.target, args.max_trials)
    else:
        sensitivity_stage(args.model, args.calib, args.eval, args.csv, args.summary, settings,
                          max_ops=args.max_ops or None)


run(types.SimpleNamespace(log=[args.log], rule="sensitivity_inc_tune" if args.tune else "sensitivity_inc",
                          wildcards={"model": args.model}, threads=args.threads,
                          input=[args.model, args.calib, args.eval],
                          output=[args.summary] + ([args.csv] if args.csv else [])), main)
