"""Both text graphs FP32 -> FP16 with range-based FP32 fallback; parity-gated."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from pathlib import Path

from vlsens.scripting import run
from vlsens.text import text_fp16

run(snakemake, lambda sm: text_fp16(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, Path(sm.output.model).parent, sm.params.tolerance,
    sm.params.max_activation, sm.params.max_initializer, threads=sm.threads, device=sm.config["device"]))
