"""Calibration and evaluation tensors for one size."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.calibration import build_calibration
from vlsens.images import ImageRef
from vlsens.scripting import run
from vlsens.vision import parse_size


def main(sm):
    h, w = parse_size(sm.wildcards.size)
    refs = [ImageRef(p, n) for p, n in zip(sm.input.images, sm.params.names)]
    build_calibration(sm.input.checkpoint, refs, h, w, sm.output.manifest.rsplit("/", 1)[0],
                      sm.params.num_calib, sm.params.num_eval, sm.params.seed, sm.params.skip_unreadable)


run(snakemake, main)  # noqa: F821
