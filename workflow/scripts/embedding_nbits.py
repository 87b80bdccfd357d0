"""An embedding graph with its table as INT4 or INT8 GatherBlockQuantized, gated (vlsens.precision.weight_only)."""
import json
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.precision.weight_only import embedding_folder


def main(sm):
    cfg = json.loads((Path(checkpoint_dir(sm.input.checkpoint)) / "config.json").read_text())
    embedding_folder(Path(sm.input.parity).parent, sm.input.reference, Path(sm.output.model).parent,
                     int(sm.params.block_size), bool(sm.params.symmetric), int(cfg["image_token_id"]),
                     sm.params.exact_tolerance, threads(sm), bits=int(sm.wildcards.bits))


run(snakemake, main)  # noqa: F821
