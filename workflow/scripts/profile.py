"""Mixed-precision profile: search with the engine, build with ORT, measure, write."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.precision.int8 import ProfileSettings, build_profile


def main(sm):
    s = sm.params.settings
    settings = ProfileSettings(s["metric"], float(s["target"]), s["max_evals"], objective=s["objective"],
                               latency_runs=s["latency_runs"], fail_if_unreachable=s["fail_if_unreachable"],
                               threads=threads(sm))
    build_profile(Path(sm.input.meta).parent, sm.input.ranking, sm.input.eval, sm.params.models,
                  Path(sm.output.eval).parent, settings, sm.wildcards.variant)


run(snakemake, main)  # noqa: F821
