"""A fixed-size vision graph cut into parts: ordinary single-file ONNX models for NPU toolchains.

NPU compilers (and onnxsim's Python API) load a model as one protobuf, which cannot exceed 2 GiB,
so the 2.7 GB FP32 Qwen2.5-VL-3B vision tower (one graph + ``.onnx.data``) has to be cut. The cut
is made on the gated graph itself, not by re-exporting pieces of the PyTorch module:

* every node is given the vision block it belongs to: its own (the exporter names nodes after
  their module, ``/visual/blocks.<k>/...``) or, when it has none, the highest block among the nodes
  it reads (a Cast the FP16 step inserted belongs to its producer's block; the merger follows the
  last block). Nodes before block 0 (patch embedding, window reordering) belong to the first part;
* *static* nodes, which read no graph input (Constants, and subgraphs the exporter left unfolded
  over initializers only), are copied into every part that reads them: rotary tables, window
  index and attention masks of a fixed-size graph are baked into the parts that use them, never
  passed between parts;
* the blocks are grouped into contiguous parts: ``count`` parts of balanced bytes, or (``auto``)
  the fewest parts each below ``max_bytes``;
* the tensors a part reads from earlier parts are its inputs (on the Qwen2.5-VL towers: the
  hidden states, one tensor), the ones later parts read are its outputs; they keep the graph's own
  tensor names, made file-name safe (``/visual/blocks.15/Add_1_output_0`` ->
  ``visual_blocks_15_Add_1_output_0``), which says where they were cut.

Each part is written as one ``part<j>.onnx`` with its weights inside (a part above 2 GiB, which
only a ``count`` too small for the graph makes, gets its own ``part<j>.onnx.data``).
:mod:`vlsens.npu.chain` runs the parts one after another, :mod:`vlsens.npu.build` gates and
publishes them, :mod:`vlsens.npu.calibration` writes each part's calibration archives.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlsens.core.errors import ConfigError
from vlsens.core.onnxgraph import producer_indices, tensor_bytes, topological_order
from vlsens.model.family import NODE_NAMES

log = logging.getLogger(__name__)

#: The exporter's module scope of a vision block in a node name.
BLOCK = re.compile(NODE_NAMES.vision_block)
#: One protobuf: the most a single-file ONNX model can hold.
PROTOBUF_LIMIT = 2**31 - 1
def part_file(j: int) -> str:
    return f"part{j}.onnx"


def safe_name(name: str) -> str:
    """A tensor name usable as a file name (the calibration archives name files after inputs)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "tensor"


@dataclass
class Cut:
    """Where a graph is cut: ``groups[j]`` is the list of blocks of part ``j`` (-1: the nodes before
    block 0, always in part 0)."""

    groups: list[list[int]]
    unit_bytes: dict[int, int]

    @property
    def count(self) -> int:
        return len(self.groups)


