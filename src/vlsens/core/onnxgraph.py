"""ONNX graph surgery helpers, one home for every stage that reads or rewrites a graph (FP16
conversion, the sensitivity switch and suffix models, the profile, the NPU cut): the graph's facts
(each tensor's producer and consumers, a topological order, a tensor's bytes), element types of
every tensor, the names a node or subgraph reads, renaming reads, copying nodes. No I/O beyond
path-based shape inference (:mod:`vlsens.core.onnxutil` holds the external-data I/O)."""

from __future__ import annotations

import tempfile
from pathlib import Path

#: Output element types of ops whose outputs are not of their inputs' type (ONNX TensorProto codes).
INT64, BOOL = 7, 9
INT64_OUT = frozenset({"Shape", "Size", "NonZero", "ArgMax", "ArgMin"})
BOOL_OUT = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
                      "IsNaN", "IsInf"})


def producers(nodes) -> dict:
    """``{tensor: the node that writes it}`` over ``nodes`` (a graph's nodes); an omitted optional
    output (``""``) is no tensor."""
    return {o: n for n in nodes for o in n.output if o}


def producer_indices(nodes) -> dict[str, int]:
    """``{tensor: index in nodes of the node that writes it}`` (as :func:`producers`)."""
    return {o: i for i, n in enumerate(nodes) for o in n.output if o}


def consumers(nodes) -> dict[str, list]:
    """``{tensor: the nodes that read it}`` over ``nodes``, in node order (a node once per input it
    reads the tensor at); an omitted optional input (``""``) is no tensor."""
    out: dict[str, list] = {}
    for n in nodes:
        for x in n.input:
            if x:
                out.setdefault(x, []).append(n)
    return out


