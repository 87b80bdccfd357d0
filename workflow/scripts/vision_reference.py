"""transformers' vision features on real preprocessed images: the reference every gate uses."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.device import torch_device
from vlsens.inputs import checkpoint_dir, image_refs
from vlsens.scripting import run
from vlsens.vision import compute_reference, parse_size


def main(sm):
    h, w = parse_size(sm.wildcards.size)
    refs = image_refs(sm.input.images)
    compute_reference(checkpoint_dir(sm.input.checkpoint), refs, h, w, device=torch_device(sm.config["device"])).save(sm.output.reference)


run(snakemake, main)  # noqa: F821
