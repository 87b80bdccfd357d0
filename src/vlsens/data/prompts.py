"""Text prompts: the builtin set shipped with vlsens, or a JSONL file of ``{"image", "prompt"}``
(or ``{"images": [...], "prompt"}``) lines. Read when the DAG is built (a bad line fails there,
naming the file and line) and by the text tower's reference and calibration.

A prompt's **modality** is what it shows the model: ``text`` (no image), ``image`` (one),
``images`` (two or more). The calibration and evaluation splits of every tower that reads prompts
are stratified by it (:func:`stratified_split`): each split holds every modality the prompts have,
so an error that only image prompts show is inside what the sensitivity and the profiles measure."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vlsens.core.errors import ConfigError
from vlsens.data.images import ImageRef

#: Prompts shipped with vlsens (parity and the default text calibration set).
BUILTIN_PROMPTS = [
    "Describe this image in detail.",
    "What is in the picture?",
    "How many objects are there, and what colour are they?",
    "Answer in one short sentence: is it day or night?",
    "Read the text in the image.",
    "Where is the person looking?",
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Describe the scene, the colours and the objects you can see.",
]


#: A prompt's modality by the number of images it shows (0, 1, 2 or more).
MODALITIES = ("text", "image", "images")  # a modality, not a graph
TEXT_ONLY = MODALITIES[0]


@dataclass
class PromptSample:
    prompt: str
    images: tuple[ImageRef, ...]
    name: str

    @property
    def image(self) -> ImageRef | None:
        """The first image (None for a text prompt)."""
        return self.images[0] if self.images else None

    @property
    def modality(self) -> str:
        return MODALITIES[min(len(self.images), 2)]


def builtin_samples(images: Sequence) -> list[PromptSample]:
    """Every builtin prompt text-only, with one image and (given two or more) with two, the
    images cycled through ``images``: the towers see every modality a user sends."""
    out = []
    for i, p in enumerate(BUILTIN_PROMPTS):
        out.append(PromptSample(p, (), f"text-{i:02d}"))
        if images:
            out.append(PromptSample(p, (images[i % len(images)],), f"image-{i:02d}"))
        if len(images) >= 2:
            out.append(PromptSample(p, (images[i % len(images)], images[(i + 1) % len(images)]), f"images-{i:02d}"))
    return out


def stratified_split(samples: Sequence[PromptSample], n_calib: int, n_eval: int, seed: int = 0,
                     key: str = "text.calibration") -> dict[str, list[int]]:
    """Indices of the ``calib`` and ``eval`` splits: each modality's samples shuffled with ``seed``
    and dealt in turn (text, one image, two images, text, ...), evaluation first, so each split holds
    every modality the samples have in shares as equal as its count allows. A ConfigError naming
    ``key`` when the prompts have no image (a vision-language model measured on text alone), or a
    split is too small, or a modality has too few samples to appear in both splits."""
    strata = {m: [i for i, s in enumerate(samples) if s.modality == m] for m in MODALITIES}
    strata = {m: idx for m, idx in strata.items() if idx}
    if not set(strata) - {TEXT_ONLY}:
        raise ConfigError(f"{key}.prompts: no prompt shows an image; the calibration and evaluation splits "
                          "must hold image prompts (give calibration images, or JSONL lines with an \"image\")")
    if len(samples) < n_calib + n_eval:
        raise ConfigError(f"{key}.num_calib + num_eval = {n_calib + n_eval}, but {key}.prompts yields only "
                          f"{len(samples)} sample(s); lower them or add prompts.")
    rng = random.Random(seed)
    pools = {m: rng.sample(idx, len(idx)) for m, idx in strata.items()}
    out = {}
    for split, n in (("eval", n_eval), ("calib", n_calib)):
        if n < len(strata):
            raise ConfigError(f"{key}.num_{split}: {n}, but each split holds every modality of the prompts "
                              f"({', '.join(strata)}): at least {len(strata)}")
        chosen: list[int] = []
        while len(chosen) < n:
            for m in strata:
                if len(chosen) < n and pools[m]:
                    chosen.append(pools[m].pop())
        missing = [m for m in strata if not any(samples[i].modality == m for i in chosen)]
        if missing:
            raise ConfigError(f"{key}.prompts: too few {'/'.join(missing)} prompts for both splits to hold one; "
                              "add prompts of that kind or lower num_calib / num_eval")
        out[split] = sorted(chosen)
    return {"calib": out["calib"], "eval": out["eval"]}


def load_prompt_samples(spec: str, images: Sequence = (), key: str = "text.calibration.prompts") -> list[PromptSample]:
    """``builtin`` or a JSONL file of ``{"image": <path or null>, "prompt": "..."}`` or
    ``{"images": [<path>, ...], "prompt": "..."}`` (image paths relative to the file). Errors name
    the file and line."""
    if spec == "builtin":
        return builtin_samples(images)
    path = Path(spec)
    if path.suffix != ".jsonl" or not path.is_file():
        raise ConfigError(f"{key}: '{spec}' is neither 'builtin' nor an existing .jsonl file of "
                          '{"image": <path or null>, "prompt": "..."} lines.')
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line_no = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(f"{key}: {path}:{line_no}: not UTF-8 (byte {e.object[e.start]:#04x}); save the file as "
                          "UTF-8") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{key}: {path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg}); each line is "
                              '{"image": <path or null>, "prompt": "..."}') from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise ConfigError(f'{where}: needs a non-empty "prompt" string (and optionally "image": <path or null>)')
        if "image" in obj and obj["image"] is not None and not (isinstance(obj["image"], str) and obj["image"]):
            raise ConfigError(f'{where}: "image" is an image path or null, got {json.dumps(obj["image"])}')
        imgs = obj.get("images", [obj["image"]] if obj.get("image") else [])
        if not isinstance(imgs, list) or not all(isinstance(x, str) and x for x in imgs):
            raise ConfigError(f'{where}: "images" is a list of image paths (or give one "image")')
        refs = []
        for img in imgs:
            p = Path(img) if Path(img).is_absolute() else path.parent / img
            if not p.is_file():
                raise ConfigError(f"{where}: image {img} not found (paths are relative to {path.parent})")
            refs.append(ImageRef(p, p.stem))
        out.append(PromptSample(obj["prompt"], tuple(refs), f"line-{n:04d}"))
    if not out:
        raise ConfigError(f"{key}: {path} has no samples")
    return out
