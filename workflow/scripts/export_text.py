"""Export the text LM (model.onnx from ids, embeds.onnx from embeddings); parity-gated."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from pathlib import Path

from vlsens.inputs import checkpoint_dir
from vlsens.scripting import run
from vlsens.text import export_text

run(snakemake, lambda sm: export_text(  # noqa: F821
    checkpoint_dir(sm.input.checkpoint), sm.input.reference, Path(sm.output.model).parent, sm.params.tolerance,
    exporter=sm.params.exporter, fallback=sm.params.fallback, opset=sm.params.opset, threads=sm.threads,
    device=sm.config["device"]))
