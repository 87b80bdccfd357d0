"""One plan's deploy folder: its decoder built and gated, its vision graph and table, assembled, checked
and evaluated like every folder, then measured (vlsens.budget.build)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.build import plan_job
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: plan_job(dict(sm.input.items()), dict(sm.output.items()), dict(sm.params.items()),  # noqa: F821
                                    threads(sm)))
