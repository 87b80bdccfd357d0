# Shared setup: config validation, the plan, and the small functions every rule uses.
import sys
from pathlib import Path

from snakemake.utils import validate

# The Snakefile imports the package from src/ also when it is not pip-installed; the scripts do
# the same through workflow/scripts/_vlsens.py.
_SRC = str(Path(workflow.basedir) / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from vlsens.config import RESULTS, all_targets, canonical, check_images, make_plan, schema_errors, tolerance_for
from vlsens.errors import ConfigError
from vlsens.inputs import write_manifests
from vlsens.versions import script_code_version, stage_versions
from snakemake.settings.types import DeploymentMethod

_SCHEMA = Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"
try:
    validate(config, str(_SCHEMA))
except WorkflowError:
    # Snakemake's message buries the key in a dump of the whole schema: name it first, one line each.
    raise WorkflowError("invalid configuration: " + "\n".join(schema_errors(config, _SCHEMA))) from None
try:
    PLAN = make_plan(config, workdir=Path.cwd())
    # Outside inputs by content (see vlsens.inputs): rules read these manifests, not mtimes.
    INPUTS = write_manifests(
        f"{RESULTS}/{PLAN.model}/inputs", None if PLAN.preset else PLAN.checkpoint,
        PLAN.parity_images, PLAN.calib_images, PLAN.prompt_file, PLAN.prompt_images)
    for _problem in check_images(INPUTS, config):
        logger.warning(f"vlsens: {_problem} (image_checks.on_problem: warn)")
    if config["device"] == "cuda" and workflow.local_exec and not workflow.remote_exec:
        from vlsens.device import cuda_visible

        if not cuda_visible():
            raise ConfigError("device: cuda, but neither torch nor onnxruntime sees a CUDA device on this machine; "
                              "use device: auto (CUDA where present) or cpu, or submit to GPU nodes "
                              "(--workflow-profile profiles/slurm).")
except ConfigError as e:
    raise WorkflowError(f"invalid configuration: {e}") from None

# Engine "inc" runs in its own interpreter: envs/inc.yaml under --use-conda, else
# sensitivity.inc.python (default .venv-inc/bin/python, made by `make inc-env`), checked here so
# a missing environment fails before any job starts.
INC_PYTHON, INC_VERSIONS = None, {}
if "inc" in PLAN.engines:
    from vlsens.inc_env import check_interpreter, pinned_versions, resolve_python

    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
        INC_PYTHON = "python"
        INC_VERSIONS = pinned_versions(Path(workflow.basedir) / "envs" / "inc.yaml")
    else:
        INC_PYTHON = resolve_python(config["sensitivity"]["inc"]["python"], workflow.basedir)
        try:
            INC_VERSIONS = check_interpreter(INC_PYTHON)
        except ConfigError as e:
            raise WorkflowError(f"invalid configuration: {e}") from None
INC_SCRIPT = str(Path(workflow.basedir) / "workflow" / "scripts" / "sensitivity_inc.py")


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    size=r"[0-9]+x[0-9]+",
    base="fp32|fp16",
    variant="fp32|fp16",
    engine="ort|inc",


def get_final_output():
    return all_targets(PLAN)


def checkpoint_dir(wildcards):
    """A preset's directory (built by a rule), or a local checkpoint's content manifest."""
    return PLAN.checkpoint if PLAN.preset else INPUTS["checkpoint"]


def parity_images():
    """The parity images' manifest (paths, names, sha256): edited images re-run what reads them."""
    return INPUTS["parity_images"]


def tolerance(variant):
    return tolerance_for(config, variant)


def calibration_images():
    return INPUTS["calibration_images"]


def shards_under(path):
    """Input function: the shard CSVs of one analysis, ``path`` formatted with the wildcards."""

    def csvs(wildcards):
        n = config["sensitivity"]["shards"]
        base = path.format(**dict(wildcards.items()))
        return [f"{base}/shards/ort.{i}-of-{n}.csv" for i in range(n)]

    return csvs


shard_csvs = shards_under("results/{model}/sensitivity/vision/{size}/{variant}")
text_shard_csvs = shards_under("results/{model}/sensitivity/text/{variant}")
dynamic_shard_csvs = shards_under("results/{model}/sensitivity/vision/dynamic/{variant}")


def quant_settings():
    s = config["sensitivity"]
    return {k: s[k] for k in ("op_types", "activation_type", "weight_type", "per_channel", "calibrate_method")}


def inc_settings_json():
    import json

    return json.dumps(canonical(quant_settings()), sort_keys=True)


def inc_versions():
    return INC_VERSIONS



def text_prompt_files():
    """The manifest of text.calibration.prompts' JSONL and its images (none for builtin)."""
    return [INPUTS["text_prompts"]] if "text_prompts" in INPUTS else []


def code(script):
    """Hash of the vlsens code a workflow script runs (rerun trigger through params)."""
    return script_code_version(Path(workflow.basedir) / "workflow" / "scripts" / script)


# Cluster resources (profiles/slurm): partition by GPU use, memory and runtime per rule name.
def partition(gpu):
    return config["cluster"]["gpu_partition" if gpu else "cpu_partition"]


def mem_mb(rule):
    m = config["cluster"]["mem_mb"]
    return int(m.get(rule, m.get("default", 8000)))


def runtime(rule):
    r = config["cluster"]["runtime"]
    return int(r.get(rule, r.get("default", 60)))

