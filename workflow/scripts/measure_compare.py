"""The deploy folders side by side on the end-to-end measure, with paired intervals (vlsens.deploy.peers)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.deploy.peers import write

run(snakemake, lambda sm: write(dict(sm.input.items()), sm.output.json, sm.output.md))  # noqa: F821
