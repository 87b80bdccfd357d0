"""Export the vision tower at one fixed size; parity-gated."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.export import export_vision_fixed
from vlsens.inputs import checkpoint_dir
from vlsens.scripting import run
from vlsens.vision import parse_size


def main(sm):
    h, w = parse_size(sm.wildcards.size)
    export_vision_fixed(
        checkpoint_dir(sm.input.checkpoint), sm.input.reference, sm.output.model, sm.output.parity, h, w,
        tolerance=sm.params.tolerance, batch=sm.params.batch_size, opset=sm.params.opset,
        attn_implementation=sm.params.attn_implementation, threads=sm.threads, device=sm.config["device"],
    )


run(snakemake, main)  # noqa: F821
