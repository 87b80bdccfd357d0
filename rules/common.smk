# Shared setup: config validation, the plan, the towers, and the small functions every rule uses.
import json
import re
import sys
from pathlib import Path

from snakemake.utils import validate

# The Snakefile imports the package from src/ also when it is not pip-installed; the scripts do
# the same through workflow/scripts/_vlsens.py.
# The checkout this file belongs to (rules/..), also when the workflow is used as a module of
# another one (snakedeploy), where workflow.basedir is the other workflow's folder.
VLSENS_ROOT = Path(str(workflow.current_basedir)).parent
_SRC = str(VLSENS_ROOT / "src")
if Path(_SRC).is_dir() and _SRC not in sys.path:  # else vlsens must be pip-installed
    sys.path.insert(0, _SRC)

from vlsens import deploy as _deploy
from vlsens.core import paths
from vlsens.config import (
    GOAL_PARTS,
    SCHEMA,
    VARIANTS,
    apply_goal,
    canonical,
    check_images,
    non_finite as _non_finite,
    schema_errors,
    tolerance_for,
)
from vlsens.core.device import gpu_present
from vlsens.core.errors import ConfigError
from vlsens.dag.plan import configure, lm_config
from vlsens.task.files import resolve as _task_files
from vlsens.data.inputs import os_error_message as _os_error_message, write_manifests
from vlsens.quantize.nbits import NBitsSettings, data_aware
from vlsens.precision.weight_only import PER_CHANNEL
from vlsens.model.presets import (
    rule_names as _preset_rule_names,
    trained_dir as _trained_dir,
    uses_trained as _uses_trained,
)
from vlsens.quantize.target import check_profile_objective as _check_objective, resolve as _resolve_quant
from vlsens.dag.resources import cluster_value, compute_threads, job_cores
from vlsens.dag.targets import all_targets, toolchain_files
from vlsens.report import numbered_categories
from vlsens.core.versions import provenance as _provenance
from snakemake.settings.types import DeploymentMethod

try:
    validate(config, str(SCHEMA))  # also fills every default the schema holds
except WorkflowError:
    # Snakemake's message buries the key in a dump of the whole schema: name it first, one line each.
    raise WorkflowError("invalid configuration: " + "\n".join(schema_errors(config))) from None
_not_finite = _non_finite(config)  # NaN passes every range of the schema (it compares false with each bound)
if _not_finite:
    raise WorkflowError("invalid configuration: " + "\n".join(_not_finite))
apply_goal(config)  # goal: deploy-int4 narrows deploy.precisions (vlsens.config.GOALS)
try:  # "task": the visual question task's splits, written once in the results folder (vlsens.task.files)
    _task_files(config, paths.RESULTS)
except ConfigError as e:
    raise WorkflowError(f"invalid configuration: {e}") from None
try:
    PLAN, TOWERS = configure(config, workdir=Path.cwd())
    RUN_DIR = paths.fill(paths.MODEL, model=PLAN.model)  # the model's run folder
    # every job computes with this many threads (auto: 1 on a tiny preset; vlsens.dag.resources)
    config["threads"] = compute_threads(config["threads"], PLAN.preset)
    # The deployment target's quantization settings, resolved once (the CPU is read here).
    QUANT = _resolve_quant(config)
    for _graph, _tower in TOWERS.items():
        if _tower.analysed_variants():
            _check_objective(_tower.profile_settings()["objective"], QUANT, f"{_graph}: profile.objective")
    _deploy.check_config(config, ties=lm_config(config)["tie_word_embeddings"])
    if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
        _deploy.check_runtime(config)
    # Outside inputs by content (see vlsens.data.inputs): rules read these manifests, not mtimes.
    INPUTS = write_manifests(
        paths.fill(paths.INPUTS, model=PLAN.model),
        None if PLAN.preset else PLAN.checkpoint,
        PLAN.parity_images,
        PLAN.calib_images,
        PLAN.outside,
    )
    for _problem in check_images(INPUTS, config):
        logger.warning(f"vlsens: {_problem}")
    if config["device"] == "cuda" and workflow.local_exec and not workflow.remote_exec:
        from vlsens.core.device import cuda_visible

        if not cuda_visible():
            raise ConfigError(
                "device: cuda, but neither torch nor onnxruntime sees a CUDA device on this machine; "
                "use device: auto (CUDA where present) or cpu, or submit to GPU nodes "
                "(--workflow-profile profiles/slurm)."
            )
    # Engine "inc" runs in its own interpreter (vlsens.sensitivity.inc.env), checked here so a missing
    # environment fails before any job starts.
    INC_PYTHON, INC_VERSIONS = None, {}
    if "inc" in PLAN.engines:
        from vlsens.sensitivity.inc.env import check_config as _check_inc, resolve as _resolve_inc

        _check_inc(config, TOWERS.values())
        INC_PYTHON, INC_VERSIONS = _resolve_inc(
            config,
            VLSENS_ROOT,
            DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method,
            VLSENS_ROOT / "envs" / "inc.yaml",
        )
    # Outputs changed after their jobs wrote them, with the mtime kept (vlsens.core.outputs): checked
    # once, by the process that plans the run (not by each cluster job that parses this file again).
    if not workflow.remote_exec:
        from vlsens.core.outputs import check_run, forced_from_argv, refusal, restore_previous

        # A run killed before it could put back what its failed jobs had replaced: put it back now
        # (not while another Snakemake run holds this directory: its jobs are writing those outputs).
        if not any(Path(".snakemake/locks").glob("*")):
            for _kept in restore_previous(RUN_DIR):
                logger.warning(f"vlsens: {_kept}: restored its previous version (its job did not complete)")
        _refused = refusal(check_run(RUN_DIR), *forced_from_argv(sys.argv[1:]))
        if _refused:
            raise WorkflowError(f"vlsens: {_refused}")
