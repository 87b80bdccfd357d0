"""Architectures of the presets (plain dicts of transformers config keys) and the DAG-build check
of the tiny preset's planted outliers. No torch, no transformers."""

from __future__ import annotations

from vlsens.core.errors import ConfigError
from vlsens.model.presets import MODEL_TYPE, PRESET_FAMILY

#: Architecture of the tiny preset: the real layout (windowed and full-attention vision blocks,
#: patch 14, merge 2, temporal patch 2, 3-D mRoPE) at toy widths.
TINY_VISION = dict(
    depth=4, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64, window_size=112,
    fullatt_block_indexes=[1, 3], patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
    # Wider than the 0.02 default: with 0.02 every block's output is negligible next to the
    # residual stream, unlike trained towers, and no single op could matter.
    initializer_range=0.1,
)


TINY_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
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


#: Qwen2.5-VL-3B-Instruct's published config.json, vision and text parts.
REAL_3B_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31], patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
    tokens_per_second=2, hidden_act="silu",
)


REAL_3B_TEXT = dict(
    hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
    vocab_size=151936, max_position_embeddings=128000, rms_norm_eps=1e-6, hidden_act="silu",
    rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1000000.0},
)


def check_tiny_outliers(tiny: dict, preset: str = "tiny") -> None:
    """The tiny preset's planted outliers name an existing vision block / text layer, at a site the
    family's blocks have."""
    vision, text_arch = TINY_ARCH[PRESET_FAMILY.get(preset, MODEL_TYPE)]
    outlier, text = tiny.get("outlier"), tiny.get("text_outlier")
    if outlier and not 0 <= int(outlier["block"]) < vision["depth"]:
        raise ConfigError(f"model.tiny.outlier.block: {outlier['block']} is not a vision block "
                          f"(0..{vision['depth'] - 1}).")
    if outlier and outlier.get("site", "attn") == "mlp" and PRESET_FAMILY.get(preset) != MODEL_TYPE:
        raise ConfigError(f"model.tiny.outlier.site: 'mlp' needs Qwen2.5-VL's gated vision MLP; the preset "
                          f"'{preset}' ({PRESET_FAMILY[preset]}) has an activation between its MLP layers "
                          "(the outlier would change the function): use 'attn'.")
    layers = int(tiny.get("text_layers") or text_arch["num_hidden_layers"])
    if text and not 0 <= int(text["layer"]) < layers:
        raise ConfigError(f"model.tiny.text_outlier.layer: {text['layer']} is not a text layer "
                          f"(0..{layers - 1}).")
