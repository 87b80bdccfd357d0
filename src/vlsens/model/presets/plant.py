"""Planted sensitivities: function-preserving activation outliers in one vision block or one
text layer (``model.tiny.outlier``, ``model.tiny.text_outlier``), so a test knows which op an
engine must rank first."""

from __future__ import annotations


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
    if site not in _VISION_SITES:
        raise ValueError(f"model.tiny.outlier.site: '{site}' (attn, proj, mlp)")
    with torch.no_grad():
        return _VISION_SITES[site](vis.blocks[block], channels, scale, gain)


def _plant_attn(blk, channels: int, scale: float, gain: float) -> list[int]:
    n = blk.norm1.weight.shape[0]
    idx = list(range(0, n, max(1, n // channels)))[:channels]
    blk.norm1.weight[idx] *= scale
    if getattr(blk.norm1, "bias", None) is not None:  # LayerNorm (Qwen2-VL, Qwen3-VL)
        blk.norm1.bias[idx] *= scale
    blk.attn.qkv.weight[:, idx] /= scale
    blk.attn.proj.weight *= gain
    blk.attn.proj.bias *= gain
    return idx


def _plant_proj(blk, channels: int, scale: float, gain: float) -> list[int]:
    dim = blk.attn.proj.in_features
    idx = list(range(0, dim, max(1, dim // channels)))[:channels]
    rows = [2 * dim + i for i in idx]  # qkv's output is (q, k, v) x heads x head_dim
    blk.attn.qkv.weight[rows, :] *= scale
    blk.attn.qkv.bias[rows] *= scale
    blk.attn.proj.weight[:, idx] /= scale
    blk.attn.proj.weight *= gain
    blk.attn.proj.bias *= gain
    return idx


def _plant_mlp(blk, channels: int, scale: float, gain: float) -> list[int]:
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
    return idx


#: :func:`plant_vision_outlier`'s sites (its docstring says what each plants).
_VISION_SITES = {"attn": _plant_attn, "proj": _plant_proj, "mlp": _plant_mlp}



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
