"""The folders' evaluation cases: text, one-image and two-image prompts over the calibration photos at
several sizes (vlsens.deploy.cases)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.data.inputs import image_refs
from vlsens.deploy.cases import folder_cases

run(snakemake, lambda sm: folder_cases(  # noqa: F821
    image_refs(sm.input.images), sm.output[0], sm.params.per_modality, [tuple(s) for s in sm.params.sizes],
    sm.params.seed))
