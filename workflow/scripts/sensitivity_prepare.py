"""Engine folder: float model, calibration (once), switch model, float reference outputs."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.quant import QuantSettings
from vlsens.scripting import run
from vlsens.sensitivity_stage import prepare

run(snakemake, lambda sm: prepare(sm.input.model, sm.input.calib, sm.input.eval, sm.output.meta.rsplit("/", 1)[0],  # noqa: F821
                                   QuantSettings.from_config(sm.params.settings), sm.threads))
