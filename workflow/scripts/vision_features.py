"""transformers' features of the deploy evaluation images on the fp32 folder's preprocessing: the
deploy folders' vision parity reference, computed once (vlsens.deploy.genai.evaluate)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.data.inputs import checkpoint_dir, image_refs
from vlsens.deploy.genai.evaluate import write_vision_features

run(snakemake, lambda sm: write_vision_features(  # noqa: F821
    sm.input.fp32_folder, checkpoint_dir(sm.input.checkpoint), image_refs(sm.input.images), sm.output[0]))