except ConfigError as e:
    raise WorkflowError(f"invalid configuration: {e}") from None
except OSError as e:  # an input that cannot be read, or the results folder not writable
    raise WorkflowError(_os_error_message(e, Path.cwd() / paths.RESULTS)) from None
SCRIPTS = VLSENS_ROOT / "workflow" / "scripts"
INC_SCRIPT = str(SCRIPTS / "sensitivity_inc.py")


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    graph="|".join(re.escape(g) for g in TOWERS),
    # the variants vlsens.config knows, and those onnxsim simplifies ({base}-sim)
    base="|".join(v.removesuffix("-sim") for v in VARIANTS if v.endswith("-sim")),
    variant="|".join(VARIANTS),
    precision="|".join(_deploy.FOLDERS) + r"|plan-[A-Za-z0-9_.-]+",
    engine="ort|inc",


DEPLOY = _deploy.DEPLOY
DEPLOY_SOURCES = {
    p: _deploy.sources(p, config["deploy"]["nbits"]["vision"], config["deploy"]["nbits"]["embedding"])
    for p in _deploy.FOLDERS
}
# The {model} names the preset builders make; model.name may rename a preset
PRESET_NAMES = {kind: _preset_rule_names(kind, PLAN.preset, PLAN.model) for kind in ("tiny", "3b")}


def deploy_folders():
    """Every deploy folder the run builds: the precisions, then the peers (``peer-<name>``)."""
    if not config["deploy"]["enabled"]:
        return []
    return list(config["deploy"]["precisions"]) + [_deploy.PEER_PREFIX + p for p in config["deploy"]["peers"]]


# The task's evaluation questions every folder answers (deploy.measure.prompts: task), else None.
TASK_QUESTIONS = config["deploy"]["measure"]["prompts"] if config["deploy"]["measure"]["prompts"] != "builtin" else None


def answered_folders(wildcards):
    """Every folder's answers to the task's questions, fp32's and the plans' among them, and the
    budget's measured front (the plans' anchors; rules/deploy.smk: accuracy)."""
    names = deploy_folders() + ([f"plan-{p}" for p in searched_plans(wildcards)] if PLAN_ON else [])
    out = {n: paths.fill(DEPLOY, model=wildcards.model, precision=n) for n in names}
    if PLAN_ON:
        out["measured"] = paths.fill(paths.BUDGET_MEASURED["json"], model=wildcards.model)
    return out


def task_answers(wildcards, names):
    """The deploy folders of ``names`` and of fp32 (the reference every folder is paired with), as
    ``answers_<folder>``, whose answers.json a job reads, where the run scores its folders on the
    task (else none)."""
    if not accuracy_targets():
        return {}
    return {
        f"answers_{n}": paths.fill(DEPLOY, model=wildcards.model, precision=n) for n in dict.fromkeys(["fp32", *names])
    }


def task_questions(wildcards):
    """The task's evaluation questions a deploy job answers into its folder, where the run has them."""
    return {"questions": TASK_QUESTIONS} if TASK_QUESTIONS else {}


