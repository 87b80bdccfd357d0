"""Checkpoints: the built-in presets and safe loading of local Qwen2.5-VL directories.

The presets are real, complete Hugging Face checkpoints (config, safetensors weights, tokenizer,
chat template, image-processor config) with random weights from a fixed seed, so the loading code
below serves presets and user checkpoints alike:

``tiny``  the real layout at toy widths (0.3 M parameters), float32: the default and CI's model;
``3b``    the published Qwen2.5-VL-3B architecture (vision tower 669 M parameters, text LM of
          hidden 2048 / vocab 151936 with tied embeddings, 36 layers unless
          ``model.3b.text_layers`` says fewer), saved in bfloat16 like the published checkpoint:
          real size without a download. Its tokenizer is the tiny one (a 512-token BPE with the
          Qwen special tokens); the embedding table keeps the real 151936 rows.

Security: weights are loaded from safetensors only (``use_safetensors=True``), never with
``trust_remote_code``; a directory that holds only pickle weights is refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from vlsens.errors import CheckpointError
from vlsens.fsutil import atomic_dir

log = logging.getLogger(__name__)

MODEL_TYPE = "qwen2_5_vl"
#: preset -> the family (model_type) it is built as.
PRESET_FAMILY = {"tiny": "qwen2_5_vl", "tiny-qwen2vl": "qwen2_vl", "tiny-qwen3vl": "qwen3_vl", "3b": "qwen2_5_vl"}
PRESETS = tuple(PRESET_FAMILY)
TINY_PRESETS = tuple(p for p in PRESETS if p.startswith("tiny"))

#: Qwen2.5-VL special tokens, in the order the real tokenizer lists them.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

#: Qwen2-VL's chat template (image/video placeholders expand in the processor).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Text the tiny tokenizer's BPE merges are learnt from (shipped, so no download is needed).
_TOKENIZER_CORPUS = """
You are a helpful assistant. Describe this image in detail. What is in the picture?
An astronaut in a white suit stands in front of a flag. A cat with green eyes lies on a blanket.
A cup of coffee on a saucer, seen from above. A rocket on the launch pad before take-off.
Two motorcycles parked side by side. Stars and galaxies of the deep field. How many objects
are there, and what colour are they? Answer in one short sentence. The quick brown fox jumps
over the lazy dog. Read the text in the image. Where is the person looking? Is it day or night?
"""

#: Architecture of the tiny preset: the real layout (windowed and full-attention vision blocks,
#: patch 14, merge 2, temporal patch 2, 3-D mRoPE) at toy widths.
TINY_VISION = dict(
    depth=4,
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    out_hidden_size=64,
    window_size=112,
    fullatt_block_indexes=[1, 3],
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    in_channels=3,
    # Wider than the 0.02 default: with 0.02 every block's output is negligible next to the
    # residual stream, unlike trained towers, and no single op could matter.
    initializer_range=0.1,
)
TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1000000.0},
)
#: The other families' tiny presets: their real layouts at the same toy widths.
#: Qwen2-VL: LayerNorm + QuickGELU vision blocks, full attention, ``embed_dim`` inside the tower and
#: ``hidden_size`` = the LM's width out of the merger.
TINY_VISION_QWEN2VL = dict(
    depth=4, embed_dim=64, hidden_size=64, mlp_ratio=2, num_heads=4, patch_size=14, spatial_merge_size=2,
    temporal_patch_size=2, in_channels=3, initializer_range=0.1,
)
#: Qwen3-VL: patch 16, a learned 8 x 8 position table (the real one is 48 x 48), DeepStack mergers
#: after blocks 1 and 2 (added by the LM after its layers 0 and 1).
TINY_VISION_QWEN3VL = dict(
    depth=4, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64, num_position_embeddings=64,
    deepstack_visual_indexes=[1, 2], patch_size=16, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
    initializer_range=0.1,
)
TINY_TEXT_QWEN3VL = dict(
    TINY_TEXT, head_dim=16,
    rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True,
                     "rope_theta": 5000000.0},
)
TINY_ARCH = {"qwen2_5_vl": (TINY_VISION, TINY_TEXT), "qwen2_vl": (TINY_VISION_QWEN2VL, TINY_TEXT),
             "qwen3_vl": (TINY_VISION_QWEN3VL, TINY_TEXT_QWEN3VL)}


def build_tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer with the Qwen special tokens, trained offline on a shipped text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TOKENIZER_CORPUS] * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=TINY_TEXT["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def vl_config(tokenizer, vision: dict, text: dict, family: str = MODEL_TYPE, **top) -> Any:
    """The ``family``'s config (Qwen2_5_VLConfig ...) with the special token ids of ``tokenizer``
    (``top``: more top-level keys)."""
    from vlsens.family import get

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


def tiny_config(tokenizer, vision: dict | None = None, family: str = MODEL_TYPE) -> Any:
    """The config of the tiny preset of ``family``, with token ids taken from ``tokenizer``."""
    tv, tt = TINY_ARCH[family]
    return vl_config(tokenizer, {**tv, **(vision or {})}, dict(tt, vocab_size=len(tokenizer)), family,
                     tie_word_embeddings=False)


def plant_vision_outlier(model, block: int, channels: int = 2, scale: float = 1000.0,
                         gain: float = 1.0, site: str = "attn") -> list[int]:
    """Plant a function-preserving activation outlier in one vision block (in place).

    ``site="attn"`` (default): multiply ``channels`` entries of the block's ``norm1`` weight by
    ``scale`` and divide the same input columns of ``attn.qkv`` by it. The float function is
    unchanged, but the tensor ``qkv`` reads -- and only ``qkv`` reads it -- now has channels
    ``scale`` times larger than the rest, as real checkpoints' outlier channels do: its per-tensor
    INT8 range crushes every other channel. Because one op alone quantizes that tensor, both ways
    of scoring find it: "only op k INT8" (engine ort) and "everything INT8 but op k" (INC's
    mse_v2, where a tensor quantized by two ops would hide behind either).

    ``site="mlp"``: the same across the MLP (``up_proj`` rows x ``scale``, ``down_proj`` columns /
    ``scale``); the outlier tensor is then quantized both as ``up_proj``'s output and as
    ``down_proj``'s input. ``gain`` scales the planted op's output weights (the attention ``proj``
    or ``down_proj``) so the block matters next to the residual stream.

    ``site="proj"``: the attention output (``proj``'s input) carries the outlier: ``channels`` of
    the value rows of ``attn.qkv`` (weight and bias) x ``scale``, the same input columns of
    ``attn.proj`` / ``scale`` (attention is linear in the values, so the function is unchanged).
    That tensor is a MatMul's output and ``proj``'s input, so it is quantized twice (as the
    ``attn.mlp`` case). Returns the channels.
    """
    import torch

    vis = model.model.visual
    if not 0 <= block < len(vis.blocks):
        raise ValueError(f"model.tiny.outlier.block: {block} is not a vision block (0..{len(vis.blocks) - 1})")
    blk = vis.blocks[block]
    with torch.no_grad():
        if site == "attn":
            n = blk.norm1.weight.shape[0]
            idx = list(range(0, n, max(1, n // channels)))[:channels]
            blk.norm1.weight[idx] *= scale
            if getattr(blk.norm1, "bias", None) is not None:  # LayerNorm (Qwen2-VL, Qwen3-VL)
                blk.norm1.bias[idx] *= scale
            blk.attn.qkv.weight[:, idx] /= scale
            blk.attn.proj.weight *= gain
            blk.attn.proj.bias *= gain
        elif site == "proj":
            dim = blk.attn.proj.in_features
            idx = list(range(0, dim, max(1, dim // channels)))[:channels]
            rows = [2 * dim + i for i in idx]  # qkv's output is (q, k, v) x heads x head_dim
            blk.attn.qkv.weight[rows, :] *= scale
            blk.attn.qkv.bias[rows] *= scale
            blk.attn.proj.weight[:, idx] /= scale
            blk.attn.proj.weight *= gain
            blk.attn.proj.bias *= gain
        elif site == "mlp":
            mlp = blk.mlp
            if not hasattr(mlp, "up_proj"):
                raise ValueError("model.tiny.outlier.site: 'mlp' needs a gated vision MLP (Qwen2.5-VL's up_proj); "
                                 "this family's MLP has an activation between its two layers: use 'attn'")
            n = mlp.up_proj.out_features
            idx = list(range(0, n, max(1, n // channels)))[:channels]
            mlp.up_proj.weight[idx, :] *= scale
            if mlp.up_proj.bias is not None:
                mlp.up_proj.bias[idx] *= scale
            mlp.down_proj.weight[:, idx] /= scale
            mlp.down_proj.weight *= gain
            if mlp.down_proj.bias is not None:
                mlp.down_proj.bias *= gain
        else:
            raise ValueError(f"model.tiny.outlier.site: '{site}' (attn, proj, mlp)")
    return idx


def plant_text_outlier(model, layer: int, channels: int = 2, scale: float = 1000.0) -> list[int]:
    """The same function-preserving outlier in one text decoder layer's MLP
    (``down(act(gate(x)) * up(x))``, no biases): ``channels`` rows of ``up_proj`` x ``scale``,
    the same columns of ``down_proj`` / ``scale``. Returns the channel indices."""
    import torch

    layers = model.model.language_model.layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"model.tiny.text_outlier.layer: {layer} is not a text layer (0..{len(layers) - 1})")
    mlp = layers[layer].mlp
    n = mlp.up_proj.out_features
    idx = list(range(0, n, max(1, n // channels)))[:channels]
    with torch.no_grad():
        mlp.up_proj.weight[idx, :] *= scale
        mlp.down_proj.weight[:, idx] /= scale
    return idx


def init_weights_numpy(model, seed: int) -> None:
    """Draw every weight matrix from numpy's seeded generator (normal, std = the tower's
    ``initializer_range``, as transformers' own init), in parameter order. 1-D parameters are
    constants already (norm weights 1, biases 0). The preset then does not depend on torch's
    RNG: a torch upgrade leaves the checkpoint, and everything torch does not touch, as it is."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    std_vision = float(model.config.vision_config.initializer_range)
    std_text = float(model.config.text_config.initializer_range)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                std = std_vision if name.startswith("model.visual.") else std_text
                p.copy_(torch.from_numpy(rng.normal(0.0, std, size=tuple(p.shape)).astype(np.float32)))


def make_tiny_model(seed: int = 0, outlier: dict | None = None, vision: dict | None = None,
                    text_outlier: dict | None = None, family: str = MODEL_TYPE):
    """The tiny preset of ``family`` in memory: (model, tokenizer), random weights from ``seed``;
    ``outlier`` ({block, channels, scale, gain}) plants a sensitivity with
    :func:`plant_vision_outlier`; ``vision`` overrides vision-config keys (benchmarks use real widths)."""
    import torch

    from vlsens.family import get

    tokenizer = build_tiny_tokenizer()
    config = tiny_config(tokenizer, vision, family)
    torch.manual_seed(seed)
    model = get(family).transformers_class()(config).eval()
    init_weights_numpy(model, seed)
    if outlier:
        plant_vision_outlier(model, int(outlier["block"]), int(outlier.get("channels", 2)),
                             float(outlier.get("scale", 1000.0)), float(outlier.get("gain", 1.0)),
                             str(outlier.get("site", "attn")))
    if text_outlier:
        plant_text_outlier(model, int(text_outlier["layer"]), int(text_outlier.get("channels", 2)),
                           float(text_outlier.get("scale", 1000.0)))
    return model, tokenizer


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0, outlier: dict | None = None,
                          vision: dict | None = None, text_outlier: dict | None = None,
                          preset: str = "tiny") -> Path:
    """Write a tiny preset (``tiny``, ``tiny-qwen2vl``, ``tiny-qwen3vl``) as a complete HF
    checkpoint into ``out_dir`` (atomically)."""
    out_dir = Path(out_dir)
    family = PRESET_FAMILY[preset]
    model, tokenizer = make_tiny_model(seed, outlier, vision, text_outlier, family)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        _save_processor(tmp, tokenizer, family)
        (tmp / "vlsens_preset.json").write_text(json.dumps({"preset": preset, "seed": seed, "outlier": outlier,
                                                                "text_outlier": text_outlier}) + "\n")
    log.info("tiny checkpoint written to %s (%d parameters)", out_dir, model.num_parameters())
    return out_dir


