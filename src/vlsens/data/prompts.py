"""Text prompts: the builtin set shipped with vlsens, or a JSONL file of ``{"image", "prompt"}``
lines. Read when the DAG is built (a bad line fails there, naming the file and line) and by the
text tower's reference and calibration."""

from __future__ import annotations

import json
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


@dataclass
class PromptSample:
    prompt: str
    image: ImageRef | None
    name: str


def builtin_samples(images: Sequence) -> list[PromptSample]:
    """Every builtin prompt twice: with an image (cycled through ``images``) and text-only, so
    the text tower sees multimodal and plain activations."""
    out = []
    for i, p in enumerate(BUILTIN_PROMPTS):
        if images:
            out.append(PromptSample(p, images[i % len(images)], f"image-{i:02d}"))
        out.append(PromptSample(p, None, f"text-{i:02d}"))
    return out


def load_prompt_samples(spec: str, images: Sequence = (), key: str = "text.calibration.prompts") -> list[PromptSample]:
    """``builtin`` or a JSONL file of ``{"image": <path or null>, "prompt": "..."}`` (image paths
    relative to the file). Errors name the file and line."""
    if spec == "builtin":
        return builtin_samples(images)
    path = Path(spec)
    if path.suffix != ".jsonl" or not path.is_file():
        raise ConfigError(f"{key}: '{spec}' is neither 'builtin' nor an existing .jsonl file of "
                          '{"image": <path or null>, "prompt": "..."} lines.')
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
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
        img = obj.get("image")
        ref = None
        if img:
            p = Path(img) if Path(img).is_absolute() else path.parent / img
            if not p.is_file():
                raise ConfigError(f"{where}: image {img} not found (paths are relative to {path.parent})")
            ref = ImageRef(p, p.stem)
        out.append(PromptSample(obj["prompt"], ref, f"line-{n:04d}"))
    if not out:
        raise ConfigError(f"{key}: {path} has no samples")
    return out
