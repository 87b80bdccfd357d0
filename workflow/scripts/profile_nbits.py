"""The int4-mixed decoder: searched in engine nbits, built by MatMulNBitsQuantizer, gated (vlsens.precision.nbits)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.export.towers.decoder import weight_reference_for
from vlsens.precision.nbits import profile_folder


def main(sm):
    s = sm.params.settings
    profile_folder(sm.input.engine, sm.input.eval, sm.input.csv, Path(sm.input.parity).parent, sm.input.reference,
                   Path(sm.output.model).parent, float(s["target"]), sm.params.tolerance, sm.params.exact_tolerance,
                   weight_reference_for(checkpoint_dir(sm.input.checkpoint)), s["max_evals"], threads(sm),
                   heuristic=sm.input.get("heuristic"), tied=bool(sm.params.tied))


run(snakemake, main)  # noqa: F821
