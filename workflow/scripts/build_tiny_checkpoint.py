"""Build the tiny preset checkpoint (Snakemake script: unpacks the rule, calls the package)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.model.presets.build import build_tiny_checkpoint

run(snakemake, lambda sm: build_tiny_checkpoint(  # noqa: F821
    sm.output.checkpoint, seed=sm.params.seed, outlier=sm.params.outlier, text_outlier=sm.params.text_outlier,
    preset=sm.params.preset, text_layers=dict(sm.params.items()).get("text_layers"),
    trained=bool(dict(sm.params.items()).get("trained"))))
