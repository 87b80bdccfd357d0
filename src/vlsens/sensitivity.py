"""Per-op quantization sensitivity: the ``ort`` engine.

Question asked for every quantizable op k: how far does the model's final output on the
evaluation set move from the float output when *only k* runs in INT8 (ONNX Runtime QDQ, same
settings and calibration as a deployment would use)?

The straightforward method (:func:`straightforward_sensitivity`) builds one quantized model and
one session per op. The engine gets the same numbers at close to the cost of one forward pass per
op: calibration runs once, ``quantize_static`` runs once with every op selected, and a *switch
model* is built from that result and the float model. In it every quantizable node k becomes

    If(mask[k]) then:  Q/DQ(inputs) -> k -> Q/DQ(output)      (copied from ORT's QDQ model)
                else:  k on the float inputs

with ``mask`` a boolean graph input, so one session evaluates any set of INT8 ops and ONNX Runtime
executes only the taken branch. Both methods run with basic graph optimizations (Q/DQ not fused
into integer kernels), which makes them compute exactly the same arithmetic; tests check that
their outputs are identical on the tiny model.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from vlsens.quant import (
    Op,
    QuantSettings,
    engine_session,
    output_metrics,
    quantizable_ops,
    quantize,
)

log = logging.getLogger(__name__)

MASK_INPUT = "vlsens_int8_mask"
CSV_COLUMNS = ["rank", "op", "op_type", "block", "role", "weight_params", "mse", "cosine", "sqnr_db"]
#: Extra columns of text (logits) CSVs: KL(float || int8) per position and top-1 agreement.
LOGIT_COLUMNS = ["kl", "top1"]


# --------------------------------------------------------------------------------------------
# The switch model
# --------------------------------------------------------------------------------------------

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
    """
    import onnx
    from onnx import TensorProto, helper

    from vlsens.onnxutil import save_with_external_data

    fm = onnx.load(str(float_model), load_external_data=True)
    qm = onnx.load(str(qdq_model), load_external_data=True)
    q_nodes = {n.name: n for n in qm.graph.node}
    q_producer = {o: n for n in qm.graph.node for o in n.output}
    q_inits = {i.name: i for i in qm.graph.initializer}
    f_inits = {i.name for i in fm.graph.initializer}
    elem = _element_types(float_model)
    float_type = fm.graph.input[0].type.tensor_type.elem_type
    ops = set(op_names)

    # 1. Activation tensors ORT quantized (Q nodes on non-initializers) and their adjacent ops.
    tensor_q: dict[str, object] = {}
    for n in qm.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in q_inits:
            tensor_q.setdefault(n.input[0], n)
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
            [_copy_node(q, {t: raw, q.output[0]: qo}, f"{tag}_Quantize"),
             _copy_node(dq, {q.output[0]: qo, dq.output[0]: do}, f"{tag}_Dequantize")],
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
                then_nodes.append(_copy_node(prod, {prod.output[0]: out}, f"{prod.name}__{tag}"))
                for x in prod.input:
                    needed[x] = q_inits[x]
                inputs.append(out)
            else:
                inputs.append(fname)  # activations: already switched at tensor level
        if not quantized:  # e.g. MatMul of two activations: all of its Q/DQ is on tensors
            nodes.append(node)
            return
        core = _copy_node(node, {}, f"{node.name}__{tag}")
        del core.input[:]
        core.input.extend(inputs)
        del core.output[:]
        core.output.extend(f"{o}__{tag}_int8" for o in node.output)
        then_nodes.append(core)
        fl = _copy_node(node, {o: f"{o}__{tag}_float" for o in node.output}, f"{node.name}__{tag}_float")
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


def _element_types(model_path: str | Path) -> dict[str, int]:
    """Element type of every tensor of a model (path-based shape inference: works above 2 GB)."""
    import tempfile

    import onnx

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "inferred.onnx"
        onnx.shape_inference.infer_shapes_path(str(model_path), str(out))
        m = onnx.load(str(out), load_external_data=False)
    return {vi.name: vi.type.tensor_type.elem_type
            for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info)}


def _copy_node(node, rename: dict[str, str], name: str):
    import onnx

    n = onnx.NodeProto()
    n.CopyFrom(node)
    n.name = name
    for i, x in enumerate(n.input):
        n.input[i] = rename.get(x, x)
    for i, x in enumerate(n.output):
        n.output[i] = rename.get(x, x)
    return n


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------

def as_samples(inputs, model: str | Path | None = None, session=None):
    """:class:`~vlsens.samples.Samples` from Samples or a stacked vision array (cut into the
    graph's fixed batch, read from ``session`` or ``model``)."""
    from vlsens.samples import Samples, graph_input

    if isinstance(inputs, Samples):
        return inputs
    if session is not None:
        real = [i for i in session.get_inputs() if i.name != MASK_INPUT][0]
        name, batch = real.name, (real.shape[0] if isinstance(real.shape[0], int) else 1)
    else:
        name, batch = graph_input(model)
    return Samples.from_array(name, np.asarray(inputs), batch)


def is_logits(session) -> bool:
    """Text graphs: output ``logits`` (B, S, vocab): KL and top-1 are measured too."""
    return session.get_outputs()[0].name == "logits"


