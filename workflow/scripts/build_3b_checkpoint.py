"""Build the 3b preset checkpoint (Snakemake script: unpacks the rule, calls the package)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.model.presets.build import build_3b_checkpoint

run(snakemake, lambda sm: build_3b_checkpoint(  # noqa: F821
    sm.output.checkpoint, seed=sm.params.seed, text_layers=sm.params.text_layers))
