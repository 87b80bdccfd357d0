"""Model families: what differs between Qwen2-VL, Qwen2.5-VL and Qwen3-VL, in one table.

A checkpoint's family is its ``config.json`` ``model_type``; every stage that builds a
transformers model, a processor or a size rule asks :func:`family_of` and reads the
:class:`Family` instead of naming a class. Differences that matter to export (checked against
transformers' modeling code):

=============  ======  ===============================  =====================  ===========
family         patch   vision blocks                    LM                     DeepStack
=============  ======  ===============================  =====================  ===========
qwen2_vl       14      LayerNorm, QuickGELU MLP, full   mRoPE                  no
                       attention per image
qwen2_5_vl     14      RMSNorm, SwiGLU MLP, windowed    mRoPE                  no
                       + full-attention blocks
qwen3_vl       16      LayerNorm, GELU MLP, full        QK-norm, interleaved   yes
                       attention, learned position      mRoPE
                       table interpolated per grid
=============  ======  ===============================  =====================  ===========

Image sides are multiples of ``patch_size x merge_size``: 28 for Qwen2/2.5-VL, 32 for Qwen3-VL.

**DeepStack** (Qwen3-VL): the vision tower also returns one merged feature map per
``deepstack_visual_indexes`` block; the language model adds feature map *i* to its hidden states
after decoder layer *i*, at the visual token positions. vlsens keeps them: a Qwen3-VL vision graph
returns its merged tokens and the DeepStack maps side by side on the feature axis
(``(..., (1 + K) x D)``, :func:`split_features`), and the text graph takes them as a dense input
``deepstack_embeds`` ``(K, B, S, D)`` (zero at non-visual positions, :func:`dense_deepstack`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlsens.core.errors import CheckpointError
from vlsens.model.presets import PRESET_FAMILY


@dataclass(frozen=True)
class Family:
    model_type: str
    title: str
    config_class: str
    model_class: str
    processor_class: str
    patch_size: int
    windows: bool       # windowed vision attention (get_vision_window_index)
    deepstack: bool     # vision returns deepstack features the LM adds after its first layers
    pos_table: bool     # learned vision position table, interpolated per grid
    deploy: bool        # the ORT-GenAI folder (vlsens.deploy) supports it
    video_prompt: bool = True  # video+prompt parity cases can be built (Qwen3-VL's carry frame timestamps)
    genai_type: str = ""  # genai_config.json's model type (onnxruntime-genai's name for the family)
    genai_processor: str = ""  # processor_config.json's processor name (onnxruntime-extensions)

    @property
    def factor(self) -> int:
        """Image sides must be multiples of this (patch x merge 2)."""
        return self.patch_size * 2

    def transformers_class(self, which: str = "model_class"):
        import transformers

        return getattr(transformers, getattr(self, which))


FAMILIES = {
    "qwen2_vl": Family("qwen2_vl", "Qwen2-VL", "Qwen2VLConfig", "Qwen2VLForConditionalGeneration",
                       "Qwen2VLProcessor", 14, windows=False, deepstack=False, pos_table=False, deploy=False),
    "qwen2_5_vl": Family("qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                         "Qwen2_5_VLProcessor", 14, windows=True, deepstack=False, pos_table=False, deploy=True,
                         genai_type="qwen2_5_vl", genai_processor="qwen2_5_image_processor"),
    "qwen3_vl": Family("qwen3_vl", "Qwen3-VL", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
                       "Qwen3VLProcessor", 16, windows=False, deepstack=True, pos_table=True, deploy=False,
                       video_prompt=False),
}
DEFAULT = "qwen2_5_vl"


@dataclass(frozen=True)
class NodeNames:
    """How the checkpoint's module names reach the exported graphs and the weights, for every family
    of the table (all three name their modules alike: ``model.visual.blocks.<k>``,
    ``model.language_model.layers.<k>``, ``lm_head``). Generic code reads these instead of naming a
    module: a family that names them otherwise gets its own entry here, and nothing else changes."""

    #: top module scopes of a node name, left out of labels (``/visual/blocks.7/...``)
    prefixes: tuple[str, ...] = ("visual", "model", "language_model")
    #: a block's scope in a node name, vision (``blocks.<k>``) or text (``layers.<k>``)
    block: str = r"(?:blocks|layers)\.(\d+)"
    #: a vision block's scope in a node name, as the exporter writes it (``/visual/blocks.<k>/``)
    vision_block: str = r"(?:^|/)(?:visual/)?blocks\.(\d+)/"
    #: in a safetensors key: a weight of the vision tower
    vision_weights: str = "visual"
    #: the language model's head (its MatMul's name scope) and the graphs' output name
    lm_head: str = "lm_head"
    logits: str = "logits"
    #: the heatmap's column order: roles as the ranking names them
    role_order: tuple[str, ...] = ("patch_embed", "qkv", "q_proj", "k_proj", "v_proj", "attn Q·Kᵀ", "attn A·V",
                                   "attn MatMul", "proj", "o_proj", "gate_proj", "up_proj", "down_proj", "merger.0",
                                   "merger.2", "lm_head")


NODE_NAMES = NodeNames()


def of_vision_config(vision_config) -> Family:
    """The family of a vision tower's config (its ``model_type`` is the family's + ``_vision``)."""
    return get(str(vision_config.model_type).removesuffix("_vision"), "vision_config.model_type")


def get(model_type: str, key: str = "model_type") -> Family:
    if model_type not in FAMILIES:
        raise CheckpointError(f"{key}: model_type '{model_type}' is not supported; vlsens takes "
                              + ", ".join(f"'{k}' ({f.title})" for k, f in FAMILIES.items()) + ".")
    return FAMILIES[model_type]


def family_of(checkpoint: str | Path, key: str = "model.checkpoint") -> Family:
    """The family of a checkpoint directory, from its ``config.json`` (cheap: no torch)."""
    cfg = Path(checkpoint) / "config.json"
    try:
        model_type = json.loads(cfg.read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{key}: cannot read '{cfg}' ({e}).") from e
    return get(model_type, f"{key} ('{cfg}')")


def for_config(config: dict) -> Family:
    """The family of the configured model: a preset's own, else the checkpoint directory's
    ``config.json`` (a relative path is read from the working directory, as the workflow does)."""
    ckpt = str(config["model"]["checkpoint"])
    if ckpt in PRESET_FAMILY:
        return FAMILIES[PRESET_FAMILY[ckpt]]
    return family_of(ckpt)


def size_rule(config: dict) -> dict:
    """``parse_size`` keywords for the configured family: ``factor`` and its title for messages."""
    f = for_config(config)
    return {"factor": f.factor, "family": f"{f.title} (detected from model.checkpoint)"}


def deepstack_count(vision_config) -> int:
    return len(getattr(vision_config, "deepstack_visual_indexes", None) or [])


def split_features(features: np.ndarray, k: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """A vision graph's output ``(..., (1 + k) x D)`` -> (merged tokens, the k DeepStack maps)."""
    if k == 0:
        return features, []
    parts = np.split(np.asarray(features), k + 1, axis=-1)
    return parts[0], parts[1:]


def dense_deepstack(maps, visual_mask: np.ndarray) -> np.ndarray:
    """DeepStack maps (each ``(n_visual, D)``, in visual-token order) -> ``(K, B, S, D)`` float32,
    zero where ``visual_mask`` (B, S) is false: the text graph's ``deepstack_embeds`` input."""
    visual_mask = np.asarray(visual_mask, dtype=bool)
    b, s = visual_mask.shape
    maps = [np.asarray(m, dtype=np.float32) for m in maps]
    out = np.zeros((len(maps), b, s, maps[0].shape[-1] if maps else 0), dtype=np.float32)
    for i, m in enumerate(maps):
        if len(m) != int(visual_mask.sum()):
            raise ValueError(f"DeepStack map {i} has {len(m)} rows for {int(visual_mask.sum())} visual tokens")
        out[i][visual_mask] = m
    return out