@dataclass
class Graph:
    """The node-level facts of a graph that the cut needs (no weights loaded)."""

    model: object  # onnx.ModelProto without external data
    order: list[int]  # node indices in topological order
    static: list[bool]
    block: list[int]  # effective block of each node (-1: before block 0)
    producer: dict[str, int]
    init_bytes: dict[str, int]
    graph_inputs: list[str]
    graph_outputs: list[str]
    blocks: list[int] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> "Graph":
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        return cls.of(model)

    @classmethod
    def of(cls, model) -> "Graph":
        g = model.graph
        for n in g.node:
            if any(a.type in (5, 10) for a in n.attribute):  # GRAPH / GRAPHS: control flow
                raise ValueError(f"node {n.name or n.op_type} has a subgraph (control flow): graphs with "
                                 "If/Loop/Scan nodes cannot be cut into parts")
        inits = {t.name: t for t in g.initializer}
        graph_inputs = [i.name for i in g.input if i.name not in inits]
        producer = producer_indices(g.node)
        order = topological_order(g.node, producer)
        static = [False] * len(g.node)
        block = [-1] * len(g.node)
        for i in order:
            n = g.node[i]
            deps = [producer[x] for x in n.input if x in producer]
            reads_input = any(x in graph_inputs for x in n.input)
            static[i] = not reads_input and all(static[d] for d in deps)
            m = BLOCK.search(n.name)
            own = int(m.group(1)) if m else -1
            block[i] = max([own] + [block[d] for d in deps if not static[d]])
        blocks = sorted({block[i] for i in order if not static[i] and block[i] >= 0})
        if not blocks:
            raise ValueError("no node of the graph is named after a vision block (/blocks.<k>/): "
                             "it cannot be cut at block boundaries")
        return cls(model, order, static, block, producer, {k: tensor_bytes(t) for k, t in inits.items()},
                   graph_inputs, [o.name for o in g.output], blocks)

    def static_closure(self, nodes) -> set[int]:
        """The static nodes that ``nodes`` read, directly or through other static nodes."""
        g = self.model.graph
        out: set[int] = set()
        stack = [x for i in nodes for x in g.node[i].input]
        while stack:
            x = stack.pop()
            p = self.producer.get(x)
            if p is not None and self.static[p] and p not in out:
                out.add(p)
                stack.extend(g.node[p].input)
        return out

    def unit_bytes(self) -> dict[int, int]:
        """Initializer bytes of each unit (-1: before block 0; k: block k with what follows it
        up to block k+1), each initializer counted in the first unit that reads it."""
        g = self.model.graph
        seen: set[str] = set()
        out = {u: 0 for u in [-1] + self.blocks}
        for u in out:
            nodes = [i for i in self.order if not self.static[i] and self._unit(i) == u]
            for i in sorted(set(nodes) | self.static_closure(nodes)):
                for x in g.node[i].input:
                    if x in self.init_bytes and x not in seen:
                        seen.add(x)
                        out[u] += self.init_bytes[x]
                for a in g.node[i].attribute:
                    if a.type == 4:  # TENSOR (a Constant's value)
                        out[u] += tensor_bytes(a.t)
        return out

    def _unit(self, i: int) -> int:
        b = self.block[i]
        return b if b in self.blocks else -1


def plan_cut(graph: Graph, count: int | str, max_bytes: int) -> Cut:
    """Contiguous groups of blocks: ``count`` parts balancing the largest part's bytes, or
    (``"auto"``) the fewest parts each of at most ``max_bytes`` bytes of weights."""
    units = graph.unit_bytes()
    seq = list(graph.blocks)
    weight = {b: units[b] for b in seq}
    weight[seq[0]] += units[-1]  # the nodes before block 0 go with it
    if count == "auto":
        biggest = max(weight.values())
        if biggest > max_bytes:
            b = max(weight, key=weight.get)
            raise ConfigError(f"vision.parts.max_bytes: {max_bytes} bytes, but block {b} alone holds {biggest} "
                              f"bytes of weights; raise vision.parts.max_bytes (below {PROTOBUF_LIMIT} for "
                              "single-file parts) or choose a count")
        groups = _greedy(seq, weight, max_bytes)
    else:
        count = int(count)
        if count < 1 or count > len(seq):
            raise ConfigError(f"vision.parts.count: {count}, but the graph has {len(seq)} blocks to cut between: "
                              f"choose 1..{len(seq)} or auto")
        limits = sorted({sum(weight[b] for b in seq[i:j]) for i in range(len(seq))
                         for j in range(i + 1, len(seq) + 1)})
        lo, hi = 0, len(limits) - 1
        while lo < hi:  # the smallest limit whose greedy grouping needs at most `count` parts
            mid = (lo + hi) // 2
            if len(_greedy(seq, weight, limits[mid])) <= count:
                hi = mid
            else:
                lo = mid + 1
        groups = _greedy(seq, weight, limits[lo])
        while len(groups) < count:  # fewer were enough: split the largest group
            k = max((i for i, g in enumerate(groups) if len(g) > 1), key=lambda i: sum(weight[b] for b in groups[i]))
            g = groups[k]
            half = len(g) // 2
            groups[k:k + 1] = [g[:half], g[half:]]
    groups[0] = [-1] + groups[0]
    return Cut(groups, units)


def _greedy(seq: list[int], weight: dict[int, int], limit: int) -> list[list[int]]:
    groups: list[list[int]] = [[]]
    total = 0
    for b in seq:
        if groups[-1] and total + weight[b] > limit:
            groups.append([])
            total = 0
        groups[-1].append(b)
        total += weight[b]
    return groups


