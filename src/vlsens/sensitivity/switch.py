"""The switch model: one ONNX graph in which every quantizable op can be INT8 or float.

Built from the float model and ORT's all-op QDQ model (``quantize_static`` with every op
selected). In it every quantizable node k becomes

    If(mask[k]) then:  Q/DQ(inputs) -> k -> Q/DQ(output)      (copied from ORT's QDQ model)
                else:  k on the float inputs

and every activation tensor ORT quantized becomes ``If(mask[t]) then DQ(Q(t)) else t``, with
``mask`` a boolean graph input (:data:`MASK_INPUT`), so one session evaluates any set of INT8 ops
and ONNX Runtime executes only the taken branch. Every Q/DQ node and quantized initializer is
ORT's own, so scales, zero points and rounded weights are exactly a deployment's.

The pieces every switch model is made of (the nbits engine's too, :mod:`vlsens.sensitivity.nbits`):
:func:`check_beside` (the model reads its sources' data files), :func:`switch_gather` (a node
reads its switch from the graph input) and :func:`write_switch_model` (the rewritten graph with
the switches' constants and input, saved).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.onnxgraph import consumers, copy_node, element_types, producers

MASK_INPUT = "vlsens_int8_mask"


class SwitchMap:
    """Which switches of the mask input belong to which ops.

    Switch ``i`` < ``len(ops)`` is op i's weights; the others are activation tensors, each
    quantized when any op that reads or writes it is INT8 (what ``quantize_static`` does with
    ``nodes_to_quantize=[k]``: the Q/DQ pair it puts on a tensor next to k serves every reader).
    """

    def __init__(self, ops: Sequence[str], tensors: dict[str, list[str]]):
        self.ops = list(ops)
        self.tensors = dict(tensors)  # tensor -> ops adjacent to it
        self.size = len(self.ops) + len(self.tensors)
        self._op_index = {n: i for i, n in enumerate(self.ops)}
        self._tensor_switches = [(len(self.ops) + j, {self._op_index[o] for o in adj})
                                 for j, adj in enumerate(self.tensors.values())]

    def mask(self, int8_ops: Sequence[str]) -> np.ndarray:
        m = np.zeros(self.size, dtype=bool)
        active = {self._op_index[n] for n in int8_ops}
        for i in active:
            m[i] = True
        for j, adj in self._tensor_switches:
            m[j] = bool(adj & active)
        return m

    def to_json(self) -> dict:
        # A list, not a mapping: switch indices follow this order, and JSON writers sort keys.
        return {"ops": self.ops, "tensors": [[t, adj] for t, adj in self.tensors.items()]}

    @classmethod
    def from_json(cls, data: dict) -> "SwitchMap":
        return cls(data["ops"], {t: adj for t, adj in data["tensors"]})


def check_beside(out_model: str | Path, *sources: str | Path) -> None:
    """``ValueError`` unless ``out_model`` is in the folder of every one of ``sources``: a switch
    model reads its sources' weights from their data files."""
    folder = Path(out_model).resolve().parent
    for src in sources:
        if Path(src).resolve().parent != folder:
            raise ValueError(f"{out_model} must be written beside {src} (it reads that model's weights file)")


def switch_gather(switches: str, k: int, tag: str, out: str, name: str, needed: dict):
    """The node ``name`` that reads switch ``k`` of the graph input ``switches`` into ``out``; its
    index constant (``<tag>_index``) goes into ``needed``."""
    from onnx import TensorProto, helper

    idx = f"{tag}_index"
    needed[idx] = helper.make_tensor(idx, TensorProto.INT64, [], [k])
    return helper.make_node("Gather", [switches, idx], [out], name=name, axis=0)


def write_switch_model(fm, nodes: list, needed: dict, switches, out_model: str | Path) -> None:
    """Save ``fm`` (the float model, graph only) as ``out_model`` with ``nodes`` as its nodes, the
    switches' initializers ``needed`` (those the float model lacks) and the graph input
    ``switches`` (a value info). Its value infos are dropped: the renamed tensors' are stale, ONNX
    Runtime re-infers them."""
    from vlsens.core.onnxutil import save_with_external_data

    f_inits = {i.name for i in fm.graph.initializer}
    del fm.graph.node[:]
    fm.graph.node.extend(nodes)
    for name, init in needed.items():
        if name not in f_inits:
            fm.graph.initializer.append(init)
    fm.graph.input.append(switches)
    del fm.graph.value_info[:]
    save_with_external_data(fm, out_model)


