"""The config, checked: schema, defaults, the checks a schema cannot express.

The JSON schema (``workflow/schemas/config.schema.yaml``) checks types and holds every default
(:func:`with_defaults` fills them, as Snakemake's ``validate`` does); this module checks what a
schema cannot (that the checkpoint directory is a usable safetensors checkpoint, that images and
prompts exist, tolerances, the tiny preset's planted outliers) and raises
:class:`~vlsens.core.errors.ConfigError` naming the key, the value and what would be valid. It runs
when the DAG is built, so bad input fails before any job starts. It imports no stage: towers
(:mod:`vlsens.export.towers`) check their own keys, and engine ``inc`` its environment
(:mod:`vlsens.sensitivity.inc.env`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from vlsens.core.errors import ConfigError, ImageError
from vlsens.core.sizes import parse_size, size_str
from vlsens.data.images import ImageRef, resolve_images
from vlsens.model.presets import PRESETS

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
VARIANTS = ("fp32", "fp16", "bf16", "fp32-sim", "fp16-sim", "fp32-smooth")
#: ``workflow/schemas/`` is also the package's ``vlsens/schemas`` (a link in the source tree, files
#: in a built wheel), so an installed vlsens finds its schemas without the repository.
SCHEMA = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"


def load_schema(path: str | Path = SCHEMA) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text())


#: A number YAML 1.1 reads as text (no dot before the exponent: ``1e-12``).
FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def takes_list(key: str, schema: dict | None = None) -> bool:
    """Whether the dotted config ``key`` holds a list (its schema node, or one of its alternatives,
    is an array): ``--set vision.sizes=224x224`` then means ``[224x224]``."""
    node = schema or load_schema()
    for part in key.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return False
    kinds = [node, *node.get("anyOf", []), *node.get("oneOf", [])]
    return any(k.get("type") == "array" or "array" in (k.get("type") if isinstance(k.get("type"), list) else [])
               for k in kinds)


def with_defaults(config: dict, schema: dict | None = None) -> dict:
    """A copy of ``config`` with every default of the schema filled in (nested objects too)."""
    schema = schema or load_schema()
    out = copy.deepcopy(config)

    def fill(node: Any, sch: dict) -> None:
        if "$ref" in sch:
            sch = schema["$defs"][sch["$ref"].rsplit("/", 1)[1]]
        if isinstance(node, list) and isinstance(sch.get("items"), dict):
            for item in node:
                fill(item, sch["items"])
        if not isinstance(node, dict):
            return
        for key, sub in (sch.get("properties") or {}).items():
            if key not in node and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                fill(node[key], sub)

    fill(out, schema)
    return out


#: Keys that moved, old -> new: every tower reads ``variants`` and ``sensitivity_variants`` from its
#: own section (vision, vision.dynamic, vision.uint8, vision.video, text, deploy.decoder, towers[]).
RENAMED = {
    "sensitivity.variants": "vision.sensitivity_variants",
    "text.sensitivity.variants": "text.sensitivity_variants",
}


def renamed_keys(config: dict) -> list[str]:
    """One message per old key ``config`` still uses, naming its new key."""
    out = []
    for old, new in RENAMED.items():
        node = config
        for part in old.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out.append(f"{old}: renamed to {new} (each tower reads variants and sensitivity_variants from its own "
                       f"section); write {new}: {node}")
    return out


def schema_errors(config: dict, schema_path: str | Path = SCHEMA) -> list[str]:
    """Schema violations of ``config``, one line each, the offending key first, with a close match
    for a misspelled key (Snakemake's own message buries the key in a dump of the whole schema)."""
    import difflib

    import jsonschema

    schema = load_schema(schema_path)
    cls = jsonschema.validators.validator_for(schema)
    out = renamed_keys(config)
    moved = set(RENAMED) | {old.rsplit(".", 1)[0] for old in RENAMED if old.count(".") > 1}  # said above
    for err in sorted(cls(schema).iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(p) for p in err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = list((err.schema or {}).get("properties", {}))
            for key in sorted(k for k in err.instance if k not in allowed):
                full = f"{where}.{key}" if where else str(key)
                if full in moved:
                    continue
                near = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
                hint = f" (did you mean '{near[0]}'?)" if near else f" (valid here: {', '.join(allowed)})"
                out.append(f"{full}: unknown key{hint}")
        elif err.validator == "required":
            out.append(f"{where + ': ' if where else ''}{err.message}")
        else:
            hint = ""
            if err.validator == "type" and isinstance(err.instance, str) and FLOAT_TEXT.fullmatch(err.instance.strip()):
                hint = (f" (YAML reads {err.instance} as text: write it with a dot, "
                        f"{float(err.instance.strip())!r})")
            elif err.validator in ("oneOf", "anyOf") and err.context:  # what each alternative wanted
                hint = f" ({'; '.join(dict.fromkeys(e.message for e in err.context))})"
            out.append(f"{where or '<config>'}: {err.message}{hint}")
    return out


def non_finite(config: Any, where: str = "") -> list[str]:
    """One line for each NaN or infinite number in ``config`` (the schema's ranges let them pass:
    NaN compares false with every bound), naming its key."""
    import math

    if isinstance(config, dict):
        return [e for k, v in config.items() for e in non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(config, (list, tuple)):
        return [e for i, v in enumerate(config) for e in non_finite(v, f"{where}[{i}]")]
    if isinstance(config, float) and not math.isfinite(config):
        return [f"{where or '<config>'}: {config} is not a number a run can use (NaN and infinity are refused; "
                "write a finite number)"]
    return []


#: What each ``goal`` builds (the default target; rules/common.smk: get_final_output).
GOALS = {
    "all": "everything the config asks for",
    "deploy": "the deploy folders of deploy.precisions and deploy.peers, their measure and (plan.enabled) the plan's "
              "folders",
    "deploy-int4": "the fp32 and int4-mixed deploy folders (and the graphs and profiles behind them)",
    "npu": "the fixed-size graphs' NPU parts, calibration archives, token-table binaries, their profiles for an NPU "
           "(quant.target npu unless qnn is set: W8A8 / W8A16 / float per op) with fp32-smooth beside fp32, and the "
           "toolchains' files",
    "analyse": "the graphs, variants, sensitivity tables, profiles and report, no deploy folder",
}
#: What each goal's default target holds: ``analysis`` (graphs, variants, sensitivity, profiles,
#: report), ``npu`` (parts, archives, token binaries and the profiles behind them), ``deploy``
#: (the deploy folders and what measures them).
GOAL_PARTS = {"all": {"analysis", "npu", "deploy"}, "deploy": {"deploy"}, "deploy-int4": {"deploy"}, "npu": {"npu"},
              "analyse": {"analysis"}}
#: The folders ``goal: deploy-int4`` builds (deploy.precisions is narrowed to them).
INT4_GOAL_FOLDERS = ["fp32", "int4-mixed"]


def apply_goal(config: dict) -> None:
    """Narrow a validated config to what its ``goal`` needs: ``deploy-int4`` builds the fp32 and
    int4-mixed folders only, so the precisions those folders are compared with (the builder's
    anchors, the peers, the plan) are not planned either; ``npu`` and ``analyse`` build no deploy
    folder (so the report, too, reads none), and ``npu`` profiles for an NPU target with the
    ``fp32-smooth`` variants beside the FP32 graphs (:func:`_npu_goal`)."""
    goal = config.get("goal")
    if goal == "deploy-int4":
        d = config["deploy"]
        d["enabled"] = True
        d["precisions"] = list(INT4_GOAL_FOLDERS)
        d["peers"] = []
        config["plan"]["enabled"] = False
    elif goal in ("npu", "analyse"):
        config["deploy"]["enabled"] = False
        config["plan"]["enabled"] = False
        if goal == "npu":
            _npu_goal(config)


def _npu_goal(config: dict) -> None:
    """``goal: npu``: profiles for an NPU (``quant.target: npu`` unless the config names ``qnn``),
    and beside each analysed FP32 fixed-size graph its ``fp32-smooth`` variant (outliers migrated,
    :mod:`vlsens.variants.smoothquant`), built, analysed and cut into parts like the FP32 graph."""
    if config["quant"]["target"] != "qnn":
        config["quant"]["target"] = "npu"
    v = config["vision"]  # a modality, not a graph
    if "fp32" in v["variants"] and "fp32" in v["sensitivity_variants"]:
        for key in ("variants", "sensitivity_variants"):
            if "fp32-smooth" not in v[key]:
                v[key] = [*v[key], "fp32-smooth"]
        if "fp32" in v["parts"]["variants"] and "fp32-smooth" not in v["parts"]["variants"]:
            v["parts"]["variants"] = [*v["parts"]["variants"], "fp32-smooth"]


def model_name(config: dict) -> str:
    ckpt = str(config["model"]["checkpoint"])
    name = config["model"].get("name")
    if ckpt in PRESETS:
        # a preset may be built under another name (e.g. the 3b preset at full depth beside make
        # scale's two layers), but not under another preset's
        if name and name != ckpt and name in PRESETS:
            raise ConfigError(f"model.name: '{name}' is another preset's name; the preset '{ckpt}' may be "
                              f"named anything else (or leave it unset: '{ckpt}').")
        name = name or ckpt
    if not name:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(ckpt.rstrip("/")).name) or "model"
    if not NAME_RE.match(name):
        raise ConfigError(
            f"model.name: '{name}' is not a valid folder name: it must start with a letter or digit and hold "
            "only letters, digits, '.', '_' and '-' (it names the results/<name>/ folder), e.g. 'qwen2.5-vl-3b'."
        )
    return name


def read_config_file(path: str | Path) -> dict:
    """A config file as a mapping of keys (one ConfigError naming the file otherwise)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"--config {path}: cannot be read as YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: holds a {type(data).__name__}, not a mapping of config keys")
    return data


def run_model_name(default: str | Path, files: list[str | Path], model: dict | None = None) -> str:
    """results/<name>/ of a run: the model section of the workflow's default config, the config
    files that extend it and ``model`` (command-line values), merged as Snakemake merges them."""
    merged = dict(read_config_file(default)["model"])
    for f in files:
        merged.update(read_config_file(f).get("model") or {})
    merged.update(model or {})
    return model_name({"model": merged})


def check_sizes(sizes: list, key: str = "vision.sizes", rule: dict | None = None) -> list[str]:
    """Sizes in their canonical form; each a valid ``HxW`` (``rule``: the family's
    :func:`vlsens.model.family.size_rule`), none twice."""
    if not sizes:
        raise ConfigError(f"{key}: give at least one size, e.g. [224x224, 224x336].")
    out = []
    for i, s in enumerate(sizes):
        h, w = parse_size(str(s), key=f"{key}[{i}]", **(rule or {}))
        out.append(size_str(h, w))
    dup = {s for s in out if out.count(s) > 1}
    if dup:
        raise ConfigError(f"{key}: size(s) {', '.join(sorted(dup))} listed more than once.")
    return out


def check_variants(variants: list[str], analysed: list[str], key: str, analysed_key: str) -> None:
    """Known variants; analysed variants must be built; a ``*-sim`` variant needs its base."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ConfigError(f"{key}: {bad} unknown; valid: {', '.join(VARIANTS)}.")
    for v in analysed:
        if v not in variants:
            raise ConfigError(f"{analysed_key}: '{v}' needs {key} to build '{v}' too.")
    for v in variants:
        base = v.removesuffix("-sim")
        if base != v and base not in variants:
            raise ConfigError(f"{key}: '{v}' is simplified from '{base}'; add '{base}' too.")


def check_tolerances(config: dict) -> None:
    tol = config["parity"]["tolerance"]
    for prec in ("fp32", "fp16", "bf16"):
        t = tol[prec]
        if not 0.0 < float(t["min_cosine"]) <= 1.0:
            raise ConfigError(f"parity.tolerance.{prec}.min_cosine: {t['min_cosine']} must be in (0, 1].")
        if float(t["max_rel_error"]) <= 0:
            raise ConfigError(f"parity.tolerance.{prec}.max_rel_error: {t['max_rel_error']} must be > 0.")


def _images(spec, key: str) -> list[ImageRef]:
    try:
        return resolve_images(spec, key=key)
    except ImageError as e:
        raise ConfigError(str(e)) from e


def check_images(manifests: dict[str, str], config: dict) -> list[str]:
    """Images that cannot be read, are too small or too elongated (from the input manifests'
    headers). Raises :class:`ConfigError` naming them unless ``image_checks.on_problem: warn``
    (unreadable calibration images: unless ``calibration.skip_unreadable``); returns the warnings
    then."""
    from vlsens.data.images import image_problems
    from vlsens.data.inputs import read

    chk = config["image_checks"]
    min_side, ratio = int(chk["min_side"]), float(chk["max_aspect_ratio"])
    keys = {"parity_images": "parity.images", "calibration_images": "calibration.images",
            "text_prompts": "text.calibration.prompts"}
    problems, skipped = [], []
    for kind, key in keys.items():
        if kind in manifests:
            entries = read(manifests[kind])["images"]
            for e in (e for e in entries if "error" in e):
                if kind == "calibration_images" and config["calibration"]["skip_unreadable"]:
                    skipped.append(f"{key}: {e['error']} (skipped: calibration.skip_unreadable)")
                else:
                    raise ConfigError(f"{key}: {e['error']}" + (" (set calibration.skip_unreadable: true to skip such "
                                                                "files)" if kind == "calibration_images" else ""))
            problems += [f"{key}: {p}" for p in image_problems(entries, min_side, ratio)]
    problems = list(dict.fromkeys(problems))
    if problems and chk["on_problem"] == "error":
        raise ConfigError(f"{len(problems)} image(s) unfit for use: " + "; ".join(problems[:5])
                          + (" ..." if len(problems) > 5 else "")
                          + ". Remove them, or set image_checks.on_problem: warn to use them anyway "
                            "(image_checks.min_side, image_checks.max_aspect_ratio set the limits).")
    return skipped + [f"{p} (image_checks.on_problem: warn)" for p in problems]


def canonical(value):
    """Order-independent form of a config value for rule params (sorted dict keys)."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def tolerance_for(config: dict, variant: str) -> dict:
    """The parity tolerance of a variant (``*-sim`` uses its base precision's)."""
    prec = variant.split("-")[0] if variant.split("-")[0] in ("fp16", "bf16") else "fp32"
    tol = config["parity"]["tolerance"][prec]
    # Canonical form (sorted keys, floats): Snakemake compares params by value representation,
    # so reordering or reformatting the YAML must not re-run anything.
    return {k: float(tol[k]) for k in sorted(tol)}
