"""Which folder to ship per device, and what the run missed (vlsens.report.recommend)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.report.recommend import recommend, write


def main(sm):
    items = sm.params.sources
    npu = {}
    for kind in ("parts", "profile"):
        for name, path in (items.get(kind) or {}).items():
            npu.setdefault(name, {})[kind] = path
    measured = next(iter((items.get("measured") or {}).values()), None)
    rec = recommend(items.get("folder") or {}, items.get("measure") or {}, sm.params.kl_budget, npu, measured)
    write(rec, sm.output.json, sm.output.md)


run(snakemake, main)  # noqa: F821