#: Qwen2.5-VL-3B-Instruct's published config.json, vision and text parts.
REAL_3B_VISION = dict(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    out_hidden_size=2048,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    in_channels=3,
    tokens_per_second=2,
    hidden_act="silu",
)
REAL_3B_TEXT = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=128000,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1000000.0},
)


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
    std_vision = float(model.config.vision_config.initializer_range)
    std_text = float(model.config.text_config.initializer_range)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                std = std_vision if name.startswith("model.visual.") else std_text
                x = rng.standard_normal(size=tuple(p.shape), dtype=np.float32)
                x *= std
                p.copy_(torch.from_numpy(x))
                del x
            else:
                p.fill_(0.0 if name.endswith(".bias") else 1.0)


def build_3b_checkpoint(out_dir: str | Path, seed: int = 0, text_layers: int = 36) -> Path:
    """Write the ``3b`` preset (see the module docstring) into ``out_dir`` (atomically).

    Peak memory ≈ the bfloat16 model (2 bytes a parameter: 7.5 GB at 36 text layers, 2.3 GB at 2)
    plus one float32 copy of the largest matrix (the 1.2 GB embedding table)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.initialization import no_init_weights

    out_dir = Path(out_dir)
    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = REAL_3B_TEXT["max_position_embeddings"]
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
        _save_processor(tmp, tokenizer)
        (tmp / "vlsens_preset.json").write_text(json.dumps({"preset": "3b", "seed": seed,
                                                                "text_layers": text_layers}) + "\n")
    log.info("3b checkpoint written to %s (%d parameters, bfloat16)", out_dir, model.num_parameters())
    return out_dir


def _save_processor(tmp: Path, tokenizer, family: str = MODEL_TYPE) -> None:
    """Tokenizer and image-processor config as the family's published checkpoints have them
    (Qwen3-VL: patch 16, mean and std 0.5)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from vlsens.family import get

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


