"""Each Linear of the vision graph alone at INT4 in the fp32 folder, measured end to end on the folders'
measure: the table the mixed vision curve is drawn from (vlsens.budget.vision)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.build import vision_job
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: vision_job(dict(sm.input.items()), dict(sm.output.items()), sm.params.settings,  # noqa: F821
                                     sm.params.measured, threads(sm)))
