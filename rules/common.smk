# Shared setup: config validation, the plan, and the small functions every rule uses.
import sys
from pathlib import Path

from snakemake.utils import validate

# The Snakefile imports the package from src/ also when it is not pip-installed; the scripts do
# the same through workflow/scripts/_vlsens.py.
_SRC = str(Path(workflow.basedir) / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from vlsens.config import make_plan, tolerance_for, vision_targets
from vlsens.errors import ConfigError
from vlsens.versions import stage_versions


validate(config, "../workflow/schemas/config.schema.yaml")
try:
    PLAN = make_plan(config, workdir=Path.cwd())
except ConfigError as e:
    raise WorkflowError(f"invalid configuration: {e}") from None


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    size=r"[0-9]+x[0-9]+",
    base="fp32|fp16",


def get_final_output():
    return vision_targets(PLAN)


def checkpoint_dir(wildcards):
    return PLAN.checkpoint_dir()


def parity_images():
    return [str(r.path) for r in PLAN.parity_images]


def parity_image_names():
    return [r.name for r in PLAN.parity_images]


def tolerance(variant):
    return tolerance_for(config, variant)
