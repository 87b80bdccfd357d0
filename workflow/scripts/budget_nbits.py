"""The measure's cases as the decoder's evaluation set, through the fp32 folder's own graphs
(vlsens.deploy.genai.chain), and engine nbits on it: every decoder MatMul's INT4 / INT8 error where the folders
are judged, with plan.algorithms each MatMul's algorithm chosen first (vlsens.budget.build.nbits_job)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.build import nbits_job
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: nbits_job(dict(sm.input.items()), dict(sm.output.items()), dict(sm.params.items()),  # noqa: F821
                                    threads(sm)))
