"""FP16 or simplified variant of the dynamic vision graph; parity-gated at every case."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.dynamic import dynamic_variant
from vlsens.fp16 import convert_fp16
from vlsens.scripting import run
from vlsens.simplify import simplify_model


def main(sm):
    if sm.rule == "dynamic_fp16":
        variant = "fp16"

        def make(src, feeds, staged):
            return convert_fp16(src, feeds, staged, sm.params.max_activation, sm.params.max_initializer,
                                sm.threads, sm.params.device)
    else:
        variant = f"{sm.wildcards.base}-sim"

        def make(src, feeds, staged):
            return simplify_model(src, feeds[0], staged, sm.params.check_max_bytes)
    dynamic_variant(sm.input.model, sm.input.reference, sm.output.model, sm.output.parity, sm.params.tolerance,
                    variant, make, threads=sm.threads, device=sm.params.device)


run(snakemake, main)  # noqa: F821
