"""transformers' vision features on real preprocessed images: the reference every gate uses."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.device import torch_device
from vlsens.images import ImageRef
from vlsens.scripting import run
from vlsens.vision import compute_reference, parse_size


def main(sm):
    h, w = parse_size(sm.wildcards.size)
    refs = [ImageRef(p, n) for p, n in zip(sm.input.images, sm.params.names)]
    compute_reference(sm.input.checkpoint, refs, h, w, device=torch_device(sm.params.device)).save(sm.output.reference)


run(snakemake, main)  # noqa: F821