def check_tiny_outliers(tiny: dict, preset: str = "tiny") -> None:
    """The tiny preset's planted outliers name an existing vision block / text layer, at a site the
    family's blocks have."""
    from vlsens.errors import ConfigError

    vision, text_arch = TINY_ARCH[PRESET_FAMILY.get(preset, MODEL_TYPE)]
    outlier, text = tiny.get("outlier"), tiny.get("text_outlier")
    if outlier and not 0 <= int(outlier["block"]) < vision["depth"]:
        raise ConfigError(f"model.tiny.outlier.block: {outlier['block']} is not a vision block "
                          f"(0..{vision['depth'] - 1}).")
    if outlier and outlier.get("site", "attn") == "mlp" and PRESET_FAMILY.get(preset) != MODEL_TYPE:
        raise ConfigError(f"model.tiny.outlier.site: 'mlp' needs Qwen2.5-VL's gated vision MLP; the preset "
                          f"'{preset}' ({PRESET_FAMILY[preset]}) has an activation between its MLP layers "
                          "(the outlier would change the function): use 'attn'.")
    if text and not 0 <= int(text["layer"]) < text_arch["num_hidden_layers"]:
        raise ConfigError(f"model.tiny.text_outlier.layer: {text['layer']} is not a text layer "
                          f"(0..{text_arch['num_hidden_layers'] - 1}).")


