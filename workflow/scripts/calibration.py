"""Calibration and evaluation tensors for one size."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.calibration import build_calibration
from vlsens.inputs import checkpoint_dir, image_refs
from vlsens.scripting import run
from vlsens.vision import parse_size


def main(sm):
    h, w = parse_size(sm.wildcards.size)
    refs = image_refs(sm.input.images)
    build_calibration(checkpoint_dir(sm.input.checkpoint), refs, h, w, sm.output.manifest.rsplit("/", 1)[0],
                      sm.params.num_calib, sm.params.num_eval, sm.params.seed, sm.params.skip_unreadable)


run(snakemake, main)  # noqa: F821
