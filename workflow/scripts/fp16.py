"""FP32 -> FP16 (I/O FP32) with the range-based FP32 fallback, every graph file; parity-gated."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens import variants
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: variants.fp16(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, Path(sm.output.model).parent, sm.params.tolerance,
    sm.params.max_activation, sm.params.max_initializer, threads=threads(sm), device=sm.config["device"]))
