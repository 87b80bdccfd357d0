"""Every plan folder's decode step beside the nbits engine's uniform decoders, timed in the same rounds: the
check of the front's decode-step estimate (vlsens.budget.latency)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.latency import latency_job
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: latency_job(dict(sm.input.items()), dict(sm.output.items()), sm.params.context,  # noqa: F821
                                      threads(sm)))
