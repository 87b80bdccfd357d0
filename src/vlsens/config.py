"""Semantic config checks and the plan derived from a config.

The JSON schema (``workflow/schemas/config.schema.yaml``) checks types and fills defaults; this
module checks what a schema cannot (sizes against the patch geometry, that the checkpoint
directory is a usable safetensors checkpoint, that images exist) and raises
:class:`~vlsens.errors.ConfigError` naming the key, the value and what would be valid. It runs
when the DAG is built, so bad input fails before any job starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlsens.checkpoint import PRESETS, check_checkpoint_dir
from vlsens.errors import CheckpointError, ConfigError, ImageError
from vlsens.images import ImageRef, resolve_images
from vlsens.vision import parse_size, size_str

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
VARIANTS = ("fp32", "fp16", "fp32-sim", "fp16-sim")
RESULTS = "results"


@dataclass
class Plan:
    """What the workflow will build, derived from a checked config."""

    model: str
    checkpoint: str  # directory the rules read
    preset: str | None  # set when the checkpoint is built by the workflow
    sizes: list[str]
    variants: list[str]
    parity_images: list[ImageRef] = field(default_factory=list)
    calib_images: list[ImageRef] = field(default_factory=list)
    sens_variants: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    inc_tune: bool = False
    text_variants: list[str] = field(default_factory=list)  # empty: text tower off
    dynamic_variants: list[str] = field(default_factory=list)  # empty: no dynamic vision graph
    dynamic_sens_variants: list[str] = field(default_factory=list)
    prompt_file: str | None = None  # text.calibration.prompts when it is a JSONL (not builtin)
    prompt_images: list[ImageRef] = field(default_factory=list)  # the images that JSONL names
    text_sens_variants: list[str] = field(default_factory=list)

    def engine_variants(self, engine: str) -> list[str]:
        """Base variants an engine analyses: ``inc`` takes FP32 graphs only (INC's ONNX adaptor
        fails on FP16 ones: ORT's CPU cast insertion leaves weights it cannot find)."""
        if engine == "inc":
            return [v for v in self.sens_variants if v == "fp32"]
        return list(self.sens_variants)


def _get(config: dict, dotted: str) -> Any:
    cur: Any = config
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise ConfigError(f"{dotted}: missing from the config (see config/README.md).")
        cur = cur[part]
    return cur


def schema_errors(config: dict, schema_path: str | Path) -> list[str]:
    """Schema violations of ``config``, one line each, the offending key first, with a close match
    for a misspelled key (Snakemake's own message buries the key in a dump of the whole schema)."""
    import difflib

    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    cls = jsonschema.validators.validator_for(schema)
    out = []
    for err in sorted(cls(schema).iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(p) for p in err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = list((err.schema or {}).get("properties", {}))
            for key in sorted(k for k in err.instance if k not in allowed):
                full = f"{where}.{key}" if where else str(key)
                near = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
                hint = f" (did you mean '{near[0]}'?)" if near else f" (valid here: {', '.join(allowed)})"
                out.append(f"{full}: unknown key{hint}")
        elif err.validator == "required":
            out.append(f"{where + ': ' if where else ''}{err.message}")
        else:
            out.append(f"{where or '<config>'}: {err.message}")
    return out


def model_name(config: dict) -> str:
    ckpt = str(_get(config, "model.checkpoint"))
    name = config.get("model", {}).get("name")
    if ckpt in PRESETS:
        if name and name != ckpt:
            raise ConfigError(f"model.name: '{name}' cannot rename the preset '{ckpt}'; leave it unset.")
        return ckpt
    if not name:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(ckpt.rstrip("/")).name) or "model"
    if not NAME_RE.match(name):
        raise ConfigError(
            f"model.name: '{name}' is not a valid folder name: it must start with a letter or digit and hold "
            "only letters, digits, '.', '_' and '-' (it names the results/<name>/ folder), e.g. 'qwen2.5-vl-3b'."
        )
    return name


def check_sizes(sizes: list, key: str = "vision.sizes") -> list[str]:
    if not sizes:
        raise ConfigError(f"{key}: give at least one size, e.g. [224x224, 224x336].")
    out = []
    for i, s in enumerate(sizes):
        h, w = parse_size(str(s), key=f"{key}[{i}]")
        out.append(size_str(h, w))
    dup = {s for s in out if out.count(s) > 1}
    if dup:
        raise ConfigError(f"{key}: size(s) {', '.join(sorted(dup))} listed more than once.")
    return out


def check_tolerances(config: dict) -> None:
    tol = _get(config, "parity.tolerance")
    for prec in ("fp32", "fp16"):
        if prec not in tol:
            raise ConfigError(f"parity.tolerance.{prec}: missing; give min_cosine and max_rel_error.")
        t = tol[prec]
        if not 0.0 < float(t["min_cosine"]) <= 1.0:
            raise ConfigError(f"parity.tolerance.{prec}.min_cosine: {t['min_cosine']} must be in (0, 1].")
        if float(t["max_rel_error"]) <= 0:
            raise ConfigError(f"parity.tolerance.{prec}.max_rel_error: {t['max_rel_error']} must be > 0.")


def make_plan(config: dict, workdir: str | Path = ".") -> Plan:
    """Check ``config`` (already schema-validated) and derive the :class:`Plan`."""
    workdir = Path(workdir)
    ckpt = str(_get(config, "model.checkpoint"))
    name = model_name(config)
    if ckpt in PRESETS:
        preset, ckpt_dir = ckpt, f"{RESULTS}/{name}/checkpoint"
    else:
        preset = None
        path = Path(ckpt)
        try:
            check_checkpoint_dir(path if path.is_absolute() else workdir / path, key="model.checkpoint")
        except CheckpointError as e:
            raise ConfigError(str(e)) from e
        ckpt_dir = ckpt
    sizes = check_sizes(list(_get(config, "vision.sizes")))
    variants = list(config.get("vision", {}).get("variants", VARIANTS))
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ConfigError(f"vision.variants: {bad} unknown; valid: {', '.join(VARIANTS)}.")
    check_tolerances(config)
    n = int(_get(config, "parity.num_images"))
    try:
        images = resolve_images(_get(config, "parity.images"), key="parity.images")
    except ImageError as e:
        raise ConfigError(str(e)) from e
    if len(images) < n:
        raise ConfigError(
            f"parity.num_images: {n} requested but parity.images yields only {len(images)} image(s)."
        )
    cal = config.get("calibration", {})
    try:
        calib = resolve_images(cal.get("images", "builtin"), key="calibration.images")
    except ImageError as e:
        raise ConfigError(str(e)) from e
    need = int(cal.get("num_calib", 6)) + int(cal.get("num_eval", 3))
    if len(calib) < need:
        raise ConfigError(
            f"calibration.num_calib + calibration.num_eval = {need}, but calibration.images yields only "
            f"{len(calib)} image(s); lower them or add images."
        )
    sens = config.get("sensitivity", {})
    sens_variants = list(sens.get("variants", ["fp32", "fp16"]))
    for v in sens_variants:
        if v not in variants:
            raise ConfigError(f"sensitivity.variants: '{v}' needs vision.variants to build '{v}' too.")
    engines = list(sens.get("engines", ["ort"]))
    if "inc" in engines:
        check_inc(sens, sens_variants)
    outlier = config.get("model", {}).get("tiny", {}).get("outlier")
    if outlier and preset == "tiny":
        from vlsens.checkpoint import TINY_VISION

        if not 0 <= int(outlier["block"]) < TINY_VISION["depth"]:
            raise ConfigError(f"model.tiny.outlier.block: {outlier['block']} is not a vision block "
                              f"(0..{TINY_VISION['depth'] - 1}).")
    text_variants, text_sens, prompt_file, prompt_images = check_text(config, preset, calib)
    dyn_variants, dyn_sens = check_dynamic(config)
    return Plan(name, ckpt_dir, preset, sizes, variants, images[:n], calib, sens_variants, engines,
                inc_tune=bool((sens.get("inc") or {}).get("tune", False)), text_variants=text_variants,
                text_sens_variants=text_sens, dynamic_variants=dyn_variants, dynamic_sens_variants=dyn_sens,
                prompt_file=prompt_file, prompt_images=prompt_images)


def check_dynamic(config: dict) -> tuple[list[str], list[str]]:
    dyn = (config.get("vision") or {}).get("dynamic") or {}
    if not dyn.get("enabled", True):
        return [], []
    variants = list(dyn.get("variants", VARIANTS))
    for i, case in enumerate(dyn.get("parity_cases", [])):
        for j, size in enumerate(case):
            parse_size(str(size), key=f"vision.dynamic.parity_cases[{i}][{j}]")
    sens = list(dyn.get("sensitivity_variants", ["fp32"]))
    check_variants(variants, sens, "vision.dynamic.variants", "vision.dynamic.sensitivity_variants")
    return variants, sens


def check_variants(variants: list[str], analysed: list[str], key: str, analysed_key: str) -> None:
    """Analysed variants must be built, and a ``*-sim`` variant needs its base."""
    for v in analysed:
        if v not in variants:
            raise ConfigError(f"{analysed_key}: '{v}' needs {key} to build '{v}' too.")
    for v in variants:
        base = v.removesuffix("-sim")
        if base != v and base not in variants:
            raise ConfigError(f"{key}: '{v}' is simplified from '{base}'; add '{base}' too.")


def check_text(config: dict, preset: str | None, calib_images: list):
    """The text tower's keys: variants, sizes, prompts (a JSONL is read and checked line by line
    here), the planted text outlier. Returns (variants, sensitivity variants, the prompt JSONL or
    None, the images it names)."""
    from vlsens.text import load_prompt_samples

    text = config.get("text") or {}
    if not text.get("enabled", True):
        return [], [], None, []
    variants = list(text.get("variants", VARIANTS))
    for sub in ("parity", "calibration"):
        parse_size(str((text.get(sub) or {}).get("image_size", "224x224")), key=f"text.{sub}.image_size")
    sens = list((text.get("sensitivity") or {}).get("variants", ["fp32", "fp16"]))
    check_variants(variants, sens, "text.variants", "text.sensitivity.variants")
    cal = text.get("calibration") or {}
    samples = load_prompt_samples(str(cal.get("prompts", "builtin")), calib_images, key="text.calibration.prompts")
    need = int(cal.get("num_calib", 6)) + int(cal.get("num_eval", 3))
    if len(samples) < need:
        raise ConfigError(f"text.calibration.num_calib + num_eval = {need}, but text.calibration.prompts yields "
                          f"only {len(samples)} sample(s); lower them or add prompts.")
    outlier = (config.get("model", {}).get("tiny") or {}).get("text_outlier")
    if outlier and preset == "tiny":
        from vlsens.checkpoint import TINY_TEXT

        if not 0 <= int(outlier["layer"]) < TINY_TEXT["num_hidden_layers"]:
            raise ConfigError(f"model.tiny.text_outlier.layer: {outlier['layer']} is not a text layer "
                              f"(0..{TINY_TEXT['num_hidden_layers'] - 1}).")
    spec = str(cal.get("prompts", "builtin"))
    if spec == "builtin":
        return variants, sens, None, []
    images = {str(x.image.path): x.image for x in samples if x.image is not None}
    return variants, sens, spec, [images[k] for k in sorted(images)]


def check_images(manifests: dict[str, str], config: dict) -> list[str]:
    """Images that are too small or too elongated (from the input manifests' headers). Raises
    :class:`ConfigError` listing them unless ``image_checks.on_problem: warn``; returns the
    warnings then."""
    from vlsens.images import image_problems
    from vlsens.inputs import read

    chk = config.get("image_checks") or {}
    min_side, ratio = int(chk.get("min_side", 28)), float(chk.get("max_aspect_ratio", 10.0))
    keys = {"parity_images": "parity.images", "calibration_images": "calibration.images",
            "text_prompts": "text.calibration.prompts"}
    problems = []
    for kind, key in keys.items():
        if kind in manifests:
            problems += [f"{key}: {p}" for p in image_problems(read(manifests[kind])["images"], min_side, ratio)]
    problems = list(dict.fromkeys(problems))
    if problems and chk.get("on_problem", "error") == "error":
        raise ConfigError(f"{len(problems)} image(s) unfit for use: " + "; ".join(problems[:5])
                          + (" ..." if len(problems) > 5 else "")
                          + ". Remove them, or set image_checks.on_problem: warn to use them anyway "
                            "(image_checks.min_side, image_checks.max_aspect_ratio set the limits).")
    return problems


def check_inc(sens: dict, sens_variants: list[str]) -> None:
    """What engine ``inc`` can do, checked at DAG-build time (its interpreter is checked by the
    workflow, see rules/common.smk)."""
    from vlsens.inc import check_settings
    from vlsens.quant import QuantSettings

    if "fp32" not in sens_variants:
        raise ConfigError(
            f"sensitivity.engines: 'inc' analyses the fp32 variant only (INC's ONNX Runtime adaptor cannot "
            f"quantize FP16 graphs), but sensitivity.variants is {sens_variants}; add fp32 or drop 'inc'.")
    problems = check_settings(QuantSettings.from_config(sens))
    if problems:
        raise ConfigError("; ".join(problems) + " (or drop 'inc' from sensitivity.engines).")


def vision_targets(plan: Plan) -> list[str]:
    out = []
    for size in plan.sizes:
        for v in plan.variants:
            base = f"{RESULTS}/{plan.model}/vision/{size}/{v}"
            out += [f"{base}/model.onnx", f"{base}/parity.json"]
    return out


def calibration_targets(plan: Plan) -> list[str]:
    return [f"{RESULTS}/{plan.model}/calib/vision/{size}/manifest.json" for size in plan.sizes]


def sensitivity_targets(plan: Plan) -> list[str]:
    out = [f"{RESULTS}/{plan.model}/sensitivity/vision/{size}/{v}/{engine}.{ext}"
           for size in plan.sizes for engine in plan.engines for v in plan.engine_variants(engine)
           for ext in ("csv", "json")]
    if len(plan.engines) == 2:  # both engines: compare where both ran
        common = [v for v in plan.sens_variants if all(v in plan.engine_variants(e) for e in plan.engines)]
        out += [f"{RESULTS}/{plan.model}/sensitivity/vision/{size}/{v}/compare.json"
                for size in plan.sizes for v in common]
    if "inc" in plan.engines and plan.inc_tune:
        out += [f"{RESULTS}/{plan.model}/sensitivity/vision/{size}/{v}/inc-tune/eval.json"
                for size in plan.sizes for v in plan.engine_variants("inc")]
    return out


def profile_targets(plan: Plan) -> list[str]:
    return [f"{RESULTS}/{plan.model}/profile/vision/{size}/{v}/{f}"
            for size in plan.sizes for v in plan.sens_variants for f in ("eval.json", "profile.yaml", "model.onnx")]


def text_targets(plan: Plan) -> list[str]:
    base = f"{RESULTS}/{plan.model}"
    out = [f"{base}/text/{v}/{f}" for v in plan.text_variants for f in ("model.onnx", "embeds.onnx", "parity.json")]
    if plan.text_sens_variants:
        out.append(f"{base}/calib/text/manifest.json")
    for v in plan.text_sens_variants:
        out += [f"{base}/sensitivity/text/{v}/ort.{ext}" for ext in ("csv", "json")]
        out += [f"{base}/profile/text/{v}/{f}" for f in ("eval.json", "profile.yaml", "model.onnx")]
    return out


def dynamic_targets(plan: Plan) -> list[str]:
    base = f"{RESULTS}/{plan.model}"
    out = [f"{base}/vision/dynamic/{v}/{f}" for v in plan.dynamic_variants for f in ("model.onnx", "parity.json")]
    for v in plan.dynamic_sens_variants:
        out += [f"{base}/sensitivity/vision/dynamic/{v}/ort.{ext}" for ext in ("csv", "json")]
        out += [f"{base}/profile/vision/dynamic/{v}/{f}" for f in ("eval.json", "profile.yaml", "model.onnx")]
    return out


def all_targets(plan: Plan) -> list[str]:
    return (vision_targets(plan) + calibration_targets(plan) + sensitivity_targets(plan) + profile_targets(plan)
            + text_targets(plan) + dynamic_targets(plan))


def canonical(value):
    """Order-independent form of a config value for rule params (sorted dict keys)."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def tolerance_for(config: dict, variant: str) -> dict:
    """The parity tolerance of a variant (``*-sim`` uses its base precision's)."""
    prec = "fp16" if variant.startswith("fp16") else "fp32"
    tol = config["parity"]["tolerance"][prec]
    # Canonical form (sorted keys, floats): Snakemake compares params by value representation,
    # so reordering or reformatting the YAML must not re-run anything.
    return {k: float(tol[k]) for k in sorted(tol)}
