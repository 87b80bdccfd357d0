"""ort.csv + inc.csv -> compare.json (Spearman, top-k overlap, seconds per op)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.sensitivity.compare import compare_stage

run(snakemake, lambda sm: compare_stage(  # noqa: F821
    {"ort": sm.input.ort_csv, "inc": sm.input.inc_csv}, {"ort": sm.input.ort_json, "inc": sm.input.inc_json},
    sm.output[0], sm.params.top_k))
