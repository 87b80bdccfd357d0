"""The switch model: one ONNX graph in which every quantizable op can be INT8 or float.

Built from the float model and ORT's all-op QDQ model (``quantize_static`` with every op
selected). In it every quantizable node k becomes

    If(mask[k]) then:  Q/DQ(inputs) -> k -> Q/DQ(output)      (copied from ORT's QDQ model)
                else:  k on the float inputs

and every activation tensor ORT quantized becomes ``If(mask[t]) then DQ(Q(t)) else t``, with
``mask`` a boolean graph input (:data:`MASK_INPUT`), so one session evaluates any set of INT8 ops
and ONNX Runtime executes only the taken branch. Every Q/DQ node and quantized initializer is
ORT's own, so scales, zero points and rounded weights are exactly a deployment's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.onnxgraph import copy_node, element_types

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

    from vlsens.core.onnxutil import save_with_external_data

    if Path(out_model).resolve().parent != Path(float_model).resolve().parent:
        raise ValueError(f"{out_model} must be written beside {float_model} (it reads that model's weights file)")
    fm = onnx.load(str(float_model), load_external_data=False)
    qm = onnx.load(str(qdq_model), load_external_data=True)
    q_nodes = {n.name: n for n in qm.graph.node}
    q_producer = {o: n for n in qm.graph.node for o in n.output}
    q_inits = {i.name: i for i in qm.graph.initializer}
    f_inits = {i.name for i in fm.graph.initializer}
    elem = element_types(float_model)
    float_type = fm.graph.input[0].type.tensor_type.elem_type
    ops = set(op_names)

    # 1. Activation tensors ORT quantized (Q nodes on non-initializers) and their adjacent ops.
    tensor_q: dict[str, object] = {}
    for n in qm.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in q_inits:
            tensor_q.setdefault(n.input[0], n)
    # A quantized graph output keeps its name on the DequantizeLinear; ORT renames the tensor its
    # producer writes (e.g. lm_head -> logits). The float graph's output is what that Q reads.
    for out in qm.graph.output:
        dq = q_producer.get(out.name)
        q = q_producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in q_inits:
            tensor_q[out.name] = q
    adjacency: dict[str, list[str]] = {}
    for node in fm.graph.node:
        if node.name in ops:
            for t in list(node.input) + list(node.output):
                if t in tensor_q and node.name not in adjacency.setdefault(t, []):
                    adjacency[t].append(node.name)
    tensors = {t: adjacency[t] for t in tensor_q if t in adjacency}
    smap = SwitchMap(op_names, tensors)
    tensor_index = {t: len(op_names) + j for j, t in enumerate(tensors)}

    needed: dict[str, object] = {}

    def switch_cond(index: int, tag: str, nodes: list) -> str:
        idx, cond = f"{tag}_index", f"{tag}_cond"
        needed[idx] = helper.make_tensor(idx, TensorProto.INT64, [], [index])
        nodes.append(helper.make_node("Gather", [MASK_INPUT, idx], [cond], name=f"{tag}_Gather", axis=0))
        return cond

    def vinfo(name: str, like: str):
        return helper.make_tensor_value_info(name, elem.get(like.removesuffix("__raw"), float_type), None)

    def tensor_switch(t: str, raw: str, out: str, nodes: list) -> None:
        q = tensor_q[t]
        tag = f"vlsens_t{tensor_index[t]}"
        dq = next(n for n in qm.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
        for x in list(q.input[1:]) + list(dq.input[1:]):
            needed[x] = q_inits[x]
        qo, do = f"{tag}_q", f"{tag}_dq"
        then_g = helper.make_graph(
            [copy_node(q, {q.input[0]: raw, q.output[0]: qo}, f"{tag}_Quantize"),
             copy_node(dq, {q.output[0]: qo, dq.output[0]: do}, f"{tag}_Dequantize")],
            f"{tag}_int8", [], [vinfo(do, t)])
        else_g = helper.make_graph([helper.make_node("Identity", [raw], [f"{tag}_id"], name=f"{tag}_Identity")],
                                   f"{tag}_float", [], [vinfo(f"{tag}_id", t)])
        cond = switch_cond(tensor_index[t], tag, nodes)
        nodes.append(helper.make_node("If", [cond], [out], name=f"{tag}_If", then_branch=then_g, else_branch=else_g))

    def op_switch(node, k: int, nodes: list) -> None:
        qn = q_nodes.get(node.name)
        if qn is None:
            raise ValueError(f"node {node.name} is missing from the quantized model")
        tag = f"vlsens_op{k}"
        then_nodes, inputs, quantized = [], [], False
        for name, fname in zip(qn.input, node.input):
            prod = q_producer.get(name)
            if prod is not None and prod.op_type == "DequantizeLinear" and prod.input[0] in q_inits:
                quantized = True
                out = f"{prod.output[0]}__{tag}"
                then_nodes.append(copy_node(prod, {prod.output[0]: out}, f"{prod.name}__{tag}"))
                for x in prod.input:
                    needed[x] = q_inits[x]
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
        then_g = helper.make_graph(then_nodes, f"{tag}_int8", [], [vinfo(f"{o}__{tag}_int8", o) for o in node.output])
        else_g = helper.make_graph([fl], f"{tag}_float", [], [vinfo(f"{o}__{tag}_float", o) for o in node.output])
        cond = switch_cond(k, tag, nodes)
        nodes.append(helper.make_node("If", [cond], list(node.output), name=node.name,
                                      then_branch=then_g, else_branch=else_g))

    # 2. Rewrite in topological order: graph-input switches first, then each node followed by
    #    the switches of the tensors it produces. A switched tensor keeps its name (consumers are
    #    untouched); its producer now writes "<name>__raw".
    index = {n: k for k, n in enumerate(op_names)}
    new_nodes: list = []
    renamed_inputs: dict[str, str] = {}
    for gi in fm.graph.input:
        if gi.name in tensors:
            sw = f"{gi.name}__switched"
            tensor_switch(gi.name, gi.name, sw, new_nodes)
            renamed_inputs[gi.name] = sw
    for node in fm.graph.node:
        for i, x in enumerate(node.input):
            if x in renamed_inputs:
                node.input[i] = renamed_inputs[x]
        produced = [o for o in node.output if o in tensors]
        for o in produced:
            node.output[list(node.output).index(o)] = f"{o}__raw"
        if node.name in index:
            op_switch(node, index[node.name], new_nodes)
        else:
            new_nodes.append(node)
        for o in produced:
            tensor_switch(o, f"{o}__raw", o, new_nodes)
    del fm.graph.node[:]
    fm.graph.node.extend(new_nodes)
    for name, init in needed.items():
        if name not in f_inits:
            fm.graph.initializer.append(init)
    fm.graph.input.append(helper.make_tensor_value_info(MASK_INPUT, TensorProto.BOOL, [smap.size]))
    # Value infos of renamed tensors are stale; ORT re-infers them.
    del fm.graph.value_info[:]
    # Q/DQ with FP16 scales or per-channel axes need the opset ORT's quantizer declared.
    for imp in qm.opset_import:
        for mine in fm.opset_import:
            if mine.domain == imp.domain and imp.version > mine.version:
                mine.version = imp.version
    save_with_external_data(fm, out_model)
    return smap
