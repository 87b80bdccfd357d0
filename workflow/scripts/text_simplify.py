"""onnxsim on both text graphs; parity-gated."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from pathlib import Path

from vlsens.scripting import run
from vlsens.text import text_simplify

run(snakemake, lambda sm: text_simplify(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, Path(sm.output.model).parent, sm.params.tolerance,
    f"{sm.wildcards.base}-sim", sm.params.check_max_bytes, threads=sm.threads, device=sm.config["device"]))
