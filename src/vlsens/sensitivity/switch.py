"""The switch model: one ONNX graph in which every quantizable op can be INT8 or float.

Built from the float model and ORT's all-op QDQ model (``quantize_static`` with every op
selected). In it every quantizable node k becomes

    If(mask[k]) then:  Q/DQ(inputs) -> k -> Q/DQ(output)      (copied from ORT's QDQ model)
                else:  k on the float inputs

and every activation tensor ORT quantized becomes ``If(mask[t]) then DQ(Q(t)) else t``, with
``mask`` a boolean graph input (:data:`MASK_INPUT`), so one session evaluates any set of INT8 ops
and ONNX Runtime executes only the taken branch. Every Q/DQ node and quantized initializer is
ORT's own, so scales, zero points and rounded weights are exactly a deployment's.

**16-bit activations (W8A16).** Given ORT's all-op model with 16-bit activations as well, the
``then`` branches hold both widths: a tensor's is ``If(wide[t]) then DQ16(Q16(t)) else DQ8(Q8(t))``
and an op's is ``If(wide[its input]) then k(DQ(W), DQ(b16)) else k(DQ(W), DQ(b8))`` (ORT scales a
bias by its input's scale, so the bias follows the width of the tensor the op reads; weights are
the same bytes and stored once). ``wide`` is a second boolean input (:data:`WIDE_INPUT`, the same
indices): a tensor is 16-bit when any op next to it is W8A16 (:meth:`SwitchMap.wide_mask`), which
is what the built model's tensor overrides say (:func:`vlsens.quantize.qdq.wide_tensors`).

The pieces every switch model is made of (the nbits engine's too, :mod:`vlsens.sensitivity.nbits`):
:func:`check_beside` (the model reads its sources' data files), :func:`switch_gather` (a node
reads its switch from the graph input) and :func:`write_switch_model` (the rewritten graph with
the switches' constants and input, saved).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.onnxgraph import consumers, copy_node, element_types, producers

MASK_INPUT = "vlsens_int8_mask"
#: The second switch input of a switch model with 16-bit activations (W8A16).
WIDE_INPUT = "vlsens_wide_mask"


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

    def wide_mask(self, wide_ops: Sequence[str]) -> np.ndarray:
        """The :data:`WIDE_INPUT` value: tensor switches on where any op next to the tensor is
        W8A16 (op entries stay off: an op's bias follows its input tensor's switch)."""
        m = self.mask(wide_ops)
        m[: len(self.ops)] = False
        return m

    def feed(self, int8_ops: Sequence[str], wide_ops: Sequence[str] = (), wide: bool = False) -> dict:
        """The switch inputs for ``int8_ops`` quantized, ``wide_ops`` (among them) at 16-bit
        activations; ``wide``: the model has :data:`WIDE_INPUT`."""
        out = {MASK_INPUT: self.mask(int8_ops)}
        if wide:
            out[WIDE_INPUT] = self.wide_mask(wide_ops)
        elif wide_ops:
            raise ValueError("W8A16 ops asked for, but the switch model has no 16-bit activations")
        return out

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
    ``switches`` (a value info, or a list of them). Its value infos are dropped: the renamed tensors' are stale, ONNX
    Runtime re-infers them."""
    from vlsens.core.onnxutil import save_with_external_data

    f_inits = {i.name for i in fm.graph.initializer}
    del fm.graph.node[:]
    fm.graph.node.extend(nodes)
    for name, init in needed.items():
        if name not in f_inits:
            fm.graph.initializer.append(init)
    fm.graph.input.extend(switches if isinstance(switches, list) else [switches])
    del fm.graph.value_info[:]
    save_with_external_data(fm, out_model)


