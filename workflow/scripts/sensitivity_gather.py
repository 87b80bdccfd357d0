"""Shards -> ranked ort.csv + ort.json."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.scripting import run
from vlsens.sensitivity_stage import gather

run(snakemake, lambda sm: gather(sm.input.meta.rsplit("/", 1)[0], sm.input.eval, sm.input.shards,  # noqa: F821
                                 sm.output.csv, sm.output.summary, sm.threads))
