"""The fp32 folder's logits on the deploy evaluation cases, teacher-forced on its own tokens: every other
folder's evaluation reference, computed once (vlsens.deploy.genai.evaluate)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.data.inputs import image_refs
from vlsens.deploy.genai.evaluate import write_eval_logits

run(snakemake, lambda sm: write_eval_logits(sm.input.fp32_folder, image_refs(sm.input.images), sm.output[0]))  # noqa: F821
