"""The task's splits as files the workflow reads: PNG images and a ``questions.jsonl``.

A config value ``task`` (``calibration.images``, ``parity.images``, ``text.calibration.prompts``,
``deploy.measure.prompts``) names the task's split; :func:`resolve` writes the split once under
``results/task/seed-<seed>/<split>-<count>/`` (:func:`split_dir`) when the DAG is built (deterministic for the seed,
so a second run finds it and writes nothing) and puts the folder's path in the config, so every
reader (the content manifests, the calibration sets, the measure's cases) sees plain files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vlsens.core.errors import ConfigError
from vlsens.task.questions import MODALITIES, VERSION, write_split

QUESTIONS = "questions.jsonl"
DONE = "split.json"


def parse_sizes(sizes, key: str = "task.sizes") -> tuple[tuple[int, int], ...]:
    out = []
    for s in sizes:
        h, _, w = str(s).partition("x")
        if not (h.isdigit() and w.isdigit()) or int(h) % 28 or int(w) % 28 or not int(h) or not int(w):
            raise ConfigError(f"{key}: '{s}' is not HxW with each side a positive multiple of 28 pixels")
        out.append((int(h), int(w)))
    return tuple(out)


def split_dir(root: str | Path, seed: int, split: str, count: int) -> Path:
    """Where a split is written: under ``root`` (the results folder), or under ``$VLSENS_TASK_DIR``
    where that is set (a folder shared by many runs, e.g. a test session's)."""
    root = os.environ.get("VLSENS_TASK_DIR") or Path(root) / "task"
    return Path(root) / f"seed-{int(seed)}" / f"{split}-{int(count)}"


def materialize(root: str | Path, seed: int, split: str, count: int, sizes) -> Path:
    """The folder of ``count`` questions of ``split`` (written when absent or incomplete:
    ``split.json`` is written last and records what was drawn)."""
    from vlsens.core.fsutil import atomic_dir

    out = split_dir(root, seed, split, count)
    want = {"seed": int(seed), "split": split, "count": int(count), "sizes": [list(s) for s in sizes],
            "version": VERSION}
    done = out / DONE
    if done.is_file():
        try:
            if json.loads(done.read_text()) == want:
                return out
        except (OSError, json.JSONDecodeError):
            pass
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        write_split(tmp, seed, split, count, sizes)
        (tmp / DONE).write_text(json.dumps(want, sort_keys=True) + "\n")
    return out


def on_task(config: dict) -> bool:
    """Whether ``auto`` means ``task`` for this config: its checkpoint is a preset built from the
    weights vlsens trained on the task (:func:`vlsens.model.presets.uses_trained`)."""
    from vlsens.model.presets import PRESETS, uses_trained

    ckpt = str(config["model"]["checkpoint"])
    return ckpt in PRESETS and uses_trained(ckpt, config["model"].get("tiny") or {})


def _choice(value, trained: bool):
    return ("task" if trained else "builtin") if value == "auto" else value


def resolve(config: dict, root: str | Path = "results") -> None:
    """Replace every ``task`` (and ``auto``: ``task`` on the trained preset, else ``builtin``)
    value of ``config`` in place: ``calibration.images`` and ``parity.images`` by the task's
    calibration split's folder (a trained model's gates are taken on the images it knows),
    ``text.calibration.prompts`` by its ``questions.jsonl``, ``deploy.measure.prompts`` by the
    evaluation split's ``questions.jsonl`` (see the module docs)."""
    trained = on_task(config)
    task = config.get("task") or {}
    seed, sizes = int(task.get("seed", 0)), parse_sizes(task.get("sizes", ["224x224", "224x336"]))
    calib = int(task.get("calib", 60))
    for section in (config["calibration"], config.get("parity", {})):
        section["images"] = _choice(section.get("images", "builtin"), trained)
        if section["images"] == "task":
            section["images"] = str(materialize(root, seed, "calib", calib, sizes))
    text = config.get("text", {}).get("calibration")
    if text is not None:
        text["prompts"] = _choice(text.get("prompts", "builtin"), trained)
        if text["prompts"] == "task":
            text["prompts"] = str(materialize(root, seed, "calib", calib, sizes) / QUESTIONS)
    measure = config.get("deploy", {}).get("measure")
    if measure is not None:
        measure["prompts"] = _choice(measure.get("prompts", "builtin"), trained)
        if measure["prompts"] == "task":
            count = len(MODALITIES) * int(task.get("eval_per_modality", 200))
            measure["prompts"] = str(materialize(root, seed, "eval", count, sizes) / QUESTIONS)
