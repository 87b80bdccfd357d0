"""The measured front beside the anchors: every plan's folder and every anchor on the folders' measure, the
estimate against the built folder, the goals with their paired intervals (vlsens.budget.report)."""
import json

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.report import write
from vlsens.core.scripting import run
from vlsens.deploy.accuracy import split_inputs


def main(sm):
    inputs, answers = split_inputs({k: v for k, v in sm.input.items() if k not in ("front", "components", "latency")})
    write(json.loads(open(sm.input.front).read()), inputs, sm.output.json, sm.output.md, sm.output.png,
          kl_budget=sm.params.kl_budget, latency=json.loads(open(sm.input.latency).read()), answers=answers or None)


run(snakemake, main)  # noqa: F821
