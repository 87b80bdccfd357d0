"""Text calibration/evaluation sequences (merged vision features for image+prompt samples)."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from pathlib import Path

from vlsens.inputs import checkpoint_dir, image_refs
from vlsens.scripting import run
from vlsens.text import build_text_calibration, load_prompt_samples
from vlsens.vision import parse_size


def main(sm):
    images = image_refs(sm.input.images)
    samples = load_prompt_samples(sm.params.prompts, images)
    h, w = parse_size(sm.params.image_size, key="text.calibration.image_size")
    build_text_calibration(checkpoint_dir(sm.input.checkpoint), samples, h, w, Path(sm.output.manifest).parent,
                           sm.params.num_calib, sm.params.num_eval, sm.params.seed)


run(snakemake, main)  # noqa: F821