# --------------------------------------------------------------------------------------------
# Checking and loading
# --------------------------------------------------------------------------------------------

def check_checkpoint_dir(path: str | Path, key: str = "model.checkpoint") -> Path:
    """Raise :class:`CheckpointError` unless ``path`` is a loadable safetensors checkpoint of a
    supported family (:mod:`vlsens.family`).

    Cheap (reads ``config.json`` and lists files), so it runs when the DAG is built.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(
            f"{key}: checkpoint directory '{path}' does not exist. Give a local Hugging Face "
            f"Qwen2.5-VL directory (with config.json and *.safetensors) or a preset: {', '.join(PRESETS)}."
        )
    if not p.is_dir():
        raise CheckpointError(f"{key}: '{path}' is a file; a checkpoint is a directory with config.json.")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"{key}: '{path}' has no config.json; is it a Hugging Face checkpoint directory?")
    try:
        model_type = json.loads(cfg.read_text()).get("model_type")
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{key}: '{cfg}' is not valid JSON ({e}).") from e
    from vlsens.family import FAMILIES

    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{key}: '{path}' holds model_type '{model_type}'; vlsens takes "
            + ", ".join(f"'{k}' ({f.title})" for k, f in FAMILIES.items()) + "."
        )
    if not any(p.glob("*.safetensors")):
        pickles = sorted(x.name for x in p.iterdir() if x.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise CheckpointError(
                f"{key}: '{path}' holds only pickle weights ({', '.join(pickles[:3])}); vlsens loads "
                "safetensors only, because unpickling runs arbitrary code. Convert it once in a trusted "
                "environment (model.save_pretrained(dir, safe_serialization=True))."
            )
        raise CheckpointError(f"{key}: '{path}' has no *.safetensors weight files.")
    check_safetensors_files(p, key)
    return p


def check_safetensors_files(directory: Path, key: str = "model.checkpoint") -> None:
    """Each ``*.safetensors`` file is complete (its header's tensors end exactly at the end of the
    file), and every shard an index names exists. Reads headers only, so it is cheap at any size."""
    for f in sorted(directory.glob("*.safetensors")):
        safetensors_header(f, key)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{key}: '{index}' is not a valid safetensors index ({e}).") from e
        missing = sorted(s for s in shards if not (directory / s).is_file())
        if missing:
            raise CheckpointError(f"{key}: '{index}' names shard(s) {missing} that are not in '{directory}'.")


def safetensors_header(path: Path, key: str = "model.checkpoint") -> dict:
    """The JSON header of a safetensors file; :class:`CheckpointError` naming the file when the
    file is not one, or is shorter or longer than its header says (truncated or corrupt)."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise CheckpointError(f"{key}: '{path}' is not a complete safetensors file ({size} bytes; its header "
                                  "cannot be read). Copy the file again.")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{key}: '{path}' has a corrupt safetensors header ({e}). Copy the file again.") from e
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise CheckpointError(
            f"{key}: '{path}' is {size} bytes but its safetensors header describes {8 + n + end}: the file is "
            f"{'truncated' if size < 8 + n + end else 'corrupt'}. Copy the file again.")
    return header


