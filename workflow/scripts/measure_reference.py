"""The fp32 folder's greedy tokens and log-probabilities on the evaluation cases (vlsens.deploy.genai.measure)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.deploy.cases import load_cases
from vlsens.deploy.genai.measure import reference

run(snakemake, lambda sm: reference(  # noqa: F821
    sm.input.folder, load_cases(sm.input.cases), sm.params.max_new_tokens, sm.output[0]))
