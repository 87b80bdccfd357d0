"""The deploy folders side by side on the end-to-end measure, with paired intervals, and their task
accuracy first where the run answers the task's questions (vlsens.deploy.peers)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.deploy.accuracy import split_inputs
from vlsens.deploy.peers import write


def main(sm):
    measures, answers = split_inputs(dict(sm.input.items()))
    write(measures, sm.output.json, sm.output.md, answers or None)


run(snakemake, main)  # noqa: F821
