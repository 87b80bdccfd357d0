"""NNCF's weight compression of the decoder's fp32 graph with one recipe, gated (vlsens.deploy.genai.anchors)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.deploy.genai.anchors import nncf_folder


def main(sm):
    nncf_folder(checkpoint_dir(sm.input.checkpoint), sm.wildcards.recipe, Path(sm.input.parity).parent,
                sm.input.reference, sm.input.calib, Path(sm.output.model).parent, sm.params.tolerance,
                sm.params.exact_tolerance, threads(sm))


run(snakemake, main)  # noqa: F821
