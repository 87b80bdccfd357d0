"""A fixed-size vision graph's variant cut into gated single-file parts (vlsens.npu.build)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.npu import build

run(snakemake, lambda sm: build.build_parts(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, sm.output.parts, sm.params.tolerance, sm.wildcards.variant,
    sm.params.parts, sm.params.max_bytes, threads=threads(sm), device=sm.config["device"]))