def accuracy_targets():
    """The accuracy table, where the run measures folders on the task."""
    if not TASK_QUESTIONS or not deploy_folders() or config["goal"] == "deploy-int4":
        return []
    return [paths.fill(f, model=PLAN.model) for f in paths.MEASURE_ACCURACY.values()]


def measured_folders(wildcards):
    """The measure record of every deploy folder but the fp32 one, the reference (rules/deploy.smk:
    measure_compare)."""
    out = {
        p: paths.fill(paths.MEASURE_FOLDER, model=wildcards.model, precision=p) for p in deploy_folders() if p != "fp32"
    }
    return {**out, **task_answers(wildcards, list(out))}


# --- the whole-VLM plan (rules/budget.smk) -------------------------------------------------

PLAN_ON = config["plan"]["enabled"] and config["deploy"]["enabled"]
# plan names: p1.. along the front (the anchors' among them; at-<anchor> should one not be picked)
PLAN_NAME = r"p[0-9]+|at-[A-Za-z0-9_.-]+|[a-z][a-z0-9_-]*"  # and plan.budgets' names
BUDGET_DECODER = {
    k: paths.fill(f"{paths.VARIANT}/{f}", graph=_deploy.DECODER_GRAPH, variant="fp32")
    for k, f in (("model", paths.MAIN), ("parity", paths.RECORD))
}


def budget_formats(wildcards):
    """Every graph a plan may take: the fp32 decoder (its folder holds the fp32 table), the vision
    graph in each of ``plan.vision``'s formats and fp32, the table in each of ``plan.embedding``'s."""
    fill = lambda p: paths.fill(p, model=wildcards.model)  # noqa: E731
    out = {"decoder_model": fill(BUDGET_DECODER["model"]), "decoder_parity": fill(BUDGET_DECODER["parity"])}
    for fmt in ("fp32", *(f for f in config["plan"]["vision"] if f != "mixed")):
        out[f"vision_{fmt}"] = fill(_deploy.vision_source(fmt))
    for fmt in config["plan"]["embedding"]:
        out[f"embedding_{fmt}"] = fill(_deploy.embedding_source(fmt))
    return out


def mixed_vision_ops(wildcards):
    """With ``mixed`` in plan.vision: the vision Linears' table the front's search draws the mixed
    vision curve from."""
    if "mixed" not in config["plan"]["vision"]:
        return {}
    return {"vision_ops": paths.fill(paths.BUDGET_VISION["csv"], model=wildcards.model)}


def mixed_vision_reference(wildcards):
    """With ``mixed`` in plan.vision: the dynamic vision graph's reference cases (a plan folder
    gates its mixed vision graph on them)."""
    if "mixed" not in config["plan"]["vision"]:
        return {}
    return {"vision_reference": paths.fill(paths.REFERENCE, model=wildcards.model, graph=_deploy.VISION_GRAPH)}


def plan_calibration(wildcards):
    """With a data-aware algorithm in plan.algorithms (gptq): the decoder's calibration split, which
    it reads (never the measure's cases it is scored on)."""
    if not data_aware(config["plan"]["algorithms"]):
        return {}
    return {"calibration": paths.fill(CALIB["calib"], model=wildcards.model, graph=_deploy.DECODER_GRAPH)}


#: GPTQ's codes per decoder MatMul, computed once by budget_nbits and read by the plans
#: (vlsens.quantize.gptq.Store).
BUDGET_GPTQ = f"{paths.BUDGET}/gptq"


def tiny_text_layers():
    """tiny_checkpoint's ``text_layers`` param (model.tiny.text_layers), only where not the
    preset's 2: the published preset keeps its params."""
    n = config["model"].get("tiny", {}).get("text_layers", 2)
    return {} if n == 2 else {"text_layers": int(n)}


def tiny_weights():
    """tiny_checkpoint's ``trained`` param where the preset is built from the weights vlsens ships
    (model.tiny.weights), with their digest: shipping retrained weights rebuilds the checkpoint."""
    if not _uses_trained(PLAN.preset, config["model"].get("tiny") or {}):
        return {}
    from vlsens.core.fsutil import file_sha256

    return {"trained": file_sha256(_trained_dir(PLAN.preset) / "model.safetensors")}


