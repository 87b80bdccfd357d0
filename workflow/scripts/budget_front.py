"""The front's search: decoder assignments by byte budget on the measure's cases, combined with every vision and
embedding format (and the mixed vision curve), plans picked along the front and at each anchor's bytes
(vlsens.budget.build)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.build import front_job
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: front_job(dict(sm.input.items()), dict(sm.output.items()), sm.params.search,  # noqa: F821
                                    threads(sm)))