def topological_order(nodes, producer: dict[str, int] | None = None) -> list[int]:
    """Indices of ``nodes`` in a topological order, the given order wherever it already is one
    (``producer``: their :func:`producer_indices`, when the caller has it). ``ValueError`` on a
    cycle."""
    import heapq

    nodes = list(nodes)
    producer = producer_indices(nodes) if producer is None else producer
    deps = [{producer[x] for x in n.input if x in producer} for n in nodes]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for p in d:
            users.setdefault(p, []).append(i)
    left = [len(d) for d in deps]
    ready = [i for i, k in enumerate(left) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            left[u] -= 1
            if left[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    return order


def gather_rows_before(model, head, positions: str):
    """Make ``head`` (a node of ``model``, in place) read ``Gather(x, positions, axis=1)`` of its
    first input ``x`` instead of ``x``: the rows of a (batch 1) sequence at the int64 graph input
    ``positions``, which the caller feeds. Returns the input's value info (for the graph's inputs)."""
    from onnx import TensorProto, helper

    rows = f"{head.input[0]}__vlsens_read"
    at = list(model.graph.node).index(head)
    model.graph.node.insert(at, helper.make_node("Gather", [head.input[0], positions], [rows],
                                                 name="vlsens_read_rows_Gather", axis=1))
    head.input[0] = rows
    return helper.make_tensor_value_info(positions, TensorProto.INT64, ["read_positions"])


def tensor_bytes(t) -> int:
    """Bytes of a tensor's data (graph only: its weights need not be loaded): the length its
    external data reference states, else its inline bytes, else element count x element size
    (INT4 / UINT4: two elements a byte)."""
    import numpy as np
    from onnx import TensorProto, helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    if uses_external_data(t):
        length = ExternalDataInfo(t).length
        if length is not None:
            return int(length)
    if t.HasField("raw_data"):
        return len(t.raw_data)
    n = int(np.prod(t.dims)) if len(t.dims) else 1
    if t.data_type in (TensorProto.INT4, TensorProto.UINT4):
        return (n + 1) // 2
    return n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize


def inferred_model(model_path: str | Path):
    """The model proto after ONNX's shape inference, loaded without its weights. Path-based
    inference: works above 2 GB, where the in-memory one would serialize and fail."""
    import onnx

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "inferred.onnx"
        onnx.shape_inference.infer_shapes_path(str(model_path), str(out))
        return onnx.load(str(out), load_external_data=False)


def declared_types(model) -> dict[str, int]:
    """Element types the model states: initializers, graph inputs and outputs, ``value_info``."""
    graph = model.graph
    types = {i.name: i.data_type for i in graph.initializer}
    types.update({vi.name: vi.type.tensor_type.elem_type
                  for vi in list(graph.input) + list(graph.output) + list(graph.value_info)
                  if vi.type.tensor_type.elem_type})
    return types


def element_types(model_path: str | Path) -> dict[str, int]:
    """Element type of every tensor of a model: shape inference, then :func:`propagate_types` for
    what it leaves out."""
    m = inferred_model(model_path)
    types = declared_types(m)
    propagate_types(m.graph, types)
    return types


def output_type(node, types: dict[str, int]) -> int | None:
    """The element type of ``node``'s outputs from its op and its inputs' types (``types``): the
    op's fixed type where it has one (Cast's ``to``, index and boolean ops, QuantizeLinear's zero
    point, ConstantOfShape's value), else its float inputs' (Where: its last, the branch values;
    ONNX Runtime's fused float ops: their first), else its first input's. None when unknown."""
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    op = node.op_type
    if op == "Cast":
        return next(a.i for a in node.attribute if a.name == "to")
    if op in INT64_OUT:
        return INT64
    if op in BOOL_OUT:
        return BOOL
    if op == "QuantizeLinear":
        return types.get(node.input[2]) if len(node.input) > 2 and node.input[2] else TensorProto.UINT8
    if op == "ConstantOfShape":
        return next((a.t.data_type for a in node.attribute if a.name == "value"), TensorProto.FLOAT)
    ins = [types.get(i) for i in node.input if i]
    fl = [t for t in ins if t in floats]
    if fl:
        return fl[-1] if op == "Where" else fl[0]
    return next((t for t in ins if t), None)


def propagate_types(graph, types: dict[str, int]) -> None:
    """Fill in (in ``types``) the element types ONNX shape inference leaves out, in node order:
    ONNX Runtime's own ops (SkipSimplifiedLayerNormalization, GroupQueryAttention,
    MRotaryEmbedding ...) by :func:`output_type`, an If's outputs from its then-branch."""
    for node in graph.node:
        missing = [o for o in node.output if o and o not in types]
        if not missing:
            continue
        if node.op_type == "If":
            branch = next(a.g for a in node.attribute if a.name == "then_branch")
            for o, bo in zip(node.output, branch.output):
                if o and o not in types and bo.type.tensor_type.elem_type:
                    types[o] = bo.type.tensor_type.elem_type
            continue
        fixed = output_type(node, types)
        if fixed:
            for o in missing:
                types[o] = fixed


def subgraphs(node):
    """The graphs a node holds in its attributes (If's branches, Loop's and Scan's bodies)."""
    from onnx import AttributeProto

    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def outer_reads(graph) -> set[str]:
    """Names a (sub)graph reads from its enclosing scopes."""
    produced = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    reads: set[str] = set()
    for node in graph.node:
        reads.update(node_reads(node))
        produced.update(o for o in node.output if o)
    reads.update(o.name for o in graph.output)
    return reads - produced


def node_reads(node) -> set[str]:
    """A node's inputs and whatever its subgraphs read from outside themselves."""
    reads = {x for x in node.input if x}
    for g in subgraphs(node):
        reads |= outer_reads(g)
    return reads


def rename_reads(node, rename: dict[str, str]) -> None:
    """Rename the tensors ``node`` reads (its inputs and its subgraphs' outer reads), in place."""
    for i, x in enumerate(node.input):
        if x in rename:
            node.input[i] = rename[x]
    for g in subgraphs(node):
        local = {i.name for i in g.input} | {i.name for i in g.initializer}
        local |= {o for n in g.node for o in n.output}
        inner = {k: v for k, v in rename.items() if k not in local}
        for n in g.node:
            rename_reads(n, inner)
        for o in g.output:
            if o.name in inner:  # a branch that returns an outer value as it is
                o.name = inner[o.name]


def copy_node(node, rename: dict[str, str], name: str):
    """A copy of ``node`` named ``name``, its inputs and outputs renamed by ``rename``."""
    import onnx

    n = onnx.NodeProto()
    n.CopyFrom(node)
    n.name = name
    for i, x in enumerate(n.input):
        n.input[i] = rename.get(x, x)
    for i, x in enumerate(n.output):
        n.output[i] = rename.get(x, x)
    return n


#: a ``MatMulNBits`` ``<name>_Q<bits>`` whose input is written by a ``Mul`` named ``<name>_awq`` by a
#: constant vector ``v`` (K) multiplies by ``diag(v) W``: AWQ's own scale (:mod:`vlsens.quantize.awq`)
AWQ_SUFFIX = "_awq"


def input_scale(node, writers: dict, inits: dict):
    """``(Mul node, its vector)`` in front of the ``MatMulNBits`` ``node`` by :data:`AWQ_SUFFIX`'s
    convention (``writers``: :func:`producers` of the graph; ``inits``: its initializers by name),
    else None."""
    mul = writers.get(node.input[0])
    if mul is None or mul.op_type != "Mul" or mul.name != node.name.rsplit("_Q", 1)[0] + AWQ_SUFFIX:
        return None
    vec = next((inits[x] for x in mul.input if x in inits), None)
    return (mul, vec) if vec is not None else None


def dequantize_matmulnbits(model: str | Path, names=None):
    """``(float MatMul name, W)`` for every ``MatMulNBits`` node of ``model`` (``names``: only the
    nodes named so, quantized or float names) (a path; its data file
    memory-mapped): ``W`` (K, N) float32, the weight the node multiplies by, as ONNX Runtime's
    contrib-op spec defines it: ``B`` (N, blocks, block_size * bits / 8) holds the quantized values
    of each output column's input blocks, low bits first; ``scales`` (N * blocks); zero point: the
    ``zero_points`` input (packed like ``B``) or ``2 ** (bits - 1)``;
    ``W[k, n] = (q[n, k] - zero_point[n, k // block_size]) * scale[n, k // block_size]``. One
    weight in memory at a time. ``g_idx`` and a float ``zero_points`` (not written by
    vlsens' quantizer) raise ``ValueError``. A node with AWQ's ``Mul`` in front
    (:func:`input_scale`) multiplies by ``diag(v) W``, and that is what is returned."""
    import numpy as np
    import onnx

    from vlsens.core.onnxutil import tensor_array

    path = Path(model)
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    writers = producers(m.graph.node)
    for n in m.graph.node:
        if n.op_type != "MatMulNBits" or names is not None and not {n.name, n.name.rsplit("_Q", 1)[0]} & set(names):
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        k, nn, bits, bs = int(a["K"]), int(a["N"]), int(a["bits"]), int(a["block_size"])
        if bits not in (4, 8) or len(n.input) > 4 and n.input[4]:
            raise ValueError(f"{n.name}: {bits} bits / g_idx: not a layout vlsens reads")
        blocks = -(-k // bs)
        q = _unpack(tensor_array(inits[n.input[1]], path.parent), bits).reshape(nn, blocks * bs)
        scale = tensor_array(inits[n.input[2]], path.parent).astype(np.float32).reshape(nn, blocks)
        if len(n.input) > 3 and n.input[3]:
            zp_t = inits[n.input[3]]
            if zp_t.data_type != onnx.TensorProto.UINT8:
                raise ValueError(f"{n.name}: zero points of type {zp_t.data_type}: not a layout vlsens reads")
            zp = _unpack(tensor_array(zp_t, path.parent), bits).reshape(nn, -1)[:, :blocks]
        else:
            zp = np.full((nn, blocks), 2 ** (bits - 1), np.uint8)
        w = (q.reshape(nn, blocks, bs).astype(np.float32) - zp[..., None]) * scale[..., None]
        w = np.ascontiguousarray(w.reshape(nn, blocks * bs)[:, :k].T)
        awq = input_scale(n, writers, inits)
        if awq is not None:
            w = (tensor_array(awq[1], path.parent).astype(np.float64).reshape(-1, 1) * w).astype(np.float32)
        yield n.name.rsplit("_Q", 1)[0], w


def _unpack(packed, bits: int):
    """uint8 bytes -> one value per element (4 bits: the low nibble first)."""
    import numpy as np

    b = np.asarray(packed, np.uint8).reshape(packed.shape[0], -1)
    if bits == 8:
        return b
    out = np.empty((b.shape[0], b.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = b & 0x0F, b >> 4
    return out

