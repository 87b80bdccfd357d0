"""FP32 ONNX -> BF16 ONNX (a pure transform; :mod:`vlsens.variants` gates and publishes).

What BF16 means here: weights and activations in bfloat16, the graph's inputs and outputs in
float32. The I/O stays float32 because every client of the graph (the calibration archives, the
image preprocessing, ONNX Runtime's Python API, NPU compilers' calibration readers) speaks numpy,
and numpy has no bfloat16 of its own; inside, the graph is what a ``torch_dtype=torch.bfloat16``
export computes. Its bytes are half of FP32's, so the 3B vision tower (1.34 GB) fits in one
protobuf.

It is the FP16 step's machinery (:mod:`vlsens.variants.float16`: onnxconverter-common with the model's own
Casts retargeted and transformers' float32 islands kept) with BF16 in place of FP16, minus the
range fallback (bfloat16 has float32's exponent range), plus two rules: every ``Softmax`` stays
FP32 (transformers computes attention softmax in float32 whatever the dtype, which a float32
export does not show), and a node whose operator has no bfloat16 type at the model's opset
(``Conv`` and ``ConstantOfShape`` at opset 19: bfloat16 came to them in opset 20/22) stays FP32
between Casts; the record lists them. Weights are rounded
from the FP32 source once, by ``ml_dtypes`` (round to nearest even, as torch's ``.to()``), never
through FP16.

ONNX Runtime's CPU provider has no bfloat16 kernels (MatMul, Add, Softmax ... are FP32/FP16 only),
so the gate runs the graph with :func:`run_reference`: ONNX's own reference implementation
(``onnx.reference``, numpy with ``ml_dtypes.bfloat16`` arrays), one node at a time, each
intermediate freed after its last reader. Where ONNX Runtime has a provider with bfloat16 kernels
(CUDA), the gate uses it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

BF16 = 16  # onnx.TensorProto.BFLOAT16
F16 = 10
F32 = 1


def bf16_supported(op_type: str, opset: int, domain: str = "") -> bool:
    """Does the operator's schema at ``opset`` admit bfloat16 tensors?"""
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return False
    if not schema.type_constraints:
        return True
    allowed = {t for tc in schema.type_constraints for t in tc.allowed_type_strs}
    return "tensor(bfloat16)" in allowed


def to_bf16_array(arr) -> np.ndarray:
    import ml_dtypes

    return np.asarray(arr, dtype=np.float32).astype(ml_dtypes.bfloat16)