def load_model(path: str | Path, attn_implementation: str | None = None, device: str = "cpu",
               part: str | None = None):
    """Load the family's ``...ForConditionalGeneration`` (:mod:`vlsens.family`) in float32 from
    safetensors, eval mode.

    ``part="vision"`` materialises the vision tower only (``model.model.visual``, with
    ``model.model.get_image_features`` working as usual); ``part="text"`` the language model and
    ``lm_head`` only. The rest of the model stays on torch's ``meta`` device and takes no memory:
    the vision stages need 4 bytes per vision parameter (2.7 GB for Qwen2.5-VL-3B/7B/72B's
    669 M) instead of the whole checkpoint in float32 (15 GB for 3B), the text export 4 bytes per
    text parameter (12.4 GB for 3B)."""
    import torch

    from vlsens.family import family_of

    p = check_checkpoint_dir(path)
    model_class = family_of(p).transformers_class()
    if part in ("vision", "text"):
        return _load_part(p, part, attn_implementation, device)
    if part is not None:
        raise ValueError(f"part: {part!r} (vision, text or None)")
    kwargs = dict(
        dtype=torch.float32,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
    )
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model, info = model_class.from_pretrained(str(p), output_loading_info=True, **kwargs)
    except Exception as e:  # safetensors and transformers raise their own types, naming no file
        raise CheckpointError(f"model.checkpoint: '{p}' cannot be loaded: {type(e).__name__}: {e}") from e
    problems = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems["error_msgs"] = list(info.get("error_msgs") or [])
    if any(problems.values()):
        what = "; ".join(f"{k.replace('_', ' ')} ({len(v)}): {', '.join(map(str, v[:8]))}"
                         + (" ..." if len(v) > 8 else "") for k, v in problems.items() if v)
        raise CheckpointError(
            f"model.checkpoint: '{p}' does not match its config.json: {what}. transformers would fill missing "
            "tensors with random values and every result would be wrong; fix or re-download the checkpoint.")
    return model.to(device).eval()