def decoder_measured():
    """budget_nbits' ``measured`` param (plan.decoder_measured), only where not ``all``: a run that
    measures every MatMul keeps its params, so it does not run again."""
    m = config["plan"].get("decoder_measured", "all")
    return {} if m == "all" else {"measured": int(m)}


def gptq_store():
    """budget_nbits's store of GPTQ codes (an output) where a data-aware algorithm is configured."""
    return {"gptq": directory(BUDGET_GPTQ)} if data_aware(config["plan"]["algorithms"]) else {}


def plan_data(wildcards):
    """A plan folder's calibration split and the run's GPTQ codes (what budget_nbits computed), where
    a data-aware algorithm is configured."""
    out = plan_calibration(wildcards)
    return {**out, "gptq": paths.fill(BUDGET_GPTQ, model=wildcards.model)} if out else out


def anchors():
    """The folders the plan is held against: the builder's int4 folders and the peers."""
    return [p for p in deploy_folders() if p in _deploy.INT4 and p != "int4-mixed" or p.startswith(_deploy.PEER_PREFIX)]


def anchor_folders(wildcards):
    """The anchors' deploy folders (the front's search plans one folder at each one's bytes)."""
    return {f"anchor_{p}": paths.fill(DEPLOY, model=wildcards.model, precision=p) for p in anchors()}


def searched_plans(wildcards):
    """The names of the plans the front's search wrote (a checkpoint: known once it has run)."""
    plans_dir = checkpoints.budget_front.get(model=wildcards.model).output.plans
    return sorted(Path(f).stem for f in Path(plans_dir).glob("*.yaml"))


def plan_folders(wildcards):
    """Every plan folder the front's search wrote a plan for, as ``plan_<name>``."""
    return {
        f"plan_{p}": paths.fill(DEPLOY, model=wildcards.model, precision=f"plan-{p}") for p in searched_plans(wildcards)
    }


def budget_measures(wildcards):
    """The measure records the measured front is drawn from: every plan the front's search wrote,
    and the anchors and int4-mixed."""
    names = [f"plan-{p}" for p in searched_plans(wildcards)]
    names += [p for p in deploy_folders() if p in anchors() or p == "int4-mixed"]
    out = {n: paths.fill(paths.MEASURE_FOLDER, model=wildcards.model, precision=n) for n in names}
    return {**out, **task_answers(wildcards, names)}


def recommend_items(wildcards):
    """(kind, name, path) of what the recommendation reads (rules/report.smk): every deploy and
    plan folder the goal builds, their measure where the run measures them, the plan's measured
    front, and each fixed-size graph's NPU parts with the INT8 profile of that variant."""
    goal, m, out = config["goal"], wildcards.model, []
    builds = GOAL_PARTS[goal]
    if "deploy" in builds and deploy_folders():
        names = deploy_folders() + ([f"plan-{p}" for p in searched_plans(wildcards)] if PLAN_ON else [])
        out += [("folder", n, paths.fill(DEPLOY, model=m, precision=n)) for n in names]
        if goal != "deploy-int4" and len(deploy_folders()) > 1:
            out += [
                ("measure", n, paths.fill(paths.MEASURE_FOLDER, model=m, precision=n)) for n in names if n != "fp32"
            ]
        if PLAN_ON:
            out.append(("measured", "front", paths.fill(paths.BUDGET_MEASURED["json"], model=m)))
        out += [("accuracy", "table", path) for path in accuracy_targets() if path.endswith(".json")]
    if "npu" in builds:
        for g, t in TOWERS.items():
            for v in t.parts_variants():
                out.append(("parts", f"{g}/{v}", paths.fill(paths.PARTS, model=m, graph=g, variant=v)))
                if v in t.analysed_variants():
                    prof = paths.fill(paths.PROFILE, model=m, graph=g, variant=v)
                    out.append(("profile", f"{g}/{v}", f"{prof}/{paths.PROFILE_FILES['eval']}"))
            if toolchain_files(t):
                out += [
                    ("toolchain", f"{g}/{v}", paths.fill(paths.TOOLCHAIN, model=m, graph=g, variant=v))
                    for v in t.analysed_variants()
                ]
    return out


def recommend_inputs(wildcards):
    return {f"{kind}_{i}": path for i, (kind, _, path) in enumerate(recommend_items(wildcards))}


def recommend_params(wildcards):
    """recommend_items by kind: {kind: {name: path}} (the script's arguments)."""
    out = {}
    for kind, name, path in recommend_items(wildcards):
        out.setdefault(kind, {})[name] = path
    return out