def convert_bf16(src_model: str | Path, staged_model: Path) -> dict:
    """BF16 copy of ``src_model`` at ``staged_model`` (I/O FP32). Returns the facts for the parity
    record's ``extra``."""
    import onnx
    from onnx import numpy_helper

    from vlsens.core.onnxgraph import inferred_model
    from vlsens.core.onnxutil import check_model, save_streamed, tensor_array, untie_identity_initializers
    from vlsens.variants.float16 import to_fp16

    model = inferred_model(src_model)
    src_dir = Path(src_model).parent
    untied = untie_identity_initializers(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_vlsens_{i}"
    unsupported, islands, softmax = _kept_fp32(model, opset)
    keep = {**islands, **softmax, **unsupported}
    was_float = {t.name for t in model.graph.initializer if t.data_type == F32}
    inline = {t.name: tensor_array(t) for t in model.graph.initializer
              if t.name in was_float and not t.external_data}
    constants = {n.output[0]: numpy_helper.to_array(a.t) for n in model.graph.node if n.op_type == "Constant"
                 for a in n.attribute if a.name == "value" and a.t.data_type == F32}
    converted, casts = to_fp16(model, list(keep))
    del model
    retyped = _retype(converted, constants)
    own = set(casts)
    retargeted = sum(1 for n in converted.graph.node if n.name in own and n.op_type == "Cast"
                     and any(a.name == "to" and a.i == BF16 for a in n.attribute))
    _round_initializers(converted, inline)

    def convert(t, arr):
        return to_bf16_array(arr) if t.data_type == BF16 and t.name in was_float else arr

    save_streamed(converted, src_dir, staged_model, {n: np.float32 for n in was_float}, convert)
    del converted
    check_model(staged_model)
    kept = onnx.load(str(staged_model), load_external_data=False)
    left = sum(1 for t in kept.graph.initializer if t.data_type == F32)
    return {
        "converter": "onnxconverter_common.float16.convert_float_to_float16(keep_io_types=True), FLOAT16 -> "
                     "BFLOAT16, weights rounded from FP32 by ml_dtypes",
        "io": "float32",
        "fp32_unsupported": [{"node": n, "reason": r} for n, r in sorted(unsupported.items())],
        "fp32_softmax": len(softmax),
        "fp32_islands": {"nodes": len(set(islands) - set(unsupported)),
                         "scopes": sorted({r.split(" in ", 1)[1] for r in islands.values()})},
        "retargeted_casts": retargeted,
        "retyped_tensors": retyped,
        "fp32_initializers": left,
        "untied_initializers": untied,
    }


def _kept_fp32(model, opset: int) -> tuple[dict, dict, dict]:
    """The nodes that stay FP32, ``{name: reason}`` by rule: no bfloat16 type at ``opset``,
    transformers' float32 islands (:func:`vlsens.variants.float16.own_fp32_islands`), the
    attention softmax."""
    from vlsens.variants.float16 import own_fp32_islands

    unsupported = {n.name: f"{n.op_type} has no bfloat16 type at opset {opset}" for n in model.graph.node
                   if n.domain in ("", "ai.onnx") and not bf16_supported(n.op_type, opset)}
    islands = own_fp32_islands(model)
    # transformers' eager attention takes the softmax in float32 whatever the model's dtype
    # (softmax(..., dtype=torch.float32)); in a float32 export that leaves no Cast to find, so
    # the islands miss it. In bfloat16 it costs the 3B tower at 448x448 cosine 0.976 against
    # transformers (torch's own bfloat16 forward: 0.99988, as with the softmax kept float32).
    softmax = {n.name: "attention softmax: float32 in transformers" for n in model.graph.node
               if n.op_type == "Softmax" and n.name not in unsupported}
    return unsupported, islands, softmax


def _round_initializers(converted, inline: dict[str, np.ndarray]) -> None:
    """The converter's FP16 initializers as BF16 (in place): inline FP32 sources rounded from
    their FP32 values, the converter's own from their FP16 values; external ones only retyped
    (rounded from FP32 as they are streamed out)."""
    from onnx import numpy_helper

    for t in converted.graph.initializer:
        if t.data_type == F16:
            if t.name in inline:
                t.CopyFrom(numpy_helper.from_array(to_bf16_array(inline[t.name]), t.name))
            elif not t.external_data:  # made by the converter: its FP16 values
                t.CopyFrom(numpy_helper.from_array(to_bf16_array(numpy_helper.to_array(t)), t.name))
            else:
                t.data_type = BF16


def _retype(model, constants: dict[str, np.ndarray]) -> int:
    """Every FLOAT16 of the converted graph becomes BFLOAT16 (in place): value types, Cast
    targets, Constant values (from the FP32 originals by output name). Returns how many."""
    from onnx import numpy_helper

    g = model.graph
    n = 0
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        tt = vi.type.tensor_type
        if tt.elem_type == F16:
            tt.elem_type = BF16
            n += 1
    for node in g.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == F16:
                a.i = BF16
                n += 1
            elif a.type == 4 and a.t.data_type == F16:  # a tensor attribute (Constant's value)
                orig = constants.get(node.output[0]) if node.op_type == "Constant" else None
                values = orig if orig is not None else numpy_helper.to_array(a.t).astype(np.float32)
                a.t.CopyFrom(numpy_helper.from_array(to_bf16_array(values), a.t.name))
                n += 1
    return n


#: Ops whose bfloat16 inputs are multiplied in float32 (with BLAS) and the result rounded once.
_PRODUCTS = {"MatMul", "Gemm", "Conv"}


def run_reference(model_path: str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs by ONNX's reference implementation (``onnx.reference``), node by node,
    every intermediate dropped after its last reader (its own ``run`` keeps them all: at the 3B
    vision tower's widths that is tens of GB). Matrix products of bfloat16 tensors accumulate in
    float32 and round to bfloat16 (:data:`_PRODUCTS`); every other op computes on
    ``ml_dtypes.bfloat16`` arrays as ONNX's reference implementation does."""
    import ml_dtypes
    import onnx
    from onnx.reference import ReferenceEvaluator

    bf16 = np.dtype(ml_dtypes.bfloat16)
    model = onnx.load(str(model_path))
    ev = ReferenceEvaluator(model)
    last = {}
    for k, node in enumerate(ev.rt_nodes_):
        for x in node.input:
            last[x] = k
    outputs = [o.name for o in model.graph.output]
    del model
    values = dict(ev.rt_inits_)
    values.update(feeds)
    for k, node in enumerate(ev.rt_nodes_):
        if node.need_context():
            raise ValueError(f"{model_path}: node {node.op_type} needs a context (control flow); not supported")
        args = [values[x] if x else None for x in node.input]
        if node.op_type in _PRODUCTS and any(getattr(a, "dtype", None) == bf16 for a in args):
            # numpy's products of bfloat16 arrays take no BLAS (0.24 GMAC/s: an hour per 448x448
            # image of the 3B tower); in float32 with BLAS, rounded to bfloat16 once, as bfloat16
            # hardware and ONNX Runtime's CUDA kernels accumulate
            res = node.run(*[a.astype(np.float32) if getattr(a, "dtype", None) == bf16 else a for a in args])
            res = tuple(r.astype(bf16) for r in res)
        else:
            res = node.run(*args)
        for name, v in zip(node.output, res):
            values[name] = v
        for x in node.input:
            if last.get(x) == k and x not in outputs and x not in feeds and x not in ev.rt_inits_:
                del values[x]
    return [values[o] for o in outputs]


def session_opener(threads: int = 0, device: str = "auto"):
    """``open_session(path)`` for a BF16 graph: ONNX Runtime's CUDA provider where present (it has
    bfloat16 kernels; alone, so that no node falls back to the CPU provider, which has none), else
    :class:`ReferenceSession`."""
    from vlsens.core.onnxutil import available_providers, make_session

    if "CUDAExecutionProvider" in available_providers(device):
        return lambda path: make_session(path, threads=threads, providers=["CUDAExecutionProvider"])
    return ReferenceSession


class ReferenceSession:
    """An ``onnxruntime.InferenceSession`` look-alike over :func:`run_reference` (what
    :func:`vlsens.export.parity.measure` needs: inputs, outputs, run, providers)."""

    def __init__(self, path: str | Path):
        import onnx

        self.path = Path(path)
        m = onnx.load(str(path), load_external_data=False)
        init = {t.name for t in m.graph.initializer}
        self._inputs = [_Arg(i) for i in m.graph.input if i.name not in init]
        self._outputs = [_Arg(o) for o in m.graph.output]

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self._outputs

    def get_providers(self):
        return ["onnx.reference (ReferenceEvaluator, numpy + ml_dtypes)"]

    def run(self, names, feeds):
        outs = run_reference(self.path, feeds)
        if names is None:
            return outs
        index = {o.name: i for i, o in enumerate(self._outputs)}
        return [outs[index[n]] for n in names]


class _Arg:
    def __init__(self, vi):
        self.name = vi.name
        dims = vi.type.tensor_type.shape.dim
        self.shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
