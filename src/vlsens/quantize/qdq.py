"""ONNX Runtime static quantization (QDQ) with one calibration, reused everywhere.

Every quantized model vlsens builds (per-op reference models, the all-op model the engine is
made from, the mixed-precision profile) comes from ``onnxruntime.quantization.quantize_static``
with the same :class:`QuantSettings` and the same calibration cache, so their Q/DQ parameters
agree exactly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from vlsens.model.family import NODE_NAMES

log = logging.getLogger(__name__)

DEFAULT_OP_TYPES = ("MatMul", "Gemm", "Conv")
_QTYPES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}
_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
#: The calibrators' options. ORT's Entropy calibrator defaults to 128 histogram bins and 128
#: quantized bins, so its only candidate threshold is the whole range: MinMax's. TensorRT's entropy
#: recipe (which the calibrator cites) searches 2048 bins for the 128 quantized bins of 8 bits.
CALIBRATOR_OPTIONS = {"entropy": {"num_bins": 2048, "num_quantized_bins": 128}}


@dataclass(frozen=True)
class QuantSettings:
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    activation_type: str = "uint8"
    weight_type: str = "int8"
    per_channel: bool = True
    calibrate_method: str = "minmax"
    #: 7-bit weights (ORT's guard against u8 x s8 saturation on CPUs without VNNI)
    reduce_range: bool = False
    #: activations symmetric around zero (TensorRT)
    activation_symmetric: bool = False
    #: the deployment target (vlsens.quantize.target) and its saturation guard, recorded with the settings
    target: str = "ort-cpu"
    guard: str = "none"
    guard_why: str = ""
    #: the wide activation type an op may take instead of ``activation_type`` (W8A16: ``uint16``
    #: or ``int16``); empty: every quantized activation is 8-bit (:data:`vlsens.quantize.target.WIDE`)
    activation_wide: str = ""
    #: how weights are rounded onto ORT's grid: ``rtn`` (ORT's own codes) or ``gptq``
    #: (:mod:`vlsens.quantize.rounding`: the engine's codes, written over ORT's in every model)
    weight_rounding: str = "rtn"

    @classmethod
    def from_config(cls, cfg: dict) -> "QuantSettings":
        """From :func:`vlsens.quantize.target.resolve` (``sensitivity.*`` for the run's ``quant.target``)
        or a record's ``settings``; keys older records lack take their defaults."""
        return cls(
            op_types=tuple(cfg["op_types"]),
            activation_type=cfg["activation_type"],
            weight_type=cfg["weight_type"],
            per_channel=bool(cfg["per_channel"]),
            calibrate_method=cfg["calibrate_method"],
            reduce_range=bool(cfg.get("reduce_range", False)),
            activation_symmetric=bool(cfg.get("activation_symmetric", False)),
            target=str(cfg.get("target", "ort-cpu")),
            guard=str(cfg.get("guard", "none")),
            guard_why=str(cfg.get("guard_why", "")),
            activation_wide=str(cfg.get("activation_wide", "") or ""),
            weight_rounding=str(cfg.get("weight_rounding", "rtn")),
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        d["op_types"] = list(self.op_types)
        return d

    def kwargs(self, wide_tensors: Iterable[str] = (), all_wide: bool = False) -> dict:
        """``quantize_static``'s arguments. ``wide_tensors``: activation tensors quantized to
        :attr:`activation_wide` instead (ORT's ``TensorQuantOverrides``, the mechanism of its QNN
        mixed-precision configs); ``all_wide``: every activation wide (the engine's W8A16 model).
        A 16-bit type makes ORT raise the model to opset 21, where Q/DQ take 16-bit types."""
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

        wide_tensors = sorted(set(wide_tensors))
        if (wide_tensors or all_wide) and not self.activation_wide:
            raise ValueError("wide activations asked for, but the settings have no activation_wide type")
        extra: dict = {"ActivationSymmetric": True} if self.activation_symmetric else {}
        if wide_tensors and not all_wide:
            wide = getattr(QuantType, _QTYPES[self.activation_wide])
            extra["TensorQuantOverrides"] = {t: [{"quant_type": wide}] for t in wide_tensors}
        act = self.activation_wide if all_wide else self.activation_type
        return dict(
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(self.op_types),
            per_channel=self.per_channel,
            reduce_range=self.reduce_range,
            activation_type=getattr(QuantType, _QTYPES[act]),
            weight_type=getattr(QuantType, _QTYPES[self.weight_type]),
            calibrate_method=getattr(CalibrationMethod, _METHODS[self.calibrate_method]),
            use_external_data_format=True,
            extra_options=extra,
        )


@dataclass
class Op:
    """A quantizable node of the float graph."""

    name: str
    op_type: str
    weight_params: int
    block: int | None = None
    role: str = ""

    def as_row(self) -> dict:
        return {"op": self.name, "op_type": self.op_type,
                "block": "" if self.block is None else self.block, "role": self.role,
                "weight_params": self.weight_params}


_BLOCK_RE = re.compile(rf"(?:^|/|\.){NODE_NAMES.block}(?:/|\.|$)")


def parse_op_name(name: str, op_type: str = "") -> tuple[int | None, str]:
    """Block index and role from an exported node name.

    ``/visual/blocks.7/mlp/down_proj/Gemm`` -> (7, ``mlp.down_proj``);
    ``/visual/merger/mlp/mlp.2/Gemm`` -> (None, ``merger.mlp.mlp.2``);
    ``/visual/blocks.0/attn/MatMul_3`` -> (0, ``attn.MatMul_3``).
    """
    m = _BLOCK_RE.search(name)
    block = int(m.group(1)) if m else None
    parts = [p for p in name.strip("/").split("/") if p]
    if parts and parts[0] in NODE_NAMES.prefixes:
        parts = parts[1:]
    if m:
        idx = next(i for i, p in enumerate(parts) if re.fullmatch(NODE_NAMES.block, p))
        parts = parts[idx + 1:]
    if len(parts) > 1 and parts[-1] == op_type:  # ".../down_proj/Gemm" -> "down_proj"
        parts = parts[:-1]
    return block, ".".join(parts)


#: Ops between an attention MatMul and its Softmax (scaling, masking, casts, reshapes).
_PASS_THROUGH = {"Mul", "Div", "Add", "Sub", "Where", "Cast", "Reshape", "Transpose", "Dropout", "Identity"}


def attention_role(node, producer: dict, consumers: dict, depth: int = 4) -> str | None:
    """``qk`` for a weightless MatMul whose output reaches a Softmax (the scores Q·Kᵀ), ``av`` for
    one that reads a Softmax's output (the probabilities times V), through at most ``depth``
    scaling / masking / cast / reshape ops; None otherwise."""

    def reaches_softmax(tensor, d):
        for c in consumers.get(tensor, ()):
            if c.op_type == "Softmax" or (d > 0 and c.op_type in _PASS_THROUGH
                                          and any(reaches_softmax(o, d - 1) for o in c.output)):
                return True
        return False

    def from_softmax(tensor, d):
        p = producer.get(tensor)
        if p is None:
            return False
        return p.op_type == "Softmax" or (d > 0 and p.op_type in _PASS_THROUGH
                                          and any(from_softmax(x, d - 1) for x in p.input if x))

    if any(from_softmax(x, depth) for x in node.input if x):
        return "av"
    if any(reaches_softmax(o, depth) for o in node.output):
        return "qk"
    return None


def quantizable_ops(model, op_types: Iterable[str] = DEFAULT_OP_TYPES, weights_only: bool = False) -> list[Op]:
    """Nodes of ``op_types`` in graph order, with their weight parameter counts; ``weights_only``
    leaves out those without a weight (activation x activation MatMuls: attention scores). An
    attention MatMul's role names what it computes (``attn.qk``, ``attn.av``:
    :func:`attention_role`), not its exported name (``attn.MatMul_3``)."""
    from vlsens.core.onnxgraph import consumers, producers

    inits = {i.name: int(np.prod(i.dims)) if len(i.dims) else 1 for i in model.graph.initializer}
    wanted = set(op_types)
    producer, readers = producers(model.graph.node), consumers(model.graph.node)
    ops = []
    for node in model.graph.node:
        if node.op_type in wanted:
            # The weight is the second input (Conv W, Gemm B, MatMul B) when it is an initializer.
            w = inits.get(node.input[1], 0) if len(node.input) > 1 else 0
            if weights_only and not w:
                continue
            block, role = parse_op_name(node.name, node.op_type)
            if node.op_type == "MatMul" and not w and not any(x in inits for x in node.input):
                kind = attention_role(node, producer, readers)
                if kind:
                    scope = role.rsplit(".", 1)[0] if "." in role else ""
                    scope = scope if scope.endswith("attn") else (role if role.endswith("attn") else "attn")
                    role = f"{scope}.{kind}"
            ops.append(Op(node.name, node.op_type, w, block, role))
    names = [o.name for o in ops]
    if len(set(names)) != len(names):
        raise ValueError("quantizable nodes must have unique names")
    return ops


def prepare_float_model(src: str | Path, dst: str | Path) -> Path:
    """The float model the quantizer works on: shared (Identity) weights untied, nodes named."""
    import onnx

    from vlsens.core.onnxutil import save_with_external_data, untie_identity_initializers

    model = onnx.load(str(src), load_external_data=True)
    untie_identity_initializers(model)
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_vlsens_{i}"
    return save_with_external_data(model, dst)


#: The opset at which QuantizeLinear / DequantizeLinear take 16-bit types.
WIDE_OPSET = 21


def raise_opset(model_path: str | Path, version: int = WIDE_OPSET) -> bool:
    """Convert ``model_path`` to opset ``version`` in place, the graph only: its weights stay in
    its data file, untouched. ``quantize_static`` converts a model below opset 21 itself when it
    writes 16-bit Q/DQ, by serializing the whole model, which protobuf refuses above 2 GiB (the
    Qwen2.5-VL-3B vision tower is 2.67 GB); converted here first, it has nothing to convert.
    Returns whether the model was converted."""
    import onnx
    from onnx import version_converter

    from vlsens.core.fsutil import atomic_file

    model_path = Path(model_path)
    model = onnx.load(str(model_path), load_external_data=False)
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if current >= version:
        return False
    converted = version_converter.convert_version(model, version)
    with atomic_file(model_path) as tmp:
        onnx.save_model(converted, str(tmp))
    return True


def calibrate(float_model: str | Path, cache: str | Path, settings: QuantSettings, reader, scratch: str | Path) -> Path:
    """ORT's calibration cache for ``float_model``, written by ORT's own calibrator (what
    ``quantize_static`` runs on a cache miss, with the same options), alone: the calibrator's
    model copy and session only. Inside ``quantize_static`` the quantizer's model copy is held
    as well (11.3 GB instead of about 6 for the 2.7 GB Qwen2.5-VL-3B vision tower)."""
    import tempfile

    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    kw = settings.kwargs()
    with tempfile.TemporaryDirectory(prefix="ort.quant.", dir=scratch) as d:
        calibrator = create_calibrator(Path(float_model), list(kw["op_types_to_quantize"]),
                                       augmented_model_path=str(Path(d) / "augmented_model.onnx"),
                                       calibrate_method=kw["calibrate_method"], use_external_data_format=True,
                                       extra_options=dict(CALIBRATOR_OPTIONS.get(settings.calibrate_method, {})))
        # ORT's default execution order runs the appended reductions late and keeps every
        # intermediate they read alive (13.9 GB for the 3B vision tower at 448x448): the same
        # session (optimizations off, as ORT makes it) in priority order.
        del calibrator.infer_session
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        calibrator.infer_session = ort.InferenceSession(calibrator.augmented_model_path, sess_options=so,
                                                        providers=calibrator.execution_providers)
        calibrator.collect_data(reader)
        ranges = calibrator.compute_data()
        del calibrator
    save_tensors_data(ranges, cache, smooth_quant=False)
    return Path(cache)


def quantize(float_model: str | Path, out_model: str | Path, nodes: Sequence[str],
             settings: QuantSettings, cache: str | Path, reader=None, wide_tensors: Iterable[str] = (),
             all_wide: bool = False) -> Path:
    """QDQ-quantize exactly ``nodes``; the calibration cache is created on first use from
    ``reader`` (by :func:`calibrate`, with its calibrator options; better beforehand) and reused.
    ``wide_tensors`` / ``all_wide``: activations at the settings' wide type
    (:meth:`QuantSettings.kwargs`). With ``weight_rounding: gptq`` the weights take the GPTQ codes
    kept beside ``cache`` (:mod:`vlsens.quantize.rounding`)."""
    from onnxruntime.quantization import quantize_static

    from vlsens.core.onnxutil import check_compact, data_path

    out_model = Path(out_model)
    out_model.parent.mkdir(parents=True, exist_ok=True)
    # ORT saves through onnx's external-data writer, which appends to a data file of the same name
    # (a second build at one path would carry the first one's bytes): start from nothing.
    out_model.unlink(missing_ok=True)
    data_path(out_model).unlink(missing_ok=True)
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.INFO))
    if reader is not None and not Path(cache).exists():
        calibrate(float_model, cache, settings, reader, out_model.parent)
    quantize_static(str(float_model), str(out_model), reader, nodes_to_quantize=list(nodes),
                    calibration_cache_path=str(cache), **settings.kwargs(wide_tensors, all_wide))
    check_compact(out_model)
    if settings.weight_rounding == "gptq":
        from vlsens.quantize.rounding import apply, codes_path, verified

        apply(out_model, verified(codes_path(cache)))
    return out_model


