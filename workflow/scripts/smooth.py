"""FP32 -> fp32-smooth: outlier channels migrated into the weights; parity-gated (vlsens.variants.smoothquant)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens import variants
from vlsens.core.scripting import run, threads

run(snakemake, lambda sm: variants.smooth(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, sm.input.calib, Path(sm.output.model).parent,
    sm.params.tolerance, sm.params.settings, threads=threads(sm), device=sm.config["device"]))
