"""Sensitivity rows of one shard of the op list."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.scripting import run
from vlsens.sensitivity_stage import run_shard

run(snakemake, lambda sm: run_shard(sm.input.meta.rsplit("/", 1)[0], sm.input.eval, int(sm.wildcards.i),  # noqa: F821
                                    int(sm.wildcards.n), sm.output.csv, sm.threads))
