"""The plan: everything the DAG is built from, checked when it is built (never by a job).

:func:`configure` checks the config (schema defaults filled, :mod:`vlsens.config`'s checks, the
checkpoint directory or the preset's planted outliers, images, prompts) and derives the
:class:`Plan` and every configured graph's tower, each having checked its own keys. Jobs import
:mod:`vlsens.config` and their tower, not this module, so DAG-build-only code (e.g. the presets'
architecture tables) is no part of their rerun trigger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vlsens import paths
from vlsens import towers as towers_registry
from vlsens.checkpoint import check_checkpoint_dir
from vlsens.config import _images, check_tolerances, model_name, renamed_keys, with_defaults
from vlsens.errors import CheckpointError, ConfigError
from vlsens.images import ImageRef
from vlsens.presets import PRESETS
from vlsens.presets.tables import check_tiny_outliers


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
    #: More outside files the towers read (:meth:`~vlsens.towers.base.Tower.outside_inputs`):
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


def check_parts(config: dict, towers: dict) -> None:
    """Every variant of ``vision.parts.variants`` is built by at least one fixed-size graph."""
    cuttable = [t for t in towers.values() if t.cuttable]
    for v in config["vision"]["parts"]["variants"]:
        if cuttable and not any(v in t.variants() for t in cuttable):
            raise ConfigError(f"vision.parts.variants: '{v}' is built by no fixed-size graph "
                              f"({', '.join(t.graph for t in cuttable)}); add it to vision.variants (or the uint8 / "
                              "video sections' variants) or remove it from vision.parts.variants")


def configure(config: dict, workdir=".") -> tuple[Plan, dict]:
    """Everything the DAG is built from, checked: the plan (:func:`make_plan`) and every
    configured graph's tower, each having checked its own keys."""
    moved = renamed_keys(config)
    if moved:
        raise ConfigError("; ".join(moved))
    config = with_defaults(config)
    plan = make_plan(config, workdir)
    towers = towers_registry.active(config)
    for t in towers.values():
        t.check(plan)
    check_parts(config, towers)
    for t in towers.values():
        for kind, entry in t.outside_inputs(plan).items():
            if plan.outside.get(kind, entry) != entry:
                raise ConfigError(f"{t.graph}: outside input '{kind}' is also another graph's, with other files")
            plan.outside[kind] = entry
    return plan, towers