def _part_key(key: str, part: str) -> str | None:
    """The checkpoint key ``key`` as a name in the ``part`` it belongs to (None: another part).
    Both layouts are read: transformers 5's (``model.visual.*``, ``model.language_model.*``,
    ``lm_head.*``) and the published checkpoints' (``visual.*``, ``model.*``, ``lm_head.*``)."""
    if part == "vision":
        for prefix in ("model.visual.", "visual."):
            if key.startswith(prefix):
                return "visual." + key[len(prefix):]
        return None
    if key.startswith("lm_head."):
        return key
    if key.startswith("model.language_model."):
        return "language_model." + key[len("model.language_model."):]
    if key.startswith("model.") and not key.startswith("model.visual."):
        return "language_model." + key[len("model."):]
    return None


def _load_part(p: Path, part: str, attn_implementation: str | None, device: str):
    """The model with only ``part`` (vision: ``model.model.visual``; text: the language model and
    ``lm_head``) materialised in float32 from safetensors, tensor by tensor; the rest stays on
    torch's meta device."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig
    from transformers.initialization import no_init_weights

    from vlsens.family import family_of

    model_class = family_of(p).transformers_class()
    config = AutoConfig.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    if attn_implementation:
        config._attn_implementation = attn_implementation
        for sub in (config.vision_config, config.text_config):
            sub._attn_implementation = attn_implementation
    with torch.device("meta"):
        model = model_class(config)
    tied = bool(getattr(config, "tie_word_embeddings", False) or getattr(config.text_config, "tie_word_embeddings", False))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with no_init_weights():  # every parameter is loaded below; buffers are computed as usual
            if part == "vision":
                modules = {"visual": type(model.model.visual)._from_config(config.vision_config, dtype=torch.float32)}
            else:
                lm = type(model.model.language_model)._from_config(config.text_config, dtype=torch.float32)
                head = torch.nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
                modules = {"language_model": lm, "lm_head": head}
    finally:
        torch.set_default_dtype(old)
    state = {f"{name}.{k}": v for name, m in modules.items() for k, v in m.state_dict().items()}
    if part == "text" and tied:
        del state["lm_head.weight"]
    found = set()
    try:
        for f in sorted(p.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    name = _part_key(key, part)
                    if name is None or (tied and name == "lm_head.weight"):
                        continue
                    if name not in state:
                        raise CheckpointError(f"model.checkpoint: '{f}' has tensor '{key}' that the config's model "
                                              "does not have; fix or re-download the checkpoint.")
                    t = sf.get_tensor(key)
                    if tuple(t.shape) != tuple(state[name].shape):
                        raise CheckpointError(f"model.checkpoint: '{f}' tensor '{key}' has shape {tuple(t.shape)}, "
                                              f"the config says {tuple(state[name].shape)}.")
                    with torch.no_grad():
                        state[name].copy_(t.to(torch.float32))
                    found.add(name)
                    del t
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"model.checkpoint: '{p}' cannot be loaded: {type(e).__name__}: {e}") from e
    missing = sorted(set(state) - found)
    if missing:
        as_saved = [n if n.startswith("lm_head.") else f"model.{n}" for n in missing]  # transformers' key names
        raise CheckpointError(
            f"model.checkpoint: '{p}' does not match its config.json: missing keys ({len(missing)}): "
            + ", ".join(as_saved[:8]) + (" ..." if len(missing) > 8 else "")
            + ". transformers would fill missing tensors with random values and every result would be wrong; "
            "fix or re-download the checkpoint.")
    if part == "vision":
        model.model.visual = modules["visual"].to(device).eval()
    else:
        model.model.language_model = modules["language_model"].to(device).eval()
        model.lm_head = modules["lm_head"].to(device).eval()
        if tied:
            model.lm_head.weight = model.model.language_model.embed_tokens.weight
    return model.eval()


def load_image_processor(path: str | Path):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)


def _image_text_processor_class(family: str = MODEL_TYPE):
    from transformers.processing_utils import ProcessorMixin

    from vlsens.family import get

    base = get(family).transformers_class("processor_class")

    class ImageTextProcessor(base):
        """The family's processor (``Qwen2_5_VLProcessor`` ...) without its video sub-processor.

        transformers' video processor needs torchvision, which has no CPU build; images and text
        go through the very same ``__call__`` code.
        """

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            for name, token in (("image", "<|image_pad|>"), ("video", "<|video_pad|>"),
                                ("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>")):
                tok = getattr(tokenizer, f"{name}_token", None) or token
                setattr(self, f"{name}_token", tok)
                setattr(self, f"{name}_token_id", tokenizer.convert_tokens_to_ids(tok))
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return ImageTextProcessor


def load_processor(path: str | Path):
    """The checkpoint's processor: ``AutoProcessor`` where it loads, else the image+text processor.

    ``AutoProcessor`` needs torchvision for the video processor; on hosts without it the same
    image processor and tokenizer are combined by :func:`_image_text_processor_class`.
    """
    from transformers import AutoProcessor, AutoTokenizer

    from vlsens.family import family_of

    try:
        return AutoProcessor.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (ImportError, ModuleNotFoundError) as e:
        log.info("AutoProcessor unavailable (%s); using image processor + tokenizer", str(e).strip()[:80])
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    cls = _image_text_processor_class(family_of(path).model_type)
    return cls(load_image_processor(path), tokenizer, chat_template=getattr(tokenizer, "chat_template", None))


def embedding_table(checkpoint: str | Path):
    """The token embedding table (numpy, the checkpoint's dtype widened to float32) read from its
    safetensors alone. Checkpoints name it ``model.embed_tokens.weight`` (the published layout,
    which transformers 5 also writes) or ``model.language_model.embed_tokens.weight``."""
    import numpy as np
    from safetensors import safe_open

    names = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
             "language_model.model.embed_tokens.weight")
    ckpt = Path(checkpoint)
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        files = sorted({ckpt / wm[n] for n in names if n in wm})
    else:
        files = sorted(ckpt.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as st:  # "pt": bfloat16 checkpoints too
            for n in names:
                if n in st.keys():
                    return st.get_tensor(n).float().numpy().astype(np.float32)
    raise KeyError(f"{checkpoint}: none of {names} in its safetensors")
