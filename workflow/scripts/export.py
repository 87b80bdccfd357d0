"""The tower's FP32 graph file(s) of one graph, parity-gated against its reference."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.export import stages, towers

run(snakemake, lambda sm: stages.export(  # noqa: F821
    towers.for_graph(sm.config, sm.wildcards.graph), checkpoint_dir(sm.input.checkpoint), sm.input.reference,
    Path(sm.output.model).parent, sm.params.tolerance, sm.params.settings, threads=threads(sm),
    device=sm.config["device"]))
