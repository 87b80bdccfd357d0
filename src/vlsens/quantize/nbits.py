"""Weight-only quantization of a graph's MatMuls (``MatMulNBits``: block-wise INT4 / INT8 weights,
float activations), as onnxruntime-genai ships language-model decoders.

Every quantized model here is written by ONNX Runtime's own ``MatMulNBitsQuantizer`` (the one the
model builder calls for ``-p int4``), with per-node bits: a MatMul is INT4, INT8 or left float.
Algorithms: ``rtn`` (round to nearest per block) and ``k_quant`` (llama.cpp's scale search per
block), both data-free, and per MatMul ``gptq`` (:mod:`vlsens.quantize.gptq`), ``scale_estimation``
(:mod:`vlsens.quantize.scale_estimation`), ``gptq_se`` (GPTQ with each block's scale by scale
estimation), ``awq`` and ``awq_se`` (:mod:`vlsens.quantize.awq`: input channels scaled by their
activations' size, with the MatMul's own ``Mul`` by ``1 / s`` in front), data-aware, on a calibration
set of the float model's inputs; the same ``MatMulNBits`` blocks, written by the same ONNX Runtime
writer. The bytes of an op at each width are read from the quantized models, not
computed from a formula.

``accuracy_level`` is ``MatMulNBits``' compute type (0: float32 activations; 4: the activations
are quantized to INT8 per block on the CPU, the builder's default for CPU). It is part of the
arithmetic: the sensitivity engine, the built models and the deploy folders use the same one.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from vlsens.model.family import NODE_NAMES

log = logging.getLogger(__name__)

ALGORITHMS = ("rtn", "k_quant", "gptq", "scale_estimation", "gptq_se", "awq", "awq_se")
#: algorithms that read calibration inputs (per MatMul only: a run's settings name a data-free one)
DATA_AWARE = ("gptq", "scale_estimation", "gptq_se", "awq", "awq_se")
#: the widths a per-op choice offers them at (they quantize INT8 too when a plan names them). At
#: INT8 the tiny checkpoints' plans that took GPTQ where it cost least alone measured 1.1-1.3x the
#: KL of k_quant throughout, at INT4 0.74-0.95x (docs/plan.md).
DATA_AWARE_BITS = (4,)
BITS = (4, 8)
FLOAT = 0  # "bits" of an op left in float


def data_aware(algorithms: Iterable[str]) -> list[str]:
    """The data-aware algorithms among ``algorithms`` (sorted, once each): those that read calibration inputs."""
    return sorted(set(algorithms) & set(DATA_AWARE))


@dataclass(frozen=True)
class NBitsSettings:
    """How weights are quantized (config ``<tower section>.nbits``)."""

    algorithm: str = "k_quant"
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 4

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS or self.algorithm in DATA_AWARE:
            valid = [a for a in ALGORITHMS if a not in DATA_AWARE]
            raise ValueError(f"nbits.algorithm: {self.algorithm!r}; valid: {valid} ({list(DATA_AWARE)} only per MatMul)")
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


@dataclass(frozen=True)
class Reuse:
    """MatMuls :func:`quantize` already wrote from the same float weights with the same settings:
    per width a model (``models``, e.g. a sensitivity engine's all-INT4 / all-INT8 models), each
    MatMul's algorithm in it (``algorithms``: per width ``{op: algorithm}`` where not
    ``settings.algorithm``), and each MatMul's float weight name there (``weights``: a copy of the
    float model may name a weight otherwise, :func:`vlsens.quantize.qdq.prepare_float_model`).
    :func:`quantize` takes a data-free MatMul's node and tensors from it instead of quantizing it
    again: RTN and k_quant quantize each node on its own, so they are the ones it would write."""

    models: Mapping[int, Path]
    settings: NBitsSettings
    algorithms: Mapping[int, Mapping[str, str]]
    weights: Mapping[str, str]

    def has(self, op: str, b: int, algorithm: str, settings: NBitsSettings) -> bool:
        return (settings == self.settings and algorithm not in DATA_AWARE and b in self.models and op in self.weights
                and self.algorithms.get(b, {}).get(op, self.settings.algorithm) == algorithm)

    def taken(self, group: Sequence[dict], bits: Mapping[str, int], algorithm: str, settings: NBitsSettings) -> dict:
        """:meth:`take` of every MatMul of ``group`` (at its ``bits``, by ``algorithm``) it has."""
        out = {}
        for b in BITS:
            ops = [o for o in group if bits[o["name"]] == b and self.has(o["name"], b, algorithm, settings)]
            out.update(self.take(ops, b) if ops else {})
        log.info("%s: %d MatMuls taken as quantized before, %d quantized", algorithm, len(out), len(group) - len(out))
        return out

    def take(self, ops: Sequence[dict], b: int) -> dict[str, tuple]:
        """``{MatMul name: (its MatMulNBits node, its tensors with their values)}`` of ``ops`` at ``b``
        bits, the tensors named after each op's own float weight."""
        import onnx
        from onnx import numpy_helper

        from vlsens.core.onnxutil import tensor_array

        model = onnx.load(str(self.models[b]), load_external_data=False)
        inits = {t.name: t for t in model.graph.initializer}
        nodes = {n.name.rsplit("_Q", 1)[0]: n for n in model.graph.node if n.op_type == "MatMulNBits"}
        out = {}
        for o in ops:
            node, mine = onnx.NodeProto(), self.weights[o["name"]]
            node.CopyFrom(nodes[o["name"]])
            tensors = []
            for i, x in enumerate(node.input[1:], 1):
                if x not in inits:
                    continue
                name = o["weight"] + x[len(mine):] if x.startswith(mine) else x
                tensors.append(numpy_helper.from_array(np.array(tensor_array(inits[x], self.models[b].parent)), name))
                node.input[i] = name
            out[o["name"]] = (node, tensors)
        return out


