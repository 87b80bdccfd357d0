"""Engine nbits: weight-only INT4 / INT8 sensitivity of every weight MatMul (vlsens.sensitivity.nbits)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.quantize.nbits import NBitsSettings
from vlsens.sensitivity import nbits


def main(sm):
    nbits.prepare(sm.params.model, sm.input.eval, sm.output.engine, NBitsSettings.from_config(sm.params.settings),
                  threads(sm), logits=sm.params.logits, suffix_cuts=sm.params.suffix_cuts)
    nbits.sensitivity(sm.output.engine, sm.input.eval, sm.output.csv, sm.output.summary, threads(sm))


run(snakemake, main)  # noqa: F821
