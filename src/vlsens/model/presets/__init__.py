"""The built-in presets: real, complete Hugging Face checkpoints with random weights.

The presets are complete checkpoints (config, safetensors weights, tokenizer, chat template,
image-processor config) with random weights from a fixed seed, so the loading code
(:mod:`vlsens.model.loading`, :mod:`vlsens.model.processor`) serves presets and user checkpoints alike:

``tiny``  the real layout at toy widths (0.3 M parameters), float32: the default and CI's model
          (``tiny-qwen2vl`` and ``tiny-qwen3vl``: the other families at the same widths);
``3b``    the published Qwen2.5-VL-3B architecture (vision tower 669 M parameters, text LM of
          hidden 2048 / vocab 151936 with tied embeddings, 36 layers unless
          ``model.3b.text_layers`` says fewer), saved in bfloat16 like the published checkpoint:
          real size without a download. Its tokenizer is the tiny one (a 512-token BPE with the
          Qwen special tokens); the embedding table keeps the real 151936 rows.

This module is the table of names only (read when the DAG is built, and by :mod:`vlsens.model.family`);
:mod:`.tables` holds the architectures, :mod:`.tokenizer` the tokenizer, :mod:`.plant` the planted
outliers and :mod:`.build` the writers. Only the rules that build a preset import the latter, so an
edit to preset code re-runs nothing of a user's own checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from vlsens.core.errors import ConfigError

#: The family every preset is built as.
MODEL_TYPE = "qwen2_5_vl"
#: preset -> the family (model_type) it is built as.
PRESET_FAMILY = {"tiny": "qwen2_5_vl", "tiny-qwen2vl": "qwen2_vl", "tiny-qwen3vl": "qwen3_vl", "3b": "qwen2_5_vl"}


PRESETS = tuple(PRESET_FAMILY)


TINY_PRESETS = tuple(p for p in PRESETS if p.startswith("tiny"))


#: Presets vlsens ships trained weights for (:mod:`vlsens.task.train`): the seed and decoder depth
#: they were trained at. Their files are in ``trained/<preset>/`` beside this module.
TRAINED = {"tiny": {"seed": 0, "text_layers": 2}}


def trained_dir(preset: str) -> Path:
    """The folder of the trained checkpoint vlsens ships for ``preset``."""
    return Path(__file__).resolve().parent / "trained" / preset


def uses_trained(preset: str | None, tiny: dict) -> bool:
    """Whether ``preset`` is built from its shipped trained weights (``model.tiny.weights``:
    ``trained``, ``random``, or ``auto``: trained where vlsens ships them for this seed and depth).
    A ConfigError when ``trained`` is asked of a preset, seed or depth that has none."""
    weights = tiny.get("weights", "auto")
    if preset is None or weights == "random":
        return False
    spec = TRAINED.get(preset)
    ships = (spec is not None and int(tiny.get("seed", 0)) == spec["seed"]
             and int(tiny.get("text_layers") or spec["text_layers"]) == spec["text_layers"]
             and (trained_dir(preset) / "model.safetensors").is_file())
    if weights == "trained" and not ships:
        have = ", ".join(f"{p} (seed {v['seed']}, {v['text_layers']} decoder layers)" for p, v in TRAINED.items())
        raise ConfigError(f"model.tiny.weights: trained, but vlsens ships trained weights only for {have}; "
                          f"'{preset}' with seed {tiny.get('seed', 0)} and {tiny.get('text_layers') or 2} decoder "
                          "layers has none (use weights: random or auto)")
    return ships


def rule_names(kind: str, preset: str | None, model: str) -> str:
    """The results/<model> names a preset rule builds, as a wildcard pattern: the presets of
    ``kind`` (``tiny``: every tiny preset; ``3b``), and ``model`` when this run's preset is one of
    them under another name (``model.name``)."""
    import re

    names = [p for p in PRESETS if p.startswith(kind)]
    if preset in names and model not in names:
        names.append(model)
    return "|".join(re.escape(n) for n in names)
