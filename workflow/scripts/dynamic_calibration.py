"""Per-size calibration/evaluation feeds for the dynamic graph, from every size's sets."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.dynamic import calibration_stage
from vlsens.inputs import checkpoint_dir
from vlsens.scripting import run

run(snakemake, lambda sm: calibration_stage(checkpoint_dir(sm.input.checkpoint), sm.params.sizes, sm.input.calib,  # noqa: F821
                                            sm.input.eval, sm.output.calib, sm.output.eval))
