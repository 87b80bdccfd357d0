"""onnxsim on an FP32 or FP16 folder, every graph file; parity-gated."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens import variants
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: variants.simplify(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, Path(sm.output.model).parent, sm.params.tolerance,
    f"{sm.wildcards.base}-sim", sm.params.check_max_bytes, threads=threads(sm), device=sm.config["device"]))
