"""Each part's calibration archives: its own inputs, from the earlier parts (vlsens.npu.calibration)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.npu import calibration

run(snakemake, lambda sm: calibration.part_calibration(  # noqa: F821
    sm.input.parts, sm.input.calib, sm.input.eval, sm.output.archives, threads=threads(sm),
    device=sm.config["device"]))