def build_switch_model(float_model: str | Path, qdq_model: str | Path, out_model: str | Path,
                       op_names: Sequence[str]) -> SwitchMap:
    """Combine the float model and ORT's all-op QDQ model into one switchable model.

    * a quantized activation tensor ``a`` becomes ``If(mask[a]) then DQ(Q(a)) else a``, read
      by all of a's consumers;
    * an op with quantized weights becomes ``If(mask[k]) then k(DQ(W_q), DQ(b_q)) else k(W, b)``.

    Every Q/DQ node and quantized initializer is copied from ``qdq_model``, so scales, zero
    points and rounded weights are ORT's own.

    The float weights are not copied: ``out_model`` must sit in the float model's folder, and its
    float initializers keep pointing into the float model's data file; only what comes from the
    QDQ model (quantized weights, scales, zero points) goes to ``out_model``'s own data file.
    Memory: the QDQ model's weights (a quarter of the float ones) and two graphs.
    """
    import onnx
    from onnx import TensorProto, helper

    check_beside(out_model, float_model)
    fm = onnx.load(str(float_model), load_external_data=False)
    qm = onnx.load(str(qdq_model), load_external_data=True)
    sw = Int8Switches(qm, element_types(float_model), fm.graph.input[0].type.tensor_type.elem_type)
    smap = sw.switch_map(fm, op_names)
    nodes = sw.rewrite(fm, op_names)
    # Q/DQ with FP16 scales or per-channel axes need the opset ORT's quantizer declared.
    for imp in qm.opset_import:
        for mine in fm.opset_import:
            if mine.domain == imp.domain and imp.version > mine.version:
                mine.version = imp.version
    write_switch_model(fm, nodes, sw.needed, helper.make_tensor_value_info(MASK_INPUT, TensorProto.BOOL, [smap.size]),
                       out_model)
    return smap