class SwitchEngine:
    """One session over the switch model; evaluates any set of INT8 ops on fixed inputs."""

    def __init__(self, switch_model: str | Path, switches: SwitchMap, inputs, threads: int = 0):
        self.switches = switches
        self.ops = switches.ops
        self.session = engine_session(switch_model, threads=threads)
        self.samples = as_samples(inputs, session=self.session)
        self.logits = is_logits(self.session)

    def outputs(self, int8_ops: Sequence[str] = ()):
        """Output of every feed, one at a time (a generator: nothing is accumulated)."""
        mask = self.switches.mask(int8_ops)
        for feed in self.samples.feeds:
            yield self.session.run(None, {**feed, MASK_INPUT: mask})[0]

    def run(self, int8_ops: Sequence[str] = ()) -> np.ndarray:
        """All outputs concatenated (vision-sized outputs; text uses :meth:`evaluate`)."""
        return np.concatenate(list(self.outputs(int8_ops)), axis=0)

    def evaluate(self, int8_ops: Sequence[str], reference) -> dict[str, float]:
        """Metrics against ``reference`` (a ReferenceStore or per-feed arrays), streamed."""
        from vlsens.samples import StreamMetrics

        acc = StreamMetrics(self.logits)
        if isinstance(reference, np.ndarray):  # stacked vision reference: cut like the feeds
            sizes = [len(next(iter(f.values()))) for f in self.samples.feeds]
            reference = np.split(reference[:sum(sizes)], np.cumsum(sizes)[:-1])
        for i, out in enumerate(self.outputs(int8_ops)):
            acc.add(out, reference[i], self.samples.valid[i])
        return acc.result()


def float_outputs(model: str | Path, inputs, threads: int = 0) -> tuple[np.ndarray, float]:
    """Outputs of a float model on stacked vision ``inputs`` and the seconds one pass took."""
    outs, seconds = float_pass(model, inputs, threads, keep=True)
    return np.concatenate(outs, axis=0), seconds


def float_pass(model: str | Path, inputs, threads: int = 0, keep: bool = False) -> tuple[list, float]:
    """One timed pass of a float model over ``inputs`` (the floor); outputs kept when ``keep``."""
    sess = engine_session(model, threads=threads)
    samples = as_samples(inputs, session=sess)
    sess.run(None, samples.feeds[0])  # warm-up
    outs, t0 = [], time.perf_counter()
    for feed in samples.feeds:
        out = sess.run(None, feed)[0]
        if keep:
            outs.append(out)
    return outs, time.perf_counter() - t0


def engine_sensitivity(engine: SwitchEngine, ops: Sequence[Op], reference) -> tuple[list[dict], float]:
    """Rows (without rank) for ``ops``, and the mean seconds per op."""
    engine.evaluate((), reference)  # warm-up: first-run allocations are not the op's cost
    rows, t0 = [], time.perf_counter()
    for op in ops:
        rows.append({**op.as_row(), **engine.evaluate([op.name], reference)})
    per_op = (time.perf_counter() - t0) / max(len(ops), 1)
    return rows, per_op


def straightforward_sensitivity(float_model: str | Path, ops: Sequence[Op], settings: QuantSettings,
                                cache: str | Path, inputs: np.ndarray, reference: np.ndarray,
                                scratch: str | Path, threads: int = 0) -> tuple[list[dict], float, list[np.ndarray]]:
    """The reference method: one ``quantize_static`` model and one session per op."""
    import shutil

    scratch = Path(scratch)
    rows, outs, t0 = [], [], time.perf_counter()
    for k, op in enumerate(ops):
        d = scratch / f"op{k}"
        path = quantize(float_model, d / "model.onnx", [op.name], settings, cache)
        out, _ = float_outputs(path, inputs, threads)
        outs.append(out)
        rows.append({**op.as_row(), **output_metrics(out, reference)})
        shutil.rmtree(d, ignore_errors=True)
    return rows, (time.perf_counter() - t0) / max(len(ops), 1), outs


def rank_rows(rows: list[dict]) -> list[dict]:
    """Rank 1 = most sensitive (largest MSE); ties keep graph order."""
    order = sorted(range(len(rows)), key=lambda i: (-rows[i]["mse"], i))
    ranked = [dict(rows[i]) for i in order]
    for r, row in enumerate(ranked, 1):
        row["rank"] = r
    return ranked


def write_csv(rows: list[dict], path: str | Path) -> None:
    import pandas as pd

    from vlsens.fsutil import atomic_file

    cols = CSV_COLUMNS if rows and "rank" in rows[0] else [c for c in CSV_COLUMNS if c != "rank"]
    if rows and all(c in rows[0] for c in LOGIT_COLUMNS):
        cols = cols + LOGIT_COLUMNS
    with atomic_file(path) as tmp:
        pd.DataFrame(rows, columns=cols).to_csv(tmp, index=False, float_format="%.9g")


def read_csv(path: str | Path) -> list[dict]:
    import pandas as pd

    df = pd.read_csv(path, keep_default_na=False, dtype={"block": str})
    rows = df.to_dict("records")
    for r in rows:  # plain Python types (YAML/JSON friendly); block "" = not in a block
        for k, v in r.items():
            if isinstance(v, np.generic):
                r[k] = v.item()
        r["block"] = int(r["block"]) if str(r["block"]).strip() else ""
    return rows


def shard(items: Sequence, index: int, count: int) -> list:
    """Contiguous shard ``index`` (0-based) of ``count``; shards cover ``items`` exactly once."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}")
    bounds = np.linspace(0, len(items), count + 1).round().astype(int)
    return list(items[bounds[index]:bounds[index + 1]])


def select_ops(model_path: str | Path, settings: QuantSettings) -> list[Op]:
    import onnx

    return quantizable_ops(onnx.load(str(model_path), load_external_data=True), settings.op_types)