def recommend_target():
    """The recommendation, where the goal builds something to ship."""
    parts = GOAL_PARTS[config["goal"]]
    builds = ("deploy" in parts and deploy_folders()) or (
        "npu" in parts and any(t.parts_variants() for t in TOWERS.values())
    )
    return [paths.fill(paths.RECOMMEND["json"], model=PLAN.model)] if builds else []


def get_final_output():
    deploy = config["deploy"]["precisions"] if config["deploy"]["enabled"] else []
    measure = (
        [paths.fill(f, model=PLAN.model) for f in paths.MEASURE_COMPARE.values()] if len(deploy_folders()) > 1 else []
    )
    int4 = (
        [paths.fill(f, model=PLAN.model) for f in paths.DEPLOY_INT4.values()] if set(deploy) & set(_deploy.INT4) else []
    )
    if "int4-mixed" in deploy and config["report"]["enabled"]:
        folder = paths.fill(paths.REPORT, model=PLAN.model)
        int4 += [f"{folder}/{paths.REPORT_FILES[k]}" for k in ("int4_pareto", "nbits_heatmap")]
    # what the goal builds (vlsens.config.GOAL_PARTS; npu and analyse turn deploy off: apply_goal)
    parts = {k: k in GOAL_PARTS[config["goal"]] for k in ("analysis", "npu")}
    graphs = all_targets(
        PLAN, TOWERS.values(), config["report"]["enabled"], bool(config["embeddings"]["dtypes"]), **parts
    )
    if config["goal"] == "deploy-int4":  # the two folders, not their side-by-side table or measure
        return [paths.fill(DEPLOY, model=PLAN.model, precision=p) for p in deploy_folders()] + recommend_target()
    return (
        graphs
        + recommend_target()
        + [paths.fill(DEPLOY, model=PLAN.model, precision=p) for p in deploy_folders()]
        + int4
        + measure
        + ([paths.fill(f, model=PLAN.model) for f in paths.BUDGET_MEASURED.values()] if PLAN_ON else [])
        + accuracy_targets()
    )


def heuristic_input(wildcards):
    """The builder's k_quant_mixed decoder (llama.cpp's heuristic), where the run builds it: the
    int4-mixed profile is compared with it at its weight bytes."""
    if "int4-k_quant_mixed" not in config["deploy"]["precisions"] or not config["deploy"]["enabled"]:
        return {}
    return {
        "heuristic": paths.fill(
            f"{paths.BUILDER_INT4}/{paths.MAIN}", model=wildcards.model, graph=wildcards.graph, algo="k_quant_mixed"
        )
    }


def int4_folders(wildcards):
    """The int4 deploy folders the run builds, by precision, and the fp32 / fp16 folders their
    sizes are compared with (rules/deploy.smk: deploy_int4)."""
    return {
        p: paths.fill(DEPLOY, model=wildcards.model, precision=p)
        for p in config["deploy"]["precisions"]
        if p in _deploy.INT4 or p in ("fp32", "fp16")
    }


def tower(wildcards):
    return TOWERS[wildcards.graph]


# --- inputs ----------------------------------------------------------------------------------


def checkpoint_dir(wildcards):
    """A preset's directory (built by a rule), or a local checkpoint's content manifest."""
    return PLAN.checkpoint if PLAN.preset else INPUTS["checkpoint"]


def toolchain_inputs(wildcards):
    """What the toolchain job reads: the profile (its QDQ model as ``qdq``), the graph's variant
    and calibration archive, and the variant's parts with their archives where the graph is cut."""
    t = tower(wildcards)
    w = {"model": wildcards.model, "graph": wildcards.graph, "variant": wildcards.variant}
    prof = paths.fill(paths.PROFILE, **w)
    out = {
        **{k: f"{prof}/{paths.PROFILE_FILES[k]}" for k in ("profile", "eval")},
        "qdq": f"{prof}/{paths.PROFILE_FILES['model']}",
        "model": paths.fill(paths.in_variant(), **w),
        "parity": paths.fill(record("{variant}"), **w),
        "calib_tar": f"{paths.fill(paths.CALIB, **w)}/{paths.NPU_FILES['calib_tar']}",
    }
    if wildcards.variant == "fp32-smooth" and "fp32" in t.analysed_variants():
        out["unsmoothed"] = f"{paths.fill(paths.PROFILE, **{**w, 'variant': 'fp32'})}/{paths.PROFILE_FILES['eval']}"
    if wildcards.variant in t.parts_variants() and t.parts_calibration():
        out["parts"] = paths.fill(paths.PARTS, **w)
        out["parts_calib"] = paths.fill(paths.PARTS_CALIB, **w)
    return out


