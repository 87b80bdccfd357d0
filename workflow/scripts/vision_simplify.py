"""onnxsim on an FP32 or FP16 vision model; parity-gated."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.scripting import run
from vlsens.simplify import simplify_vision


def main(sm):
    simplify_vision(
        sm.input.model, sm.input.reference, sm.output.model, sm.output.parity,
        tolerance=sm.params.tolerance, variant=f"{sm.wildcards.base}-sim",
        check_max_bytes=sm.params.check_max_bytes, threads=sm.threads, device=sm.config["device"],
    )


run(snakemake, main)  # noqa: F821