def build_switch_model(float_model: str | Path, qdq_model: str | Path, out_model: str | Path,
                       op_names: Sequence[str], wide_model: str | Path | None = None) -> SwitchMap:
    """Combine the float model and ORT's all-op QDQ model into one switchable model.

    * a quantized activation tensor ``a`` becomes ``If(mask[a]) then DQ(Q(a)) else a``, read
      by all of a's consumers;
    * an op with quantized weights becomes ``If(mask[k]) then k(DQ(W_q), DQ(b_q)) else k(W, b)``.

    Every Q/DQ node and quantized initializer is copied from ``qdq_model``, so scales, zero
    points and rounded weights are ORT's own.

    The float weights are not copied: ``out_model`` must sit in the float model's folder, and its
    float initializers keep pointing into the float model's data file; only what comes from the
    QDQ model (quantized weights, scales, zero points) goes to ``out_model``'s own data file.
    ``wide_model``: ORT's all-op model with 16-bit activations; the switch model then has the
    :data:`WIDE_INPUT` too. Memory: the QDQ models' weights (a quarter of the float ones; the
    wide model's weights are the same bytes, kept once) and the graphs.
    """
    import onnx
    from onnx import TensorProto, helper

    check_beside(out_model, float_model)
    fm = onnx.load(str(float_model), load_external_data=False)
    qm = onnx.load(str(qdq_model), load_external_data=True)
    wm = onnx.load(str(wide_model), load_external_data=True) if wide_model is not None else None
    sw = Int8Switches(qm, element_types(float_model), fm.graph.input[0].type.tensor_type.elem_type, wm)
    smap = sw.switch_map(fm, op_names)
    nodes = sw.rewrite(fm, op_names)
    # Q/DQ with FP16 scales, per-channel axes or 16-bit types need the opset ORT's quantizer declared.
    for source in (qm, wm) if wm is not None else (qm,):
        for imp in source.opset_import:
            for mine in fm.opset_import:
                if mine.domain == imp.domain and imp.version > mine.version:
                    mine.version = imp.version
    inputs = [helper.make_tensor_value_info(name, TensorProto.BOOL, [smap.size])
              for name in ((MASK_INPUT, WIDE_INPUT) if wm is not None else (MASK_INPUT,))]
    write_switch_model(fm, nodes, sw.needed, inputs, out_model)
    return smap


