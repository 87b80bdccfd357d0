"""The int4-mixed decoder: searched in engine nbits, built by MatMulNBitsQuantizer, gated (vlsens.precision.nbits)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.export.towers.decoder import weight_reference_for
from vlsens.precision.nbits import SearchSettings, profile_folder
from vlsens.variants import Gate


def main(sm):
    s, n = sm.params.settings, threads(sm)
    search = SearchSettings(float(s["target"]), s["max_evals"], n, tied=bool(sm.params.tied))
    gate = Gate(sm.params.tolerance, n, reference_for=weight_reference_for(checkpoint_dir(sm.input.checkpoint)),
                exact_tolerance=sm.params.exact_tolerance)
    profile_folder(sm.input.engine, sm.input.eval, sm.input.csv, Path(sm.input.parity).parent, sm.input.reference,
                   Path(sm.output.model).parent, search, gate, heuristic=sm.input.get("heuristic"))


run(snakemake, main)  # noqa: F821
