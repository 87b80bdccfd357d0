"""FP32 -> FP16 with range-based FP32 fallback; parity-gated."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.fp16 import convert_vision_fp16
from vlsens.scripting import run


def main(sm):
    convert_vision_fp16(
        sm.input.model, sm.input.reference, sm.output.model, sm.output.parity,
        tolerance=sm.params.tolerance, max_activation=sm.params.max_activation,
        max_initializer=sm.params.max_initializer, threads=sm.threads, device=sm.config["device"],
    )


run(snakemake, main)  # noqa: F821