def calibration_inputs(wildcards):
    return {"checkpoint": checkpoint_dir(wildcards), **tower(wildcards).calibration_inputs(wildcards.model, INPUTS)}


#: A graph's calibration folder (calib.npz, eval.npz, manifest.json), and its calibration and
#: evaluation sets as named inputs.
CALIB = paths.files(paths.CALIB, paths.CALIB_FILES)
CALIB_SETS = {k: CALIB[k] for k in ("calib", "eval")}


#: The ort engine's folder (paths.ENGINE_FILES).
ENGINE = paths.files(paths.ENGINE, paths.ENGINE_FILES)


def engine_files(*names):
    """Files of the ort engine's folder, as named inputs."""
    return {name: ENGINE[name] for name in names}


def record(variant):
    """The parity record of a variant folder: what a consumer of its graphs depends on (every
    graph file is listed in it with its hash, and checked when read)."""
    return paths.in_variant(variant, paths.RECORD)


def variant_inputs(variant="{variant}"):
    """What a job that transforms or cuts a variant folder reads: its main graph, its parity
    record (every graph file of the folder, by hash) and the reference cases it is gated on."""
    return {"model": paths.in_variant(variant), "parity": record(variant), "reference": paths.REFERENCE}


def weights_inputs(graph=None):
    """What a graph built from the checkpoint's weights and gated on them reads: the checkpoint,
    the fp32 record and the reference cases, of ``graph`` (default: the ``graph`` wildcard's)."""
    at = (lambda p: paths.fill(p, graph=graph)) if graph else (lambda p: p)
    return {"checkpoint": checkpoint_dir, "parity": at(record("fp32")), "reference": at(paths.REFERENCE)}


def gated(model):
    """The outputs of a gated graph: ``model`` (its main graph file), its external data and the
    parity record beside it (``model``, ``data``, ``parity``)."""
    return {"model": model, "data": paths.data(model), "parity": f"{model.rpartition('/')[0]}/{paths.RECORD}"}


def analysed_model(wildcards, variant=None):
    """The graph file the engines and the profile read (``model.onnx``, or the text tower's
    ``embeds.onnx``) of a variant folder (default: the ``variant`` wildcard's)."""
    folder = paths.fill(
        paths.VARIANT, model=wildcards.model, graph=wildcards.graph, variant=variant or wildcards.variant
    )
    return f"{folder}/{tower(wildcards).analysed}"


def profile_bases(wildcards):
    """The built variants the profile's latency is compared with, by their records: its own base
    and fp32 (an fp32 profile does not read the fp16 model, so rebuilding fp16 leaves it be)."""
    return {
        v: paths.fill(record(v), model=wildcards.model, graph=wildcards.graph)
        for v in dict.fromkeys(("fp32", wildcards.variant))
        if v in tower(wildcards).variants()
    }


def profile_models(wildcards):
    return {v: analysed_model(wildcards, v) for v in profile_bases(wildcards)}


def shard_csvs(wildcards):
    n = config["sensitivity"]["shards"]
    return [f"{paths.fill(paths.SHARD, i=i, n=n, **dict(wildcards.items()))}.csv" for i in range(n)]


def deploy_inputs(wildcards):
    """A deploy folder's graphs (vlsens.deploy.sources), the checkpoint, the evaluation images,
    and (every folder but fp32) the fp32 folder it is measured against, transformers' features
    of the evaluation images (the vision parity's reference) and the fp32 folder's logits on the
    evaluation cases (the evaluation's reference), each computed once."""
    src = {k: paths.fill(v, model=wildcards.model) for k, v in DEPLOY_SOURCES[wildcards.precision].items()}
    src["checkpoint"] = checkpoint_dir(wildcards)
    src["images"] = INPUTS["parity_images"]
    src.update(task_questions(wildcards))
    if wildcards.precision != "fp32":
        src["fp32_folder"] = paths.fill(DEPLOY, model=wildcards.model, precision="fp32")
        src["vision_features"] = paths.fill(paths.DEPLOY_VISION_FEATURES, model=wildcards.model)
        src["fp32_logits"] = paths.fill(paths.DEPLOY_EVAL_LOGITS, model=wildcards.model)
    return src


