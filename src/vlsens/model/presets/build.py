"""Writing the presets: configs, seeded weights (numpy's generator, so a torch upgrade changes no
preset) and the complete checkpoint directory, atomically."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from vlsens.core.fsutil import atomic_dir, copy_file
from vlsens.model.family import get
from vlsens.model.presets import MODEL_TYPE, PRESET_FAMILY, trained_dir
from vlsens.model.presets.plant import plant_text_outlier, plant_vision_outlier
from vlsens.model.presets.tables import REAL_3B_TEXT, REAL_3B_VISION, TINY_ARCH, TINY_TEXT
from vlsens.model.presets.tokenizer import SPECIAL_TOKENS, build_tiny_tokenizer

log = logging.getLogger(__name__)

#: The training record beside a trained preset's weights (:mod:`vlsens.task.train`).
TRAINING_RECORD = "training.json"


def vl_config(tokenizer, vision: dict, text: dict, family: str = MODEL_TYPE, **top) -> Any:
    """The ``family``'s config (Qwen2_5_VLConfig ...) with the special token ids of ``tokenizer``
    (``top``: more top-level keys)."""
    config_class = get(family).transformers_class("config_class")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(text, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"])
    return config_class(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        **top,
    )



def tiny_config(tokenizer, vision: dict | None = None, family: str = MODEL_TYPE, tied: bool = False,
                text_layers: int | None = None) -> Any:
    """The config of the tiny preset of ``family``, with token ids taken from ``tokenizer``
    (``tied``: lm_head is the embedding table, as in Qwen2.5-VL-3B; the preset unties them;
    ``text_layers``: decoder layers other than the preset's 2)."""
    tv, tt = TINY_ARCH[family]
    text = dict(tt, vocab_size=len(tokenizer), tie_word_embeddings=tied,
                **({"num_hidden_layers": int(text_layers)} if text_layers else {}))
    return vl_config(tokenizer, {**tv, **(vision or {})}, text, family, tie_word_embeddings=tied)



def init_weights_numpy(model, seed: int) -> None:
    """Draw every weight matrix from numpy's seeded generator (normal, std = the tower's
    ``initializer_range``, as transformers' own init), in parameter order. 1-D parameters are
    constants already (norm weights 1, biases 0). The preset then does not depend on torch's
    RNG: a torch upgrade leaves the checkpoint, and everything torch does not touch, as it is."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for _, p, std in _parameters_with_std(model):
            if p.ndim >= 2:
                p.copy_(torch.from_numpy(rng.normal(0.0, std, size=tuple(p.shape)).astype(np.float32)))


def _parameters_with_std(model):
    """``(name, parameter, std)`` of every parameter of ``model`` in order, ``std`` its tower's
    ``initializer_range`` (vision or text)."""
    std_vision = float(model.config.vision_config.initializer_range)
    std_text = float(model.config.text_config.initializer_range)
    for name, p in model.named_parameters():
        yield name, p, (std_vision if name.startswith("model.visual.") else std_text)



def make_tiny_model(seed: int = 0, outlier: dict | None = None, vision: dict | None = None,
                    text_outlier: dict | None = None, family: str = MODEL_TYPE, tied: bool = False,
                    text_layers: int | None = None):
    """The tiny preset of ``family`` in memory: (model, tokenizer), random weights from ``seed``;
    ``outlier`` ({block, channels, scale, gain}) plants a sensitivity with
    :func:`plant_vision_outlier`; ``vision`` overrides vision-config keys (benchmarks use real widths)."""
    import torch

    tokenizer = build_tiny_tokenizer(model_max_length=TINY_TEXT["max_position_embeddings"])
    config = tiny_config(tokenizer, vision, family, tied, text_layers)
    torch.manual_seed(seed)
    model = get(family).transformers_class()(config).eval()
    init_weights_numpy(model, seed)
    _plant(model, outlier, text_outlier)
    return model, tokenizer



def load_trained(preset: str, outlier: dict | None = None, text_outlier: dict | None = None):
    """(model, tokenizer): the trained weights vlsens ships for ``preset`` (safetensors, read by
    transformers' own loader; :mod:`vlsens.task.train` made them), with the planted outliers
    applied to them (function-preserving: the trained model answers as before)."""
    from transformers import AutoTokenizer

    src = trained_dir(preset)
    model = get(PRESET_FAMILY[preset]).transformers_class().from_pretrained(
        str(src), local_files_only=True, trust_remote_code=False, use_safetensors=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True, trust_remote_code=False)
    _plant(model, outlier, text_outlier)
    return model, tokenizer


def _plant(model, outlier: dict | None, text_outlier: dict | None) -> None:
    if outlier:
        plant_vision_outlier(model, int(outlier["block"]), int(outlier.get("channels", 2)),
                             float(outlier.get("scale", 1000.0)), float(outlier.get("gain", 1.0)),
                             str(outlier.get("site", "attn")))
    if text_outlier:
        plant_text_outlier(model, int(text_outlier["layer"]), int(text_outlier.get("channels", 2)),
                           float(text_outlier.get("scale", 1000.0)))


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0, outlier: dict | None = None,
                          vision: dict | None = None, text_outlier: dict | None = None,
                          preset: str = "tiny", tied: bool = False, text_layers: int | None = None,
                          trained: bool = False) -> Path:
    """Write a tiny preset (``tiny``, ``tiny-qwen2vl``, ``tiny-qwen3vl``) as a complete HF
    checkpoint into ``out_dir`` (atomically); ``tied``: with ``tie_word_embeddings``;
    ``text_layers``: decoder layers other than the preset's 2; ``trained``: from the weights
    vlsens ships for the preset (:func:`load_trained`; its training record copied beside them)
    instead of random ones."""
    out_dir = Path(out_dir)
    family = PRESET_FAMILY[preset]
    if trained:
        model, tokenizer = load_trained(preset, outlier, text_outlier)
    else:
        model, tokenizer = make_tiny_model(seed, outlier, vision, text_outlier, family, tied, text_layers)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        save_processor(tmp, tokenizer, family)
        if trained:
            copy_file(trained_dir(preset) / TRAINING_RECORD, tmp / TRAINING_RECORD)
        (tmp / "vlsens_preset.json").write_text(json.dumps({"preset": preset, "seed": seed, "outlier": outlier,
                                                                "text_outlier": text_outlier,
                                                                "weights": "trained" if trained else "random",
                                                                **({"text_layers": text_layers} if text_layers else {})})
                                                    + "\n")
    log.info("tiny checkpoint written to %s (%d parameters)", out_dir, model.num_parameters())
    return out_dir



def real_3b_config(tokenizer, text_layers: int = 36) -> Any:
    """Qwen2.5-VL-3B's Qwen2_5_VLConfig (``text_layers`` decoder layers), token ids of ``tokenizer``."""
    text = dict(REAL_3B_TEXT, num_hidden_layers=int(text_layers), tie_word_embeddings=True)
    return vl_config(tokenizer, dict(REAL_3B_VISION), text, tie_word_embeddings=True, dtype="bfloat16")



def fill_random_(model, seed: int) -> None:
    """Weights from numpy's seeded generator, parameter by parameter (one float32 copy of the
    largest matrix at a time): matrices normal with the tower's ``initializer_range``, 1-D
    parameters as transformers initialises them (biases 0, norm weights 1)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p, std in _parameters_with_std(model):
            if p.ndim >= 2:
                x = rng.standard_normal(size=tuple(p.shape), dtype=np.float32)
                x *= std
                p.copy_(torch.from_numpy(x))
                del x
            else:
                p.fill_(0.0 if name.endswith(".bias") else 1.0)



def build_3b_checkpoint(out_dir: str | Path, seed: int = 0, text_layers: int = 36) -> Path:
    """Write the ``3b`` preset (see :mod:`vlsens.model.presets`) into ``out_dir`` (atomically).

    Peak memory ≈ the bfloat16 model (2 bytes a parameter: 7.5 GB at 36 text layers, 2.3 GB at 2)
    plus one float32 copy of the largest matrix (the 1.2 GB embedding table)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.initialization import no_init_weights

    out_dir = Path(out_dir)
    tokenizer = build_tiny_tokenizer(model_max_length=REAL_3B_TEXT["max_position_embeddings"])
    config = real_3b_config(tokenizer, text_layers)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with no_init_weights():  # every parameter is drawn below; torch's init would double the time
            model = Qwen2_5_VLForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(old)
    fill_random_(model, seed)
    model.tie_weights()
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        save_processor(tmp, tokenizer)
        (tmp / "vlsens_preset.json").write_text(json.dumps({"preset": "3b", "seed": seed,
                                                                "text_layers": text_layers}) + "\n")
    log.info("3b checkpoint written to %s (%d parameters, bfloat16)", out_dir, model.num_parameters())
    return out_dir



def save_processor(tmp: Path, tokenizer, family: str = MODEL_TYPE) -> None:
    """Tokenizer and image-processor config as the family's published checkpoints have them
    (Qwen3-VL: patch 16, mean and std 0.5)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.save_pretrained(tmp)
    if family == "qwen3_vl":
        proc = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    else:
        proc = Qwen2VLImageProcessorPil()
    proc.save_pretrained(tmp)
    # The real checkpoints name their processor class here, so AutoProcessor resolves it.
    pp = tmp / "preprocessor_config.json"
    data = json.loads(pp.read_text())
    data["processor_class"] = get(family).processor_class
    pp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
