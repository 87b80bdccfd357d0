"""Each part's calibration archives: its own inputs, from the earlier parts (vlsens.parts)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens import parts
from vlsens.scripting import run, threads

run(snakemake, lambda sm: parts.part_calibration(  # noqa: F821
    sm.input.parts, sm.input.calib, sm.input.eval, sm.output.archives, threads=threads(sm),
    device=sm.config["device"]))
