"""transformers' logits for the text graphs' parity cases (text at two lengths, image+prompt)."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.inputs import checkpoint_dir, image_refs
from vlsens.scripting import run
from vlsens.text import BUILTIN_PROMPTS, compute_text_reference
from vlsens.vision import parse_size


def main(sm):
    refs = image_refs(sm.input.images)
    h, w = parse_size(sm.params.image_size, key="text.parity.image_size")
    compute_text_reference(checkpoint_dir(sm.input.checkpoint), refs, BUILTIN_PROMPTS, sm.params.repeats, h, w).save(sm.output.reference)


run(snakemake, main)  # noqa: F821