@dataclass
class PartSpec:
    nodes: list[int]
    inputs: list[str]
    outputs: list[str]
    blocks: list[int]


def part_specs(graph: Graph, cut: Cut) -> list[PartSpec]:
    """Each part's nodes (its own and the static ones it reads), inputs and outputs."""
    g = graph.model.graph
    part_of_block = {b: j for j, grp in enumerate(cut.groups) for b in grp}
    part = [-1 if graph.static[i] else part_of_block[graph._unit(i)] for i in range(len(g.node))]
    pos = {i: k for k, i in enumerate(graph.order)}
    readers: dict[str, set[int]] = {}
    for i, n in enumerate(g.node):
        if not graph.static[i]:
            for x in n.input:
                readers.setdefault(x, set()).add(part[i])
    specs = []
    for j, grp in enumerate(cut.groups):
        own = [i for i in graph.order if part[i] == j]
        nodes = sorted(set(own) | graph.static_closure(own), key=pos.get)
        made = {o for i in own for o in g.node[i].output}
        inputs, seen = [], set()
        for i in own:
            for x in g.node[i].input:
                if x in seen or not x:
                    continue
                seen.add(x)
                p = graph.producer.get(x)
                if x in graph.graph_inputs or (p is not None and not graph.static[p] and part[p] < j):
                    inputs.append(x)
        outputs = [o for i in own for o in g.node[i].output
                   if o in made and (o in graph.graph_outputs or any(r > j for r in readers.get(o, ())))]
        specs.append(PartSpec(nodes, inputs, outputs, [b for b in grp if b >= 0]))
    produced = {o for s in specs for o in s.outputs}
    missing = [o for o in graph.graph_outputs if o not in produced]
    if missing:
        raise ValueError(f"graph outputs {missing} are produced by no part")
    return specs