# --- report (rules/report.smk) ------------------------------------------------------------


def preset_input(wildcards):
    """The tiny preset's checkpoint (its vlsens_preset.json says where outliers were planted)."""
    return {"checkpoint": PLAN.checkpoint} if PLAN.preset else {}


def preset_json(wildcards, input):
    return f"{input.checkpoint}/vlsens_preset.json" if PLAN.preset else None


def report_profiles(wildcards):
    """``"<graph>/<variant>"`` -> the profile's eval.json, every analysed graph and variant."""
    return {
        f"{g}/{v}": paths.fill(
            f"{paths.PROFILE}/{paths.PROFILE_FILES['eval']}", model=wildcards.model, graph=g, variant=v
        )
        for g, t in TOWERS.items()
        for v in t.analysed_variants()
    }


def report_base_records(wildcards):
    """graph -> {fp32, fp16: parity.json} of the profiled graphs (their sizes)."""
    return {
        g: {v: paths.fill(record(v), model=wildcards.model, graph=g) for v in ("fp32", "fp16") if v in t.variants()}
        for g, t in TOWERS.items()
        if t.analysed_variants()
    }


def report_deploy(wildcards):
    precisions = config["deploy"]["precisions"] if config["deploy"]["enabled"] else []
    return {p: paths.fill(DEPLOY, model=wildcards.model, precision=p) for p in precisions}


def report_latency_inputs(wildcards):
    records = report_base_records(wildcards)
    return [
        *report_profiles(wildcards).values(),
        *report_deploy(wildcards).values(),
        *(p for vs in records.values() for p in vs.values()),
    ]


def report_records(wildcards):
    """Every variant folder's parity record (the deploy folders' are read inside the folders)."""
    return [paths.fill(record(v), model=wildcards.model, graph=g) for g, t in TOWERS.items() for v in t.variants()]


def landing_page():
    """The report's first page: the run's verdict (rule report_tables) where it was written, else
    the workflow's description alone."""
    verdict = Path(paths.fill(paths.REPORT, model=PLAN.model)) / paths.REPORT_FILES["verdict"]
    return str(verdict.resolve()) if verdict.is_file() else "report/workflow.rst"


def report_item(path, caption, category, subcategory, **labels):
    """An output marked for the report (``snakemake --report``), its caption one of report/*.rst."""
    return report(path, caption=f"../report/{caption}", category=category, subcategory=subcategory, labels=labels)


def report_figure(figure, caption, category, **labels):
    """A figure of ``paths.FIGURE_FILES`` marked for the report, one subcategory per graph."""
    path = f"{paths.REPORT_FIGURES}/{paths.FIGURE_FILES[figure]}"
    return report_item(path, caption, category, "{graph}", graph="{graph}", base="{variant}", **labels)


def report_file(name, caption, category, subcategory, **labels):
    """A figure or table of the whole model (``paths.REPORT_FILES``) marked for the report."""
    return report_item(f"{paths.REPORT}/{paths.REPORT_FILES[name]}", caption, category, subcategory, **labels)


# --- params ----------------------------------------------------------------------------------


def tolerance(variant):
    return tolerance_for(config, variant)


def nbits_tolerances():
    """The two gates of a weight-only INT4 graph: against transformers run on the graph's own
    dequantized weights with float activations at FP32's tolerance (``exact_tolerance``), and as
    shipped at ``deploy.nbits.tolerance``."""
    return {"tolerance": canonical(config["deploy"]["nbits"]["tolerance"]), "exact_tolerance": tolerance("fp32")}


def nbits_settings():
    """``deploy.nbits``' quantization settings alone (not its tolerance or vision choice): a param of
    the rules that quantize, so only a change of these re-runs them."""
    return canonical(NBitsSettings.from_config(config["deploy"]["nbits"]).as_dict())


def builder_settings():
    """The same for the builder's anchors: ``deploy.nbits.builder_block_size`` (when set) in
    place of ``block_size``."""
    from dataclasses import replace

    nb = config["deploy"]["nbits"]
    settings = NBitsSettings.from_config(nb)
    if nb.get("builder_block_size"):
        settings = replace(settings, block_size=int(nb["builder_block_size"]))
    return canonical(settings.as_dict())


