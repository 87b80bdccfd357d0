"""Engine folder: float model, calibration (once), switch model, float reference outputs."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.quantize.qdq import QuantSettings
from vlsens.sensitivity.stages import prepare

run(snakemake, lambda sm: prepare(  # noqa: F821
    sm.params.model, sm.input.calib, sm.input.eval, Path(sm.output.meta).parent,
    QuantSettings.from_config(sm.params.settings), threads(sm), sm.params.suffix_cuts, sm.params.weights_only,
    logits=sm.params.logits))
