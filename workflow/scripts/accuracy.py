"""Every folder's task accuracy paired with the fp32 folder's, and each plan with the anchor at its
bytes (vlsens.deploy.accuracy)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.deploy.accuracy import write


def main(sm):
    inputs = dict(sm.input.items())
    measured = inputs.pop("measured", None)
    write(inputs, sm.output.json, sm.output.md, measured)


run(snakemake, main)  # noqa: F821
