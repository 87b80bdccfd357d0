"""transformers' vision features for the dynamic graph's parity cases (several sizes, 2 images)."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.dynamic import compute_dynamic_reference
from vlsens.inputs import checkpoint_dir, image_refs
from vlsens.scripting import run
from vlsens.vision import parse_size


def main(sm):
    refs = image_refs(sm.input.images)
    cases = [[parse_size(s, key="vision.dynamic.parity_cases") for s in case] for case in sm.params.cases]
    compute_dynamic_reference(checkpoint_dir(sm.input.checkpoint), refs, cases).save(sm.output.reference)


run(snakemake, main)  # noqa: F821
