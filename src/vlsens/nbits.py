"""Weight-only quantization of a graph's MatMuls (``MatMulNBits``: block-wise INT4 / INT8 weights,
float activations), as onnxruntime-genai ships language-model decoders.

Every quantized model here is written by ONNX Runtime's own ``MatMulNBitsQuantizer`` (the one the
model builder calls for ``-p int4``), with per-node bits: a MatMul is INT4, INT8 or left float.
Algorithms: ``rtn`` (round to nearest per block) and ``k_quant`` (llama.cpp's scale search per
block), both data-free. The bytes of an op at each width are read from the quantized models, not
computed from a formula.

``accuracy_level`` is ``MatMulNBits``' compute type (0: float32 activations; 4: the activations
are quantized to INT8 per block on the CPU, the builder's default for CPU). It is part of the
arithmetic: the sensitivity engine, the built models and the deploy folders use the same one.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ALGORITHMS = ("rtn", "k_quant")
BITS = (4, 8)
FLOAT = 0  # "bits" of an op left in float


@dataclass(frozen=True)
class NBitsSettings:
    """How weights are quantized (config ``<tower section>.nbits``)."""

    algorithm: str = "k_quant"
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 4

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"nbits.algorithm: {self.algorithm!r}; valid: {list(ALGORITHMS)}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"nbits.block_size: {self.block_size}; a power of two >= 16")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"nbits.accuracy_level: {self.accuracy_level}; valid: 0-4")

    @classmethod
    def from_config(cls, d: Mapping | None) -> NBitsSettings:
        """From ``deploy.nbits`` (its ``tolerance`` is not a quantization setting) or a record."""
        return cls(**{k: v for k, v in dict(d or {}).items() if k in cls.__dataclass_fields__})

    def as_dict(self) -> dict:
        return asdict(self)


def weight_matmuls(model) -> list[dict]:
    """The MatMuls of ``model`` (a path or ModelProto, graph only) whose second input is a 2-D
    initializer: name, weight, K, N, in graph order."""
    import onnx

    m = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    inits = {i.name: i for i in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            k, nn = (int(d) for d in inits[n.input[1]].dims)
            out.append({"name": n.name, "weight": n.input[1], "K": k, "N": nn})
    return out


def quantize(float_model: str | Path, out_model: str | Path, bits: Mapping[str, int], settings: NBitsSettings) -> Path:
    """Write ``float_model`` with every MatMul named in ``bits`` quantized to that width (4 or 8)
    and every other MatMul left float, by ONNX Runtime's ``MatMulNBitsQuantizer``; ``out_model`` +
    its data file. Node ``<name>`` becomes ``<name>_Q<bits>``."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        KQuantWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
        RTNWeightOnlyQuantConfig,
    )

    from vlsens.onnxutil import save_with_external_data

    bad = {n: b for n, b in bits.items() if b not in BITS}
    if bad:
        raise ValueError(f"bits must be one of {BITS} (float: leave the op out); got {bad}")
    model = onnx.load(str(float_model))
    names = [w["name"] for w in weight_matmuls(model)]
    unknown = sorted(set(bits) - set(names))
    if unknown:
        raise ValueError(f"not weight MatMuls of {float_model}: {unknown[:5]}")
    config = {n: {"bits": int(b), "group_size": settings.block_size,
                  "scheme": "sym" if settings.symmetric else "asym"} for n, b in bits.items()}
    algo = (RTNWeightOnlyQuantConfig if settings.algorithm == "rtn" else KQuantWeightOnlyQuantConfig)(
        customized_weight_config=config)
    q = MatMulNBitsQuantizer(model, bits=4, block_size=settings.block_size, is_symmetric=settings.symmetric,
                             accuracy_level=settings.accuracy_level, nodes_to_exclude=[n for n in names if n not in bits],
                             algo_config=algo)
    with contextlib.redirect_stdout(io.StringIO()):  # its progress bar
        q.process()
    out = q.model.model if hasattr(q.model, "model") else q.model
    for node in out.graph.node:  # the RTN / k_quant path does not set it
        if node.op_type == "MatMulNBits" and settings.accuracy_level and not any(
                a.name == "accuracy_level" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("accuracy_level", settings.accuracy_level))
    return save_with_external_data(out, out_model)


def quantized_nodes(model) -> dict[str, dict]:
    """``{float MatMul name: {"bits", "node", "bytes"}}`` of the ``MatMulNBits`` nodes of a model
    :func:`quantize` wrote (graph only); bytes: its weight, scale and zero-point tensors."""
    import onnx

    m = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    inits = {i.name: i for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        name = n.name.rsplit("_Q", 1)[0]
        nbytes = sum(_tensor_bytes(inits[x]) for x in n.input[1:] if x in inits)
        out[name] = {"bits": int(attrs["bits"]), "node": n.name, "bytes": nbytes}
    return out


def _tensor_bytes(t) -> int:
    import numpy as np
    from onnx import helper

    n = int(np.prod(t.dims)) if len(t.dims) else 1
    return n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize


def float_bytes(ops: Sequence[dict]) -> dict[str, int]:
    """Bytes of each op's float32 weight."""
    return {o["name"]: 4 * o["K"] * o["N"] for o in ops}


def float_activations_copy(model: str | Path, dst: str | Path) -> Path:
    """``model``'s graph with every ``MatMulNBits`` at ``accuracy_level`` 0 (float activations:
    the kernel computes ``x @ W`` of its dequantized weight exactly), written as ``dst`` beside it
    reading the same data file (graph only; nothing copied). The exact half of an INT4 decoder's
    parity gate."""
    import onnx

    model, dst = Path(model), Path(dst)
    if dst.parent.resolve() != model.parent.resolve():
        raise ValueError(f"{dst} must be beside {model} (it reads that model's data file)")
    m = onnx.load(str(model), load_external_data=False)
    for n in m.graph.node:
        if n.op_type == "MatMulNBits":
            for a in n.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
    onnx.save_model(m, str(dst))
    return dst
