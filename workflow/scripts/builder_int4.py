"""onnxruntime-genai's builder decoder at -p int4 with one algo_config (its placement and quantizer on its FP32
graph), gated (vlsens.deploy.genai.anchors)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.deploy.genai.anchors import builder_folder
from vlsens.quantize.nbits import NBitsSettings


def main(sm):
    builder_folder(checkpoint_dir(sm.input.checkpoint), sm.wildcards.algo, NBitsSettings.from_config(sm.params.settings),
                   Path(sm.input.parity).parent, sm.input.reference, Path(sm.output.model).parent,
                   sm.params.tolerance, sm.params.exact_tolerance, threads(sm))


run(snakemake, main)  # noqa: F821
