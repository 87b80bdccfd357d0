"""The int4 deploy folders side by side (vlsens.deploy.compare)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.deploy.compare import write

run(snakemake, lambda sm: write(dict(sm.input.items()), sm.output.json, sm.output.md))  # noqa: F821
