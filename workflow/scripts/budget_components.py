"""Each vision and embedding format measured end to end in the fp32 folder: the parts the front's search adds
up (vlsens.budget.build)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.build import components_job
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: components_job(dict(sm.input.items()), dict(sm.output.items()), threads(sm)))  # noqa: F821
