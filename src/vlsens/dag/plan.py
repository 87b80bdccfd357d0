"""The plan: everything the DAG is built from, checked when it is built (never by a job).

:func:`configure` checks the config (schema defaults filled, :mod:`vlsens.config`'s checks, the
checkpoint directory or the preset's planted outliers, images, prompts) and derives the
:class:`Plan` and every configured graph's tower, each having checked its own keys. Jobs import
:mod:`vlsens.config` and their tower, not this module, so DAG-build-only code (e.g. the presets'
architecture tables) is no part of their rerun trigger.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vlsens.config import _images, check_tolerances, model_name, renamed_keys, with_defaults
from vlsens.core import paths
from vlsens.core.errors import CheckpointError, ConfigError
from vlsens.data.images import ImageRef
from vlsens.export import towers as towers_registry
from vlsens.model.checkpoint import check_checkpoint_dir
from vlsens.model.presets import PRESET_FAMILY, PRESETS, trained_dir, uses_trained
from vlsens.model.presets.tables import REAL_3B_TEXT, TINY_ARCH, check_tiny_outliers
from vlsens.task.files import resolve as task_files


@dataclass
class Plan:
    """What the workflow reads from outside ``results/``, derived from a checked config."""

    model: str
    checkpoint: str  # directory the rules read
    preset: str | None  # set when the checkpoint is built by the workflow
    parity_images: list[ImageRef] = field(default_factory=list)
    calib_images: list[ImageRef] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    inc_tune: bool = False
    #: More outside files the towers read (:meth:`~vlsens.export.towers.base.Tower.outside_inputs`):
    #: manifest kind -> (file, the images it names).
    outside: dict[str, tuple[str, list[ImageRef]]] = field(default_factory=dict)


def make_plan(config: dict, workdir: str | Path = ".") -> Plan:
    """Check ``config`` (schema-valid; defaults are filled here too) and derive the :class:`Plan`
    (its towers' outside inputs are added by :func:`configure`)."""
    config = with_defaults(config)
    workdir = Path(workdir)
    ckpt = str(config["model"]["checkpoint"])
    name = model_name(config)
    if ckpt in PRESETS:
        preset, ckpt_dir = ckpt, paths.fill(paths.CHECKPOINT, model=name)
        check_tiny_outliers(config["model"]["tiny"], ckpt)
    else:
        preset = None
        path = Path(ckpt)
        try:
            check_checkpoint_dir(path if path.is_absolute() else workdir / path, key="model.checkpoint")
        except CheckpointError as e:
            raise ConfigError(str(e)) from e
        ckpt_dir = ckpt
    check_tolerances(config)
    n = int(config["parity"]["num_images"])
    images = _images(config["parity"]["images"], "parity.images")
    if len(images) < n:
        raise ConfigError(f"parity.num_images: {n} requested but parity.images yields only {len(images)} image(s).")
    cal = config["calibration"]
    calib = _images(cal["images"], "calibration.images")
    need = int(cal["num_calib"]) + int(cal["num_eval"])
    if len(calib) < need:
        raise ConfigError(
            f"calibration.num_calib + calibration.num_eval = {need}, but calibration.images yields only "
            f"{len(calib)} image(s); lower them or add images."
        )
    sens = config["sensitivity"]
    return Plan(name, ckpt_dir, preset, images[:n], calib, list(sens["engines"]), bool(sens["inc"]["tune"]))


def lm_config(config: dict) -> dict:
    """The configured model's language-model widths (``hidden_size``, ``intermediate_size``,
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``vocab_size``,
    ``tie_word_embeddings``): a preset's table, else the checkpoint's ``config.json`` (no torch)."""
    ckpt = str(config["model"]["checkpoint"])
    if ckpt == "3b":
        return {**REAL_3B_TEXT, "num_hidden_layers": int(config["model"]["3b"]["text_layers"]),
                "tie_word_embeddings": True}
    if ckpt in PRESET_FAMILY and uses_trained(ckpt, config["model"].get("tiny") or {}):
        ckpt = str(trained_dir(ckpt))  # the shipped trained checkpoint's own config.json
    elif ckpt in PRESET_FAMILY:  # the tiny presets' vocabulary: their tokenizer's (512 and the specials)
        return {"vocab_size": 1024, **TINY_ARCH[PRESET_FAMILY[ckpt]][1], "tie_word_embeddings": False,
                **({"num_hidden_layers": int(config["model"]["tiny"]["text_layers"])}
                   if config["model"].get("tiny", {}).get("text_layers") else {})}
    raw = json.loads((Path(ckpt) / "config.json").read_text())
    lm = raw.get("text_config") or raw
    return {**lm, "tie_word_embeddings": raw.get("tie_word_embeddings", lm.get("tie_word_embeddings", False))}


def vision_config(config: dict) -> dict:
    """The configured model's vision config (a preset's table, else the checkpoint's
    ``config.json``; no torch)."""
    from vlsens.model.presets.tables import REAL_3B_VISION

    ckpt = str(config["model"]["checkpoint"])
    if ckpt == "3b":
        return dict(REAL_3B_VISION)
    if ckpt in PRESET_FAMILY and uses_trained(ckpt, config["model"].get("tiny") or {}):
        ckpt = str(trained_dir(ckpt))
    elif ckpt in PRESET_FAMILY:
        return dict(TINY_ARCH[PRESET_FAMILY[ckpt]][0])
    return dict(json.loads((Path(ckpt) / "config.json").read_text()).get("vision_config") or {})


def attention_bytes(height: int, width: int, vc: dict) -> int:
    """Bytes of one float32 attention matrix of the vision tower over an image of ``height`` x
    ``width`` (heads x patches², at every full-attention block; the reference and the export each
    hold at least one, softmax a second): what grows with the square of the image's area."""
    patch = int(vc.get("patch_size", 14))
    patches = (height // patch) * (width // patch)
    return 4 * int(vc.get("num_heads", 16)) * patches * patches


def memory_limit(config: dict) -> int:
    """The most memory a job may use: the larger of this machine's and of the largest
    ``cluster.mem_mb`` a rule asks for (a cluster's nodes may have more than the host that builds
    the DAG)."""
    import os

    local = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def values(v):
        return [x for y in v.values() for x in values(y)] if isinstance(v, dict) else [int(v)]

    return max(local, max(values(config["cluster"]["mem_mb"])) * 2**20)


def check_size_memory(config: dict, limit: int | None = None) -> None:
    """Refuse, when the DAG is built, an image size whose vision attention alone
    (:func:`attention_bytes`) exceeds what a job may use (:func:`memory_limit`), naming the key,
    the estimate and the limit, rather than letting a job die of memory."""
    from vlsens.core.sizes import SIZE_RE

    vc, limit = vision_config(config), limit or memory_limit(config)
    v = config["vision"]
    keyed = [(f"vision.sizes[{i}]", s) for i, s in enumerate(v["sizes"])]
    keyed += [(f"vision.uint8.sizes[{i}]", s) for i, s in enumerate(v["uint8"]["sizes"])]
    keyed += [(f"vision.dynamic.parity_cases[{i}][{j}]", s) for i, case in enumerate(v["dynamic"]["parity_cases"])
              for j, s in enumerate(case)]
    keyed += [(f"deploy.measure.sizes[{i}]", s) for i, s in enumerate(config["deploy"]["measure"]["sizes"])]
    for key, s in keyed:
        m = SIZE_RE.match(str(s).strip())
        if not m:
            continue  # the size checks name it
        need = attention_bytes(int(m.group(1)), int(m.group(2)), vc)
        if need > limit:
            raise ConfigError(f"{key}: {s} needs about {need / 2**30:,.0f} GiB for one float32 attention matrix of the "
                              f"vision tower ({vc.get('num_heads', 16)} heads x patches squared), more than the "
                              f"{limit / 2**30:,.0f} GiB a job may use here (the larger of this machine's memory and "
                              "cluster.mem_mb); use a smaller size")


def lm_fp32_bytes(config: dict) -> int:
    """FP32 bytes of the language model's weights (embedding, layers, an untied lm_head): what an
    export of it writes."""
    t = lm_config(config)
    h, inter, layers, vocab = (int(t[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                    "vocab_size"))
    heads = int(t.get("num_attention_heads") or 1)
    kv = int(t.get("num_key_value_heads") or heads)
    head_dim = int(t.get("head_dim") or h // heads)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
    per_layer = attn + 3 * h * inter + 2 * h
    embed = vocab * h * (1 if t.get("tie_word_embeddings") else 2)
    return 4 * (embed + layers * per_layer)


def model_facts(config: dict) -> dict:
    """What the towers may need to know about the model when the DAG is built
    (:meth:`~vlsens.export.towers.base.Tower.configure`)."""
    return {"lm_fp32_bytes": lm_fp32_bytes(config)}


def configure(config: dict, workdir=".") -> tuple[Plan, dict]:
    """Everything the DAG is built from, checked: the plan (:func:`make_plan`) and every
    configured graph's tower, each having checked its own keys."""
    moved = renamed_keys(config)
    if moved:
        raise ConfigError("; ".join(moved))
    config = with_defaults(config)
    task_files(config, Path(workdir) / paths.RESULTS)  # "task" / "auto" inputs: the task's split files
    plan = make_plan(config, workdir)
    check_size_memory(config)
    towers = towers_registry.active(config)
    facts = model_facts(config)
    for t in towers.values():
        t.configure(facts)
        t.check(plan)
    towers_registry.check_parts(config, towers)
    for t in towers.values():
        for kind, entry in t.outside_inputs(plan).items():
            if plan.outside.get(kind, entry) != entry:
                raise ConfigError(f"{t.graph}: outside input '{kind}' is also another graph's, with other files")
            plan.outside[kind] = entry
    return plan, towers