def _value_infos(model) -> dict:
    """Type and shape of every tensor, by ONNX shape inference on the graph without weights."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - fall back to what the file declares
        log.warning("shape inference failed (%s): using the value types the graph declares", e)
        inferred = model
    g = inferred.graph
    out = {v.name: v for v in list(g.value_info) + list(g.input) + list(g.output)}
    return out


@dataclass
class Boundary:
    """The tensors passed between parts: the file-name-safe names they cross under (``rename``),
    the names the parts' own nodes use for them (``inner``: a bfloat16 tensor crosses as float32,
    exact both ways, and is cast back inside, so a part's inputs and outputs stay what numpy, .npy
    files and ONNX Runtime's Python API can hold), and every tensor's type by shape inference."""

    infos: dict
    rename: dict[str, str]
    bf16: set[str]
    inner: dict[str, str]

    @classmethod
    def of(cls, graph: Graph, specs: list[PartSpec]) -> "Boundary":
        import onnx

        infos = _value_infos(graph.model)
        boundary = ({x for s in specs for x in s.inputs + s.outputs} - set(graph.graph_inputs)
                    - set(graph.graph_outputs))
        rename = {x: safe_name(x) for x in boundary}
        if len(set(rename.values())) != len(rename):
            rename = {x: f"{safe_name(x)}_{k}" for k, x in enumerate(sorted(boundary))}
        bf16 = {x for x in boundary
                if x in infos and infos[x].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16}
        inner = {x: (rename[x] + "__bf16" if x in bf16 else rename[x]) for x in boundary}
        return cls(infos, rename, bf16, inner)

    def info(self, name: str):
        """The value info a part declares for graph input / output / boundary tensor ``name``."""
        import onnx

        v = self.infos.get(name)
        if v is None or not v.type.tensor_type.elem_type:
            raise ValueError(f"no type is known for boundary tensor {name!r} (shape inference gave none)")
        new = onnx.ValueInfoProto()
        new.CopyFrom(v)
        new.name = self.rename.get(name, name)
        if name in self.bf16:
            new.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        return new


def write_parts(src: str | Path, out_dir: str | Path, count: int | str, max_bytes: int) -> list[dict]:
    """Cut ``src`` (a verified graph with its data file) into ``out_dir/part<j>.onnx``; returns
    one entry per part (file, inputs and outputs with dtype and shape, blocks, nodes, bytes)."""
    src, out_dir = Path(src), Path(out_dir)
    graph = Graph.load(src)
    cut = plan_cut(graph, count, max_bytes)
    specs = part_specs(graph, cut)
    bounds = Boundary.of(graph, specs)
    inits = {t.name: t for t in graph.model.graph.initializer}
    entries = []
    for j, spec in enumerate(specs):
        path = out_dir / part_file(j)
        single = _save_part(_part_model(graph, spec, bounds, inits, src, j, len(specs)), path)
        entries.append({
            "file": path.name,
            "single_file": single,
            "blocks": [spec.blocks[0], spec.blocks[-1]] if spec.blocks else [],
            "before_blocks": -1 in cut.groups[j],
            "nodes": len(spec.nodes),
            "inputs": [_io(bounds.info(x)) for x in spec.inputs],
            "outputs": [_io(bounds.info(x)) for x in spec.outputs],
        })
        log.info("part %d of %d: blocks %s, %d nodes, %s", j, len(specs), entries[-1]["blocks"], len(spec.nodes),
                 "one file" if single else "with external data")
    return entries


def _part_nodes(g, spec: PartSpec, bounds: Boundary) -> list:
    """Part ``spec``'s nodes, copied, reading and writing the boundary tensors by their inner
    names, with the Casts of bfloat16 boundary tensors (in first, out last)."""
    import onnx
    from onnx import helper

    rename, inner, bf16 = bounds.rename, bounds.inner, bounds.bf16
    nodes = []
    for x in spec.inputs:
        if x in bf16:
            nodes.append(helper.make_node("Cast", [rename[x]], [inner[x]], to=onnx.TensorProto.BFLOAT16,
                                          name=f"{rename[x]}__to_bf16"))
    for i in spec.nodes:
        n = onnx.NodeProto()
        n.CopyFrom(g.node[i])
        n.input[:] = [inner.get(x, x) for x in n.input]
        n.output[:] = [inner.get(x, x) for x in n.output]
        nodes.append(n)
    for x in spec.outputs:
        if x in bf16:
            nodes.append(helper.make_node("Cast", [inner[x]], [rename[x]], to=onnx.TensorProto.FLOAT,
                                          name=f"{rename[x]}__to_fp32"))
    return nodes


def _part_initializers(g, spec: PartSpec, inits: dict, weights_dir: Path) -> list:
    """Copies of the initializers part ``spec``'s nodes read, in the graph's order, their bytes
    inline."""
    import onnx

    from vlsens.core.onnxutil import _inline

    used = {x for i in spec.nodes for x in g.node[i].input}
    tensors = []
    for name in [t.name for t in g.initializer if t.name in used]:
        t = onnx.TensorProto()
        t.CopyFrom(inits[name])
        if t.external_data:
            _inline(t, weights_dir)
        tensors.append(t)
    return tensors


def _part_model(graph: Graph, spec: PartSpec, bounds: Boundary, inits: dict, src: Path, j: int, count: int):
    """Part ``j`` of ``count`` as a model: its nodes and weights, the boundary tensors as its I/O."""
    from onnx import helper

    model, g = graph.model, graph.model.graph
    part_graph = helper.make_graph(_part_nodes(g, spec, bounds), f"{g.name or 'graph'}_part{j}",
                                   [bounds.info(x) for x in spec.inputs], [bounds.info(x) for x in spec.outputs],
                                   initializer=_part_initializers(g, spec, inits, src.parent))
    return helper.make_model(part_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                             producer_name="vlsens.npu.cut", doc_string=f"part {j} of {count} of {src}")


def _save_part(part, path: Path) -> bool:
    """Write ``part`` as one file when one protobuf holds it (True), else with a data file."""
    import onnx

    from vlsens.core.onnxutil import save_with_external_data

    single = part.ByteSize() < PROTOBUF_LIMIT
    if single:
        onnx.save_model(part, str(path))
    else:
        save_with_external_data(part, path)
    return single


def _io(v) -> dict:
    from onnx import helper

    tt = v.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize  # bfloat16: ml_dtypes'
    nbytes = int(np.prod(shape)) * itemsize if all(isinstance(d, int) for d in shape) else None
    return {"name": v.name, "dtype": helper.tensor_dtype_to_string(tt.elem_type).removeprefix("TensorProto."),
            "shape": shape, "bytes": nbytes}
