"""A fixed-size vision graph's variant cut into gated single-file parts (vlsens.parts)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens import parts
from vlsens.scripting import run, threads

run(snakemake, lambda sm: parts.build_parts(  # noqa: F821
    Path(sm.input.model).parent, sm.input.reference, sm.output.parts, sm.params.tolerance, sm.wildcards.variant,
    sm.params.parts, sm.params.max_bytes, threads=threads(sm), device=sm.config["device"]))
