"""Shards -> ranked ort.csv + ort.json."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.sensitivity.stages import gather

run(snakemake, lambda sm: gather(  # noqa: F821
    Path(sm.input.meta).parent, sm.input.eval, sm.input.shards, sm.output.csv, sm.output.summary, threads(sm)))