class Int8Switches:
    """The INT8 switches of a float graph, made from ORT's QDQ model ``qm``: the activation
    tensors it quantized (``tensor_q``: tensor -> its QuantizeLinear), each tensor's switch index,
    and the initializers the switches add (``needed``: Q/DQ parameters, quantized weights, switch
    indices)."""

    def __init__(self, qm, elem: dict[str, int], float_type: int):
        self.qm, self.elem, self.float_type = qm, elem, float_type
        self.q_nodes = {n.name: n for n in qm.graph.node}
        self.q_producer = producers(qm.graph.node)
        self.q_consumers = consumers(qm.graph.node)
        self.q_inits = {i.name: i for i in qm.graph.initializer}
        self.tensor_q = self._quantized_tensors()
        self.tensors: dict[str, list[str]] = {}
        self.tensor_index: dict[str, int] = {}
        self.needed: dict[str, object] = {}

    def _quantized_tensors(self) -> dict:
        """Activation tensors ORT quantized (Q nodes on non-initializers). A quantized graph output
        keeps its name on the DequantizeLinear; ORT renames the tensor its producer writes (e.g.
        lm_head -> logits). The float graph's output is what that Q reads."""
        tensor_q: dict[str, object] = {}
        for n in self.qm.graph.node:
            if n.op_type == "QuantizeLinear" and n.input[0] not in self.q_inits:
                tensor_q.setdefault(n.input[0], n)
        for out in self.qm.graph.output:
            dq = self.q_producer.get(out.name)
            q = self.q_producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in self.q_inits:
                tensor_q[out.name] = q
        return tensor_q

    def switch_map(self, fm, op_names: Sequence[str]) -> SwitchMap:
        """The switches: the ops ``op_names``, then every quantized tensor one of them reads or
        writes, with those ops (graph order)."""
        ops = set(op_names)
        adjacency: dict[str, list[str]] = {}
        for node in fm.graph.node:
            if node.name in ops:
                for t in list(node.input) + list(node.output):
                    if t in self.tensor_q and node.name not in adjacency.setdefault(t, []):
                        adjacency[t].append(node.name)
        self.tensors = {t: adjacency[t] for t in self.tensor_q if t in adjacency}
        self.tensor_index = {t: len(op_names) + j for j, t in enumerate(self.tensors)}
        return SwitchMap(op_names, self.tensors)

    def rewrite(self, fm, op_names: Sequence[str]) -> list:
        """The switch model's nodes, in topological order: graph-input switches first, then each
        node followed by the switches of the tensors it produces. A switched tensor keeps its name
        (consumers are untouched); its producer now writes ``<name>__raw`` (``fm``'s nodes are
        changed in place)."""
        index = {n: k for k, n in enumerate(op_names)}
        new_nodes: list = []
        renamed_inputs: dict[str, str] = {}
        for gi in fm.graph.input:
            if gi.name in self.tensors:
                sw = f"{gi.name}__switched"
                self.tensor_switch(gi.name, gi.name, sw, new_nodes)
                renamed_inputs[gi.name] = sw
        for node in fm.graph.node:
            for i, x in enumerate(node.input):
                if x in renamed_inputs:
                    node.input[i] = renamed_inputs[x]
            produced = [o for o in node.output if o in self.tensors]
            for o in produced:
                node.output[list(node.output).index(o)] = f"{o}__raw"
            if node.name in index:
                self.op_switch(node, index[node.name], new_nodes)
            else:
                new_nodes.append(node)
            for o in produced:
                self.tensor_switch(o, f"{o}__raw", o, new_nodes)
        return new_nodes

    def _cond(self, index: int, tag: str, nodes: list) -> str:
        cond = f"{tag}_cond"
        nodes.append(switch_gather(MASK_INPUT, index, tag, cond, f"{tag}_Gather", self.needed))
        return cond

    def _vinfo(self, name: str, like: str):
        from onnx import helper

        return helper.make_tensor_value_info(name, self.elem.get(like.removesuffix("__raw"), self.float_type), None)

    def tensor_switch(self, t: str, raw: str, out: str, nodes: list) -> None:
        """``out = If(mask[t]) then DQ(Q(raw)) else raw``, appended to ``nodes``."""
        from onnx import helper

        q = self.tensor_q[t]
        tag = f"vlsens_t{self.tensor_index[t]}"
        dq = next(n for n in self.q_consumers[q.output[0]] if n.op_type == "DequantizeLinear")
        for x in list(q.input[1:]) + list(dq.input[1:]):
            self.needed[x] = self.q_inits[x]
        qo, do = f"{tag}_q", f"{tag}_dq"
        then_g = helper.make_graph(
            [copy_node(q, {q.input[0]: raw, q.output[0]: qo}, f"{tag}_Quantize"),
             copy_node(dq, {q.output[0]: qo, dq.output[0]: do}, f"{tag}_Dequantize")],
            f"{tag}_int8", [], [self._vinfo(do, t)])
        else_g = helper.make_graph([helper.make_node("Identity", [raw], [f"{tag}_id"], name=f"{tag}_Identity")],
                                   f"{tag}_float", [], [self._vinfo(f"{tag}_id", t)])
        cond = self._cond(self.tensor_index[t], tag, nodes)
        nodes.append(helper.make_node("If", [cond], [out], name=f"{tag}_If", then_branch=then_g, else_branch=else_g))

    def op_switch(self, node, k: int, nodes: list) -> None:
        """Op ``node`` (switch ``k``) as ``If(mask[k]) then node(DQ(W_q) ...) else node``, appended to
        ``nodes``; as it is when the QDQ model quantized none of its inputs' weights."""
        from onnx import helper

        qn = self.q_nodes.get(node.name)
        if qn is None:
            raise ValueError(f"node {node.name} is missing from the quantized model")
        tag = f"vlsens_op{k}"
        then_nodes, inputs, quantized = [], [], False
        for name, fname in zip(qn.input, node.input):
            prod = self.q_producer.get(name)
            if prod is not None and prod.op_type == "DequantizeLinear" and prod.input[0] in self.q_inits:
                quantized = True
                out = f"{prod.output[0]}__{tag}"
                then_nodes.append(copy_node(prod, {prod.output[0]: out}, f"{prod.name}__{tag}"))
                for x in prod.input:
                    self.needed[x] = self.q_inits[x]
                inputs.append(out)
            else:
                inputs.append(fname)  # activations: already switched at tensor level
        if not quantized:  # e.g. MatMul of two activations: all of its Q/DQ is on tensors
            nodes.append(node)
            return
        core = copy_node(node, {}, f"{node.name}__{tag}")
        del core.input[:]
        core.input.extend(inputs)
        del core.output[:]
        core.output.extend(f"{o}__{tag}_int8" for o in node.output)
        then_nodes.append(core)
        fl = copy_node(node, {o: f"{o}__{tag}_float" for o in node.output}, f"{node.name}__{tag}_float")
        outs = [self._vinfo(f"{o}__{tag}_int8", o) for o in node.output]
        then_g = helper.make_graph(then_nodes, f"{tag}_int8", [], outs)
        else_g = helper.make_graph([fl], f"{tag}_float", [], [self._vinfo(f"{o}__{tag}_float", o) for o in node.output])
        cond = self._cond(k, tag, nodes)
        nodes.append(helper.make_node("If", [cond], list(node.output), name=node.name,
                                      then_branch=then_g, else_branch=else_g))
