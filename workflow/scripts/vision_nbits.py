"""The dynamic vision graph with weight-only Linears in one format (int4, int4-rtn128, int8-wo), gated on its own
weights (vlsens.precision.weight_only)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.precision.weight_only import FORMATS, vision_folder
from vlsens.quantize.nbits import NBitsSettings

run(snakemake, lambda sm: vision_folder(  # noqa: F821
    checkpoint_dir(sm.input.checkpoint), Path(sm.input.parity).parent, sm.input.reference,
    Path(sm.output.model).parent, NBitsSettings.from_config(sm.params.settings), sm.params.tolerance,
    sm.params.exact_tolerance, threads(sm), fmt=FORMATS[sm.wildcards.wo]))
