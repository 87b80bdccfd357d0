"""Sensitivity rows of one shard of the op list."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.sensitivity.stages import run_shard

run(snakemake, lambda sm: run_shard(  # noqa: F821
    Path(sm.input.meta).parent, sm.input.eval, int(sm.wildcards.i), int(sm.wildcards.n), sm.output.csv, threads(sm)))
