"""Which folder to ship per device, and what the run missed (vlsens.report.recommend)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.report.recommend import recommend_job

run(snakemake, lambda sm: recommend_job(sm.params.sources, sm.params.kl_budget, sm.output.json,  # noqa: F821
                                        sm.output.md))