class Int8Switches:
    """The INT8 switches of a float graph, made from ORT's QDQ model ``qm``: the activation
    tensors it quantized (``tensor_q``: tensor -> its QuantizeLinear), each tensor's switch index,
    and the initializers the switches add (``needed``: Q/DQ parameters, quantized weights, switch
    indices)."""

    def __init__(self, qm, elem: dict[str, int], float_type: int, wm=None):
        self.elem, self.float_type = elem, float_type
        self.q = QdqSource(qm)
        #: ORT's all-op model with 16-bit activations (None: 8-bit only); its initializers that
        #: differ from the 8-bit model's get a ``__wide`` suffix
        self.w = QdqSource(wm, self.q.inits) if wm is not None else None
        self.tensors: dict[str, list[str]] = {}
        self.tensor_index: dict[str, int] = {}
        self.needed: dict[str, object] = {}

    def switch_map(self, fm, op_names: Sequence[str]) -> SwitchMap:
        """The switches: the ops ``op_names``, then every quantized tensor one of them reads or
        writes, with those ops (graph order)."""
        ops = set(op_names)
        adjacency: dict[str, list[str]] = {}
        for node in fm.graph.node:
            if node.name in ops:
                for t in list(node.input) + list(node.output):
                    if t in self.q.tensor_q and node.name not in adjacency.setdefault(t, []):
                        adjacency[t].append(node.name)
        self.tensors = {t: adjacency[t] for t in self.q.tensor_q if t in adjacency}
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

    def _wide_cond(self, index: int, tag: str, nodes: list) -> str:
        """``<tag>_wide`` = :data:`WIDE_INPUT`[index], computed beside the op's own switch (a suffix
        run that starts at the op computes it too)."""
        cond = f"{tag}_wide"
        nodes.append(switch_gather(WIDE_INPUT, index, f"{tag}_w", cond, f"{tag}_GatherWide", self.needed))
        return cond

    def _qdq_pair(self, src: "QdqSource", t: str, raw: str, out: str, tag: str) -> list:
        """Copies of ``src``'s Q and DQ of tensor ``t``, reading ``raw`` and writing ``out``."""
        q = src.tensor_q[t]
        dq = next(n for n in src.consumers[q.output[0]] if n.op_type == "DequantizeLinear")
        for x in list(q.input[1:]) + list(dq.input[1:]):
            self.needed[src.rename.get(x, x)] = src.initializer(x)
        qo = f"{tag}_q"
        return [copy_node(q, ChainMap({q.input[0]: raw, q.output[0]: qo}, src.rename), f"{tag}_Quantize"),
                copy_node(dq, ChainMap({q.output[0]: qo, dq.output[0]: out}, src.rename), f"{tag}_Dequantize")]

    def _vinfo(self, name: str, like: str):
        from onnx import helper

        return helper.make_tensor_value_info(name, self.elem.get(like.removesuffix("__raw"), self.float_type), None)

    def tensor_switch(self, t: str, raw: str, out: str, nodes: list) -> None:
        """``out = If(mask[t]) then DQ(Q(raw)) else raw``, appended to ``nodes``."""
        from onnx import helper

        tag = f"vlsens_t{self.tensor_index[t]}"
        do = f"{tag}_dq"
        cond = self._cond(self.tensor_index[t], tag, nodes)
        if self.w is None or t not in self.w.tensor_q:
            narrow = self._qdq_pair(self.q, t, raw, do, tag)
        else:
            wide = self._wide_cond(self.tensor_index[t], tag, nodes)
            d8, d16 = f"{tag}_dq8", f"{tag}_dq16"
            narrow = self._qdq_pair(self.q, t, raw, d8, tag)
            wide_g = helper.make_graph(self._qdq_pair(self.w, t, raw, d16, f"{tag}_w"), f"{tag}_a16", [],
                                       [self._vinfo(d16, t)])
            narrow_g = helper.make_graph(narrow, f"{tag}_a8", [], [self._vinfo(d8, t)])
            narrow = [helper.make_node("If", [wide], [do], name=f"{tag}_IfWide", then_branch=wide_g,
                                       else_branch=narrow_g)]
        then_g = helper.make_graph(narrow, f"{tag}_int8", [], [self._vinfo(do, t)])
        else_g = helper.make_graph([helper.make_node("Identity", [raw], [f"{tag}_id"], name=f"{tag}_Identity")],
                                   f"{tag}_float", [], [self._vinfo(f"{tag}_id", t)])
        nodes.append(helper.make_node("If", [cond], [out], name=f"{tag}_If", then_branch=then_g, else_branch=else_g))

    def _op_core(self, src: "QdqSource", node, tag: str, suffix: str):
        """``node`` on ``src``'s dequantized weights: (nodes, outputs, the initializers read), or
        None when ``src`` quantized none of its inputs' weights."""
        qn = src.nodes.get(node.name)
        if qn is None:
            raise ValueError(f"node {node.name} is missing from the quantized model")
        branch, inputs, read = [], [], []
        for name, fname in zip(qn.input, node.input):
            prod = src.producer.get(name)
            if prod is not None and prod.op_type == "DequantizeLinear" and prod.input[0] in src.inits:
                out = f"{prod.output[0]}__{tag}{suffix}"
                branch.append(copy_node(prod, ChainMap({prod.output[0]: out}, src.rename), f"{prod.name}__{tag}{suffix}"))
                for x in prod.input:
                    self.needed[src.rename.get(x, x)] = src.initializer(x)
                    read.append(src.rename.get(x, x))
                inputs.append(out)
            else:
                inputs.append(fname)  # activations: already switched at tensor level
        if not branch:  # e.g. MatMul of two activations: all of its Q/DQ is on tensors
            return None
        core = copy_node(node, {}, f"{node.name}__{tag}{suffix}")
        del core.input[:]
        core.input.extend(inputs)
        del core.output[:]
        outs = [f"{o}__{tag}_int8{suffix}" for o in node.output]
        core.output.extend(outs)
        return branch + [core], outs, read

    def op_switch(self, node, k: int, nodes: list) -> None:
        """Op ``node`` (switch ``k``) as ``If(mask[k]) then node(DQ(W_q) ...) else node``, appended to
        ``nodes``; as it is when the QDQ model quantized none of its inputs' weights. With 16-bit
        activations and a weight or bias the wide model quantized otherwise, the ``then`` branch is
        ``If(wide[input]) then node(wide DQs) else node(8-bit DQs)``."""
        from onnx import helper

        tag = f"vlsens_op{k}"
        narrow = self._op_core(self.q, node, tag, "")
        if narrow is None:
            nodes.append(node)
            return
        then_nodes, outs, read = narrow
        cond = self._cond(k, tag, nodes)
        source = node.input[0] if node.input else ""
        if self.w is not None and source in self.tensor_index:
            wide = self._op_core(self.w, node, tag, "_a16")
            if wide is not None and wide[2] != read:
                c16 = self._wide_cond(self.tensor_index[source], tag, nodes)
                merged = [f"{o}__{tag}_int8_any" for o in node.output]
                wide_g = helper.make_graph(wide[0], f"{tag}_a16", [],
                                           [self._vinfo(o, node.output[i]) for i, o in enumerate(wide[1])])
                narrow_g = helper.make_graph(then_nodes, f"{tag}_a8", [],
                                             [self._vinfo(o, node.output[i]) for i, o in enumerate(outs)])
                then_nodes = [helper.make_node("If", [c16], merged, name=f"{tag}_IfWide", then_branch=wide_g,
                                               else_branch=narrow_g)]
                outs = merged
        fl = copy_node(node, {o: f"{o}__{tag}_float" for o in node.output}, f"{node.name}__{tag}_float")
        then_g = helper.make_graph(then_nodes, f"{tag}_int8", [], [self._vinfo(o, node.output[i])
                                                                   for i, o in enumerate(outs)])
        else_g = helper.make_graph([fl], f"{tag}_float", [], [self._vinfo(f"{o}__{tag}_float", o) for o in node.output])
        nodes.append(helper.make_node("If", [cond], list(node.output), name=node.name,
                                      then_branch=then_g, else_branch=else_g))


