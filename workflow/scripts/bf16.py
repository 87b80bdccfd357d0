"""FP32 -> BF16 inside (I/O FP32), every graph file; parity-gated (vlsens.variants.bfloat16)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens import variants
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: variants.bf16(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, Path(sm.output.model).parent, sm.params.tolerance,
    threads=threads(sm), device=sm.config["device"]))
