"""Calibration and evaluation feeds of one graph (calib.npz, eval.npz, manifest.json)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.data.inputs import checkpoint_dir
from vlsens.export import stages, towers


def main(sm):
    inputs = {k: (v if isinstance(v, str) else list(v)) for k, v in sm.input.items() if k != "checkpoint"}
    stages.calibration(towers.for_graph(sm.config, sm.wildcards.graph), checkpoint_dir(sm.input.checkpoint), inputs,
                       Path(sm.output.manifest).parent, sm.params.settings)


run(snakemake, main)  # noqa: F821
