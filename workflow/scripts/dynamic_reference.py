"""transformers' vision features for the dynamic graph's parity cases (several sizes, 2 images)."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.dynamic import compute_dynamic_reference
from vlsens.images import ImageRef
from vlsens.scripting import run
from vlsens.vision import parse_size


def main(sm):
    refs = [ImageRef(p, n) for p, n in zip(sm.input.images, sm.params.names)]
    cases = [[parse_size(s, key="vision.dynamic.parity_cases") for s in case] for case in sm.params.cases]
    compute_dynamic_reference(sm.input.checkpoint, refs, cases).save(sm.output.reference)


run(snakemake, main)  # noqa: F821
