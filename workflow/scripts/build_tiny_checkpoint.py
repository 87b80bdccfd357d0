"""Build the tiny preset checkpoint (Snakemake script: unpacks the rule, calls the package)."""
from vlsens.checkpoint import build_tiny_checkpoint
from vlsens.scripting import run

run(snakemake, lambda sm: build_tiny_checkpoint(sm.output.checkpoint, seed=sm.params.seed))  # noqa: F821