def quantized_ops(model_path: str | Path, ops: Sequence[str]) -> set[str]:
    """The ops among ``ops`` that run in INT8 in a QDQ model: their weight (second) input comes
    from a DequantizeLinear node (activation x activation MatMuls: both inputs do)."""
    import onnx

    from vlsens.core.onnxgraph import producers

    model = onnx.load(str(model_path), load_external_data=False)
    producer = {t: n.op_type for t, n in producers(model.graph.node).items()}
    wanted = set(ops)
    out = set()
    for node in model.graph.node:
        if node.name in wanted and len(node.input) > 1 and producer.get(node.input[1]) == "DequantizeLinear":
            out.add(node.name)
    return out


def wide_tensors(ops_tensors: dict[str, list[str]], wide_ops: Iterable[str]) -> list[str]:
    """The activation tensors a W8A16 op set widens: every quantized tensor next to one of
    ``wide_ops`` (``ops_tensors``: tensor -> the ops that read or write it, the switch map's). A
    tensor shared by an 8-bit and a 16-bit op is 16-bit for both: one type per tensor, no
    conversions, so the engine's estimate is the built model."""
    wide = set(wide_ops)
    return [t for t, adj in ops_tensors.items() if wide & set(adj)]


def wide_quantized(model_path: str | Path) -> set[str]:
    """The activation tensors a QDQ model quantizes to a 16-bit type (its QuantizeLinear's zero
    point is uint16 / int16)."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    wide = {TensorProto.UINT16, TensorProto.INT16}
    return {n.input[0] for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in inits and len(n.input) > 2
            and inits.get(n.input[2]) in wide}


def select_ops(model_path: str | Path, settings: QuantSettings, weights_only: bool = False) -> list[Op]:
    import onnx

    return quantizable_ops(onnx.load(str(model_path), load_external_data=False), settings.op_types, weights_only)
