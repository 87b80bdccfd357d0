"""ONNX Runtime's QNN execution provider: the profile's QDQ model and its tensor overrides.

A profile built for ``quant.target: qnn`` (or ``npu``) is a QDQ model whose activations are
uint8, or uint16 next to the profile's W8A16 ops, per tensor: what QNN's HTP backend runs.
vlsens builds it with ``quantize_static`` and ``TensorQuantOverrides`` (the mechanism ORT's own
``get_qnn_qdq_config`` sets), measures it on ONNX Runtime's CPU provider and checks that it equals
the engine's estimate (``eval.json``). :func:`overrides` gives the same choice as the
``init_overrides`` ``get_qnn_qdq_config`` takes, for users who re-quantize with ORT's QNN recipe.
"""

from __future__ import annotations

from pathlib import Path

#: ORT QuantType names of the 16-bit activation types (``TensorQuantOverrides`` in JSON).
QUANT_TYPES = {"uint16": "QUInt16", "int16": "QInt16"}


def overrides(model: str | Path, wide_type: str) -> dict[str, list[dict]]:
    """``{tensor: [{"quant_type": "QUInt16"}]}`` for every activation tensor ``model`` (a QDQ model)
    quantizes to 16 bits."""
    from vlsens.quantize.qdq import wide_quantized

    return {t: [{"quant_type": QUANT_TYPES[wide_type]}] for t in sorted(wide_quantized(model))}


def opset(model: str | Path) -> int:
    """The model's default-domain opset (16-bit Q/DQ need 21)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)
