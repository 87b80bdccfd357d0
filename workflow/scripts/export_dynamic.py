"""Export the vision tower as one graph for every size (index tensors as inputs); parity-gated."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.dynamic import export_dynamic
from vlsens.inputs import checkpoint_dir
from vlsens.scripting import run

run(snakemake, lambda sm: export_dynamic(  # noqa: F821
    checkpoint_dir(sm.input.checkpoint), sm.input.reference, sm.output.model, sm.output.parity, sm.params.tolerance,
    opset=sm.params.opset, threads=sm.threads, device=sm.config["device"]))