class QdqSource:
    """One of ORT's all-op QDQ models as a source of Q/DQ nodes: its nodes by name, producers,
    consumers, initializers and the activation tensors it quantized (``tensor_q``: tensor -> its
    QuantizeLinear). ``base``: the 8-bit model's initializers, for a wide model: an initializer
    of the same name and bytes is read from there, one that differs is renamed ``<name>__wide``
    (:attr:`rename`)."""

    def __init__(self, model, base: dict | None = None):
        self.model = model
        self.nodes = {n.name: n for n in model.graph.node}
        self.producer = producers(model.graph.node)
        self.consumers = consumers(model.graph.node)
        self.inits = {i.name: i for i in model.graph.initializer}
        self.tensor_q = self._quantized_tensors()
        self.rename: dict[str, str] = {}
        self._renamed: dict[str, object] = {}
        for name, init in self.inits.items():
            if base is not None and (name not in base or base[name].SerializeToString() != init.SerializeToString()):
                self.rename[name] = f"{name}__wide"
                renamed = type(init)()
                renamed.CopyFrom(init)
                renamed.name = self.rename[name]
                self._renamed[name] = renamed

    def initializer(self, name: str):
        """The initializer ``name`` as the switch model holds it (renamed when it differs)."""
        return self._renamed.get(name) or self.inits[name]

    def _quantized_tensors(self) -> dict:
        """Activation tensors ORT quantized (Q nodes on non-initializers). A quantized graph output
        keeps its name on the DequantizeLinear; ORT renames the tensor its producer writes (e.g.
        lm_head -> logits). The float graph's output is what that Q reads."""
        tensor_q: dict[str, object] = {}
        for n in self.model.graph.node:
            if n.op_type == "QuantizeLinear" and n.input[0] not in self.inits:
                tensor_q.setdefault(n.input[0], n)
        for out in self.model.graph.output:
            dq = self.producer.get(out.name)
            q = self.producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in self.inits:
                tensor_q[out.name] = q
        return tensor_q