def quant_settings(*unused):
    """``sensitivity.*`` for ``quant.target`` (vlsens.quantize.target.resolve): a param of every engine
    rule, so a change of target or saturation guard re-runs the analysis and the profiles; ``unused``:
    keys the rule does not read (a change of them re-runs nothing there)."""
    return canonical({k: v for k, v in QUANT.items() if k not in unused})


def tower_settings(stage):
    """A tower's settings for ``stage`` (reference, export, calibration, profile), as a param."""
    return lambda wc: canonical(getattr(tower(wc), f"{stage}_settings")())


def provenance(stage, script):
    """Rerun trigger: library versions and the hash of the vlsens code the script runs."""
    return _provenance(stage, SCRIPTS / script)


def inc_command(task, outputs, options):
    """The command line of an engine inc task (rules/sensitivity.smk): ``task`` (a flag), its
    ``outputs`` and ``options``; the script runs with INC's interpreter (``params.python``)."""
    return (
        f"{{params.python}} {{params.script}}{task} --model {{params.model:q}} --calib {{input.calib:q}}"
        f" --eval {{input.eval:q}} {outputs} --log {{log:q}}"
        f" --settings {{params.settings:q}} {options} --threads {{resources.compute_threads}}"
    )


def inc_provenance():
    """Engine inc records its own environment's versions (``INC_VERSIONS``) and its code."""
    return {"versions": INC_VERSIONS, "code": provenance("sensitivity", "sensitivity_inc.py")["code"]}


_TOWER_PROVENANCE = {}


def tower_provenance(stage, script):
    """The same for a stage that runs its tower's code: the tower's module and libraries count."""

    def get(wc):
        t = tower(wc)
        key = (stage, script, type(t))  # one hash per kind of tower, not per graph
        if key not in _TOWER_PROVENANCE:
            _TOWER_PROVENANCE[key] = _provenance(
                stage, SCRIPTS / script, type(t).__module__, libraries=t.libraries.get(stage)
            )
        return _TOWER_PROVENANCE[key]

    return get


# --- resources ---------------------------------------------------------------------------------


_GPU_HERE = gpu_present()


def gpu_tokens():
    """Whether jobs that run torch or ONNX Runtime take a ``gpu`` token: where they use a GPU
    (``device: cuda``, or ``auto`` on a host with one) and whenever jobs are submitted to a
    cluster, whose nodes may have one. A local run on a CPU-only host declares none, so its jobs
    do not queue one at a time for a token nothing uses. Asked when jobs are made, not when the
    Snakefile is read: the executor (local or SLURM) is known only then."""
    return (
        not workflow.local_exec
        or workflow.remote_exec
        or config["device"] == "cuda"
        or (config["device"] == "auto" and _GPU_HERE)
    )


def cores(compute):
    """``threads:`` of a rule whose job computes with ``compute`` threads (an int or a function of
    the wildcards): the cores it reserves from ``--cores`` (``vlsens.dag.resources.job_cores``)."""
    return lambda wildcards: job_cores(
        config["job_cores"], compute(wildcards) if callable(compute) else compute, PLAN.preset
    )


def calibration_threads(wildcards):
    """The calibration job computes with ``threads`` where it runs the model, else with one."""
    return config["threads"] if tower(wildcards).calibration_runs_model else 1


def cluster(rule, gpu=True, threads=1):
    """Resources of a rule: ``gpu`` (1 for rules that run torch or ONNX Runtime where
    :func:`gpu_tokens`; a function of the wildcards where it depends on the tower),
    ``compute_threads`` (what the job computes with, ``threads``, whatever :func:`cores` it
    reserves: its numbers do not depend on ``--cores``) and what SLURM gets from the config's
    ``cluster:`` section: partition by GPU use, memory and runtime per rule name (or ``default``),
    optionally per graph (``vlsens.dag.resources.cluster_value``)."""
    c = config["cluster"]
    declared = gpu if callable(gpu) else (lambda wc: int(bool(gpu)))

    def wants_gpu(wc):
        return declared(wc) if gpu_tokens() else 0

    return {
        "gpu": wants_gpu,
        "compute_threads": threads,
        "slurm_partition": lambda wc: c["gpu_partition" if wants_gpu(wc) else "cpu_partition"],
        "mem_mb": lambda wc: cluster_value(c["mem_mb"], rule, wc.get("graph", wc.get("precision"))),
        "runtime": lambda wc: cluster_value(c["runtime"], rule, wc.get("graph", wc.get("precision"))),
    }