def quantize(float_model: str | Path, out_model: str | Path, bits: Mapping[str, int], settings: NBitsSettings,
             batch_bytes: int = 512 << 20, algorithms: Mapping[str, str] | None = None,
             calibration=None, threads: int = 0, reuse: Reuse | None = None) -> Path:
    """Write ``float_model`` with every MatMul named in ``bits`` quantized to that width (4 or 8)
    and every other MatMul left float, by ONNX Runtime's ``MatMulNBitsQuantizer``; ``out_model`` +
    its data file. Node ``<name>`` becomes ``<name>_Q<bits>``. ``algorithms``: per MatMul an
    algorithm other than ``settings.algorithm`` (one of :data:`ALGORITHMS`: the same
    ``MatMulNBits`` blocks; k_quant also writes zero points where symmetric RTN has none, 0.5
    byte a block; ``gptq`` reads ``calibration``, a Samples npz of ``float_model``'s inputs, or a
    :class:`vlsens.quantize.gptq.Calibration`: the samples and the run's store of GPTQ codes).

    The quantizer is run on models of a few MatMuls each (about ``batch_bytes`` of float weights,
    read from ``float_model``'s data file) and its nodes and weights are put into the float graph:
    ``rtn`` and ``k_quant`` quantize each node on its own, so the result is the one a run over the
    whole model gives (``tests/test_nbits.py``: equal to the model builder's ``-p int4`` export,
    weight for weight), and the memory is one batch and the quantized weights, not the float
    model and its quantized copy together (24 GB at 3B with 36 layers). ``reuse``: where a
    data-free MatMul at its width and algorithm is in :class:`Reuse`'s models, it is taken from
    there, not quantized again."""
    import onnx

    from vlsens.core.onnxutil import save_streamed

    algorithms = _checked(float_model, bits, algorithms, calibration)
    float_model = Path(float_model)
    model = onnx.load(str(float_model), load_external_data=False)
    ops = weight_matmuls(model)
    unknown = sorted(set(bits) - {o["name"] for o in ops})
    if unknown:
        raise ValueError(f"not weight MatMuls of {float_model}: {unknown[:5]}")
    inits = {i.name: i for i in model.graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    chosen = [o for o in ops if o["name"] in bits]
    done: dict[str, tuple] = {}
    for algo in sorted({algorithms.get(o["name"], settings.algorithm) for o in chosen}):  # one run per algorithm
        group = [o for o in chosen if algorithms.get(o["name"], settings.algorithm) == algo]
        if algo in DATA_AWARE:
            done.update(_data_aware(float_model, model, group, bits, settings, calibration, Path(out_model).parent,
                                    threads, algo))
            continue
        if reuse is not None:
            done.update(reuse.taken(group, bits, algo, settings))
            group = [o for o in group if o["name"] not in done]
        for batch in _batches(group, batch_bytes):
            done.update(_quantize_batch(batch, inits, float_model.parent, bits, replace(settings, algorithm=algo), opset))
    splice_quantized(model, done)
    return save_streamed(model, float_model.parent, out_model)


def splice_quantized(model, done: dict[str, tuple]) -> None:
    """Put each quantized node (``done``: MatMul name -> (node, its tensors[, AWQ's chain])) in its
    MatMul's place in ``model``, dropping the initializers nothing reads any more."""
    import onnx

    from vlsens.core.onnxgraph import node_reads

    nodes = []
    for node in model.graph.node:
        if node.name not in done:
            nodes.append(node)
            continue
        q, weights, *rest = done.pop(node.name)
        chain = [*(rest[0] if rest else []), q]  # AWQ's Mul reads the input, the node its output
        chain[0].input[0], q.output[0] = node.input[0], node.output[0]
        nodes.extend(chain)
        model.graph.initializer.extend(weights)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    read = {x for n in model.graph.node for x in node_reads(n)} | {o.name for o in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def _checked(float_model, bits: Mapping[str, int], algorithms: Mapping[str, str] | None, calibration) -> dict:
    """``algorithms`` as a dict, once the widths, the algorithms and a data-aware one's calibration are valid."""
    bad = {n: b for n, b in bits.items() if b not in BITS}
    if bad:
        raise ValueError(f"bits must be one of {BITS} (float: leave the op out); got {bad}")
    algorithms = dict(algorithms or {})
    bad = {n: a for n, a in algorithms.items() if a not in ALGORITHMS or n not in bits}
    if bad:
        raise ValueError(f"algorithms: each a quantized MatMul's, one of {list(ALGORITHMS)}; got {dict(list(bad.items())[:5])}")
    aware = data_aware(algorithms.values())
    if aware and calibration is None:
        raise ValueError(f"algorithms {aware} read calibration inputs: pass calibration= (a Samples npz of {float_model}'s "
                         "inputs)")
    return algorithms


def _data_aware(float_model: Path, model, group: Sequence[dict], bits: Mapping[str, int],
                settings: NBitsSettings, calibration, scratch_parent: Path, threads: int,
                algorithm: str = "gptq") -> dict[str, tuple]:
    """``group``'s MatMuls by ``algorithm``, a data-aware one (:func:`vlsens.quantize.calibrated.quantize_nodes`;
    ``calibration`` a path or a :class:`~vlsens.quantize.gptq.Calibration`), its captured inputs in a
    scratch folder beside the output, removed after."""
    import tempfile

    from vlsens.quantize import calibrated, gptq

    scratch_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vlsens-gptq-", dir=scratch_parent) as scratch:
        return calibrated.quantize_nodes(float_model, group, model, bits, settings, gptq.Calibration.of(calibration),
                                         scratch, threads, algorithm)


def _batches(ops: Sequence[dict], batch_bytes: int) -> list[list[dict]]:
    """``ops`` in graph order, cut into runs of about ``batch_bytes`` of float weights each."""
    fb = float_bytes(ops)
    out, batch, size = [], [], 0
    for o in ops:
        batch.append(o)
        size += fb[o["name"]]
        if size >= batch_bytes:
            out.append(batch)
            batch, size = [], 0
    return out + ([batch] if batch else [])


def _padded_k(k: int, bits: int, settings: NBitsSettings) -> int:
    """The K a weight is quantized at: its own, or, where ONNX Runtime's writer would pack 4-bit zero
    points of an odd number of blocks per column (k_quant, or asymmetric; it reshapes the packed
    zero points of the whole tensor, which fails: Qwen2.5-VL's vision ``down_proj``, K 3420 in 107
    blocks of 32), one block more of zero rows. Blocks are quantized each on its own, so the real
    ones come out as they would unpadded (:func:`_unpad` drops the extra one; test)."""
    blocks = -(-k // settings.block_size)
    zero_points = settings.algorithm == "k_quant" or not settings.symmetric
    return (blocks + 1) * settings.block_size if bits == 4 and zero_points and blocks % 2 else k


def _unpad(node, tensors: list, k: int) -> None:
    """A ``MatMulNBits`` quantized at a padded K (:func:`_padded_k`) made the node of ``k`` inputs:
    its K attribute, its weight's and scales' blocks beyond ``k``'s dropped. The packed zero points
    keep their size (an odd block count packs into the same bytes; the last half byte is padding)."""
    import numpy as np
    from onnx import numpy_helper

    attrs = {a.name: a for a in node.attribute}
    n, block = attrs["N"].i, attrs["block_size"].i
    blocks = -(-k // block)
    attrs["K"].i = k
    by_name = {t.name: t for t in tensors}
    weight, scales = by_name[node.input[1]], by_name[node.input[2]]
    s = numpy_helper.to_array(scales)
    kept = [(weight, numpy_helper.to_array(weight)[:, :blocks]),  # (N, blocks, bytes per block)
            (scales, s.reshape(n, -1)[:, :blocks].reshape((-1,) if s.ndim == 1 else (n, blocks)))]
    for t, a in kept:
        t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(a), t.name))


def _batch_model(batch: Sequence[dict], inits: dict, weights_dir: Path, bits: Mapping[str, int],
                 settings: NBitsSettings, opset: int):
    """A model of ``batch``'s MatMuls alone, each weight read from ``weights_dir`` (padded where
    :func:`_padded_k` says); and ``{name: its own K}`` of the padded ones."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from vlsens.core.onnxutil import tensor_array

    nodes, inputs, outputs, weights = [], [], [], []
    padded = {}
    for j, o in enumerate(batch):
        w = np.array(tensor_array(inits[o["weight"]], weights_dir))
        k = _padded_k(o["K"], int(bits[o["name"]]), settings)
        if k != o["K"]:
            padded[o["name"]] = o["K"]
            w = np.concatenate([w, np.zeros((k - o["K"], w.shape[1]), w.dtype)])
        weights.append(numpy_helper.from_array(w, o["weight"]))
        nodes.append(helper.make_node("MatMul", [f"x{j}", o["weight"]], [f"y{j}"], name=o["name"]))
        inputs.append(helper.make_tensor_value_info(f"x{j}", TensorProto.FLOAT, ["n", k]))
        outputs.append(helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, ["n", o["N"]]))
    model = helper.make_model(helper.make_graph(nodes, "batch", inputs, outputs, weights),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    return model, padded


def _quantize_batch(batch: Sequence[dict], inits: dict, weights_dir: Path, bits: Mapping[str, int],
                    settings: NBitsSettings, opset: int) -> dict[str, tuple]:
    """``{MatMul name: (MatMulNBits node, its weight tensors)}`` for ``batch`` (weight MatMuls of
    :func:`weight_matmuls`), quantized by ``MatMulNBitsQuantizer`` in a model of their own."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        KQuantWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
        RTNWeightOnlyQuantConfig,
    )

    model, padded = _batch_model(batch, inits, weights_dir, bits, settings, opset)
    config = {o["name"]: {"bits": int(bits[o["name"]]), "group_size": settings.block_size,
                          "scheme": "sym" if settings.symmetric else "asym"} for o in batch}
    algo = (RTNWeightOnlyQuantConfig if settings.algorithm == "rtn" else KQuantWeightOnlyQuantConfig)(
        customized_weight_config=config)
    q = MatMulNBitsQuantizer(model, bits=4, block_size=settings.block_size, is_symmetric=settings.symmetric,
                             accuracy_level=settings.accuracy_level, algo_config=algo)
    with contextlib.redirect_stdout(io.StringIO()):  # its progress bar
        q.process()
    out = q.model.model if hasattr(q.model, "model") else q.model
    tensors = {t.name: t for t in out.graph.initializer}
    found = {}

    def copy(message):  # a part of a protobuf message keeps the whole message (float weights too) alive
        c = type(message)()
        c.CopyFrom(message)
        return c

    for node in out.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        node = copy(node)
        # RTN and k_quant leave it unset
        if settings.accuracy_level and not any(a.name == "accuracy_level" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("accuracy_level", settings.accuracy_level))
        name = node.name.rsplit("_Q", 1)[0]
        found[name] = (node, [copy(tensors[x]) for x in node.input[1:] if x in tensors])
        if name in padded:
            _unpad(*found[name], padded[name])
    del q, out, tensors, model
    missing = [o["name"] for o in batch if o["name"] not in found]
    if missing:
        raise ValueError(f"MatMulNBitsQuantizer left {missing[:5]} unquantized")
    return found


def quantized_nodes(model) -> dict[str, dict]:
    """``{float MatMul name: {"bits", "node", "bytes"}}`` of the ``MatMulNBits`` nodes of a model
    :func:`quantize` wrote (graph only); bytes: its weight, scale and zero-point tensors, and AWQ's
    vector where the node has its ``Mul`` (:func:`vlsens.core.onnxgraph.input_scale`)."""
    import onnx

    from vlsens.core.onnxgraph import input_scale, producers, tensor_bytes

    m = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    inits = {i.name: i for i in m.graph.initializer}
    writers = producers(m.graph.node)
    out = {}
    for n in m.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        name = n.name.rsplit("_Q", 1)[0]
        awq = input_scale(n, writers, inits)
        nbytes = sum(tensor_bytes(inits[x]) for x in n.input[1:] if x in inits) + (tensor_bytes(awq[1]) if awq else 0)
        out[name] = {"bits": int(attrs["bits"]), "node": n.name, "bytes": nbytes}
    return out


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


def lm_head(model):
    """``(node, initializers)``: the weight MatMul (or ``MatMulNBits``) that produces the decoder
    graph's logits output (:attr:`~vlsens.model.family.NodeNames.logits`): the language model's
    head (:attr:`~vlsens.model.family.NodeNames.lm_head`)."""
    from vlsens.core.errors import VlsensError
    from vlsens.core.onnxgraph import producers

    logits = NODE_NAMES.logits
    outs = [o.name for o in model.graph.output]
    if logits not in outs:
        raise VlsensError(f"the decoder graph has no {logits!r} output (outputs: {outs[:4]})")
    node = producers(model.graph.node)[logits]
    inits = {i.name: i for i in model.graph.initializer}
    if node.op_type not in ("MatMul", "MatMulNBits") or node.input[1] not in inits:
        raise VlsensError(f"the decoder's logits come from {node.op_type} {node.name}, not a weight MatMul")
    return node, inits


def lm_head_table(decoder: str | Path):
    """The (vocab, hidden) FP32 table a tied embedding gathers: the weight of the decoder's head
    (:func:`lm_head`) as the decoder multiplies by it (dequantized per ``MatMulNBits``' spec,
    :func:`vlsens.core.onnxgraph.dequantize_matmulnbits`)."""
    import numpy as np
    import onnx

    from vlsens.core.errors import VlsensError
    from vlsens.core.onnxgraph import dequantize_matmulnbits
    from vlsens.core.onnxutil import tensor_array

    decoder = Path(decoder)
    node, inits = lm_head(onnx.load(str(decoder), load_external_data=False))
    if node.op_type == "MatMul":
        return np.ascontiguousarray(tensor_array(inits[node.input[1]], decoder.parent).T, np.float32)
    for _, w in dequantize_matmulnbits(decoder, names=[node.name]):
        return np.ascontiguousarray(w.T)
    raise VlsensError(f"{decoder}: {node.name} not found")
