"""FP32 ONNX -> FP16 ONNX (I/O kept FP32) with a range-based FP32 fallback (a pure transform;
:mod:`vlsens.variants` gates and publishes).

Two facts shape this:

* ``onnxconverter_common.float16`` leaves the model's own ``Cast(to=FLOAT)`` nodes alone, and ORT
  then refuses the graph (a float32 tensor feeds an fp16 consumer). The Casts are noted before
  conversion and retargeted to FLOAT16 afterwards, except those kept in FP32.
* transformers computes some things in float32 on purpose, whatever the model's dtype: RMSNorm's
  statistics (``hidden.to(float32).pow(2).mean()``) and the rotary position angles. In the FP32
  export these are *islands* between the model's own ``Cast(to=FLOAT)`` nodes of one module
  scope; they stay FP32 (:func:`own_fp32_islands`). Converted to FP16 they cost 25x in accuracy
  at real widths (Qwen2.5-VL-3B's text LM, 2 layers: max relative logit error 2.5e-2 -> 1.0e-3,
  cosine 0.99976 -> 0.9999997, top-1 98 % -> 100 %).
* Real Qwen2.5-VL checkpoints overflow FP16 in places (the last vision block's MLP down
  projection). Random weights do not show it, so the fallback is measured, not listed: every
  float tensor's max |value| is observed on the parity images in one ORT run (``Abs`` +
  ``ReduceMax`` side outputs, so no activation is kept), and a node stays FP32 when one of its
  float inputs or outputs exceeds ``max_activation`` or one of its initializers exceeds
  ``max_initializer`` (65504 is FP16's largest finite value).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from vlsens.core.fsutil import copy_file
from vlsens.core.onnxgraph import consumers, inferred_model, output_type, producers
from vlsens.core.onnxutil import (
    check_model,
    data_path,
    make_session,
    save_streamed,
    tensor_array,
    untie_identity_initializers,
)

log = logging.getLogger(__name__)

FP16_MAX = 65504.0
ABSMAX_SUFFIX = "__vlsens_absmax"


def float_tensors(model_path: str | Path, scratch: Path) -> tuple[list[str], "object"]:
    """Names of all float32 tensors produced by nodes (via path-based shape inference), and the
    inferred model proto loaded without its weights."""
    import onnx

    m = inferred_model(model_path)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in
             list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)}
    inits = {i.name for i in m.graph.initializer}
    # Tensors computed from weights alone (a tied lm_head's Transpose of the embedding) are
    # weights too: judged by max_initializer's rule through their sources, and not observed (an
    # Abs of a 1.2 GB constant would cost 1.2 GB).
    constant = set(inits)
    names = []
    for node in m.graph.node:
        if all(x in constant for x in node.input if x):
            constant.update(o for o in node.output if o)
            continue
        for o in node.output:
            if o and o not in inits and types.get(o) == onnx.TensorProto.FLOAT:
                names.append(o)
    for i in m.graph.input:
        if types.get(i.name) == onnx.TensorProto.FLOAT:
            names.append(i.name)
    return names, m


def activation_absmax(model_path: str | Path, inputs: list[dict], scratch: Path, threads: int = 0,
                      device: str = "auto") -> dict[str, float]:
    """Max |value| of every float tensor of the model over ``inputs`` (one session, one run each)."""
    import onnx
    from onnx import helper

    names, m = float_tensors(model_path, scratch)
    g = m.graph
    for n in names:
        a = f"{n}{ABSMAX_SUFFIX}_abs"
        r = f"{n}{ABSMAX_SUFFIX}"
        g.node.extend([
            helper.make_node("Abs", [n], [a], name=f"{n}{ABSMAX_SUFFIX}_Abs"),
            helper.make_node("ReduceMax", [a], [r], name=f"{n}{ABSMAX_SUFFIX}_ReduceMax", keepdims=0),
        ])
        g.output.append(helper.make_tensor_value_info(r, onnx.TensorProto.FLOAT, []))
    aug = scratch / "absmax.onnx"
    onnx.save_model(m, str(aug))  # weights stay in the original data file, copied beside it
    copy_file(data_path(model_path), scratch / data_path(model_path).name)  # never a hard link
    sess = make_session(aug, threads=threads, device=device, lean=True)
    out_names = [o.name for o in sess.get_outputs()]
    wanted = [o for o in out_names if o.endswith(ABSMAX_SUFFIX)]
    result = {n: 0.0 for n in names}
    for feed in inputs:
        vals = sess.run(wanted, feed)
        for o, v in zip(wanted, vals):
            key = o[: -len(ABSMAX_SUFFIX)]
            v = float(v)
            if v == float("-inf"):  # ReduceMax of an empty tensor (an empty KV cache): nothing seen
                continue
            result[key] = max(result[key], v) if np.isfinite(v) else float("inf")
    del sess
    aug.unlink()
    (scratch / data_path(model_path).name).unlink()
    return result


def choose_fp32_nodes(model, absmax: dict[str, float], max_activation: float,
                      max_initializer: float = FP16_MAX, weights_dir: str | Path | None = None) -> dict[str, str]:
    """Nodes to keep in FP32, each with the reason (:func:`range_fallbacks`)."""
    return {n: f["reason"] for n, f in range_fallbacks(model, absmax, max_activation, max_initializer,
                                                      weights_dir).items()}


def range_fallbacks(model, absmax: dict[str, float], max_activation: float,
                    max_initializer: float = FP16_MAX, weights_dir: str | Path | None = None) -> dict[str, dict]:
    """Nodes to keep in FP32 because a tensor they touch exceeds its bound: ``{node: {reason,
    kind (activation | initializer), tensor, observed, bound}}``. Initializers are read one at a
    time, from their external data file under ``weights_dir`` when they are not loaded."""
    init_max = {}
    for init in model.graph.initializer:
        if init.data_type == 1:  # FLOAT
            arr = tensor_array(init, weights_dir)
            init_max[init.name] = float(np.abs(arr).max()) if arr.size else 0.0
            del arr
    bounds = (("activation", absmax, max_activation), ("initializer", init_max, max_initializer))
    keep: dict[str, dict] = {}
    for node in model.graph.node:
        over = ((kind, t, seen[t], bound) for t in (*node.input, *node.output) for kind, seen, bound in bounds
                if t in seen and seen[t] > bound)
        hit = next(over, None)  # the first tensor over its bound, in input/output order
        if hit:
            kind, t, value, bound = hit
            keep[node.name] = {"reason": f"{kind} '{t}' reaches {value:.4g} > {bound:g}", "kind": kind,
                               "tensor": t, "observed": float(value), "bound": float(bound)}
    return keep


def fp16_weights(was_float: set[str]) -> tuple[dict, object]:
    """``(read_as, convert)`` for :func:`vlsens.core.onnxutil.save_streamed` of a converted model
    whose large initializers still point at the source's data file: an initializer the converter
    flipped to FLOAT16 (one of ``was_float``) is read as the float32 it is on disk and converted as
    the converter converts loaded ones (clipped to FP16's range), one tensor in memory at a time."""
    import onnx
    from onnxconverter_common.float16 import convert_np_to_float16

    def to_fp16(t, arr):
        if t.data_type == onnx.TensorProto.FLOAT16 and t.name in was_float:
            return convert_np_to_float16(np.asarray(arr, dtype=np.float32), 5.96e-08, FP16_MAX)
        return arr

    return {n: np.float32 for n in was_float}, to_fp16


def own_fp32_islands(model) -> dict[str, str]:
    """The computations transformers upcasts to float32 on purpose: in a module scope (the
    exported name up to its last ``/``), the model's own ``Cast(to=FLOAT)`` nodes alternate along
    every path (upcast, downcast, upcast, ...), so a node that has an odd number of them before
    it on its paths within the scope, and another one after it, sits between an upcast and its
    downcast (RMSNorm's statistics, rotary angles, softmax). Casts themselves excluded. Returns
    {node: reason}."""
    nodes = [n for n in model.graph.node if n.name]
    producer, readers = producers(nodes), consumers(nodes)

    def scope(n) -> str:
        return n.name.rsplit("/", 1)[0] if "/" in n.name else ""

    def is_cast(n) -> bool:
        return n.op_type == "Cast" and any(a.name == "to" and a.i == 1 for a in n.attribute)

    depth: dict[str, int] = {}  # own Casts passed within the scope (nodes are in topological order)
    for n in nodes:
        ps = [producer[x] for x in n.input if x in producer and scope(producer[x]) == scope(n)]
        depth[n.name] = max((depth[p.name] + int(is_cast(p)) for p in ps), default=0)
    # Nodes from which a later own Cast of the same scope is reachable within the scope.
    before_cast: set[str] = set()
    for n in reversed(nodes):
        if is_cast(n):
            continue
        for o in n.output:
            for c in readers.get(o, []):
                if scope(c) == scope(n) and (is_cast(c) or c.name in before_cast):
                    before_cast.add(n.name)
                    break
    return {n.name: f"float32 by the model's own Casts in {scope(n)}" for n in nodes
            if scope(n) and not is_cast(n) and depth[n.name] % 2 == 1 and n.name in before_cast}


def own_float_casts(model) -> list[str]:
    """Names of the model's own ``Cast(to=FLOAT)`` nodes."""
    out = []
    for node in model.graph.node:
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to == 1:
                out.append(node.name)
    return out


def to_fp16(model, keep_fp32: list[str], retarget_casts: bool = True, repair: bool = True):
    """Convert a loaded ModelProto to FP16 (I/O FP32), keeping ``keep_fp32`` nodes in FP32.

    The model's own ``Cast(to=FLOAT)`` nodes outside ``keep_fp32`` are retargeted to FLOAT16
    *before* conversion: afterwards the converter's clean-up would already have removed those
    that follow one of its inserted ``Cast(to=FLOAT16)``, leaving an FP32 value in an FP16 graph.
    """
    from onnxconverter_common import float16

    for i, node in enumerate(model.graph.node):
        if not node.name:  # the converter keys its block list on names
            node.name = f"{node.op_type}_vlsens_{i}"
    casts = own_float_casts(model)
    keep = blocked_nodes(model, keep_fp32, casts)
    if retarget_casts:
        _retarget_to_fp16(model, set(casts) - keep)
    out_types = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    unused = _name_unused_outputs(model)
    converted = float16.convert_float_to_float16(
        model,
        keep_io_types=True,
        disable_shape_infer=True,  # shape inference serializes the proto (fails above 2 GB)
        node_block_list=sorted(keep),
        max_finite_val=FP16_MAX,
        min_positive_val=5.96e-08,
        check_fp16_ready=False,
    )
    for node in converted.graph.node:
        for j, o in enumerate(node.output):
            if o in unused:
                node.output[j] = ""
    restored = keep_output_types(converted, out_types)
    if restored:
        log.info("graph outputs kept FP32 where the converter made them FP16: %s", restored)
    bypassed = bypass_round_trips(converted, keep)
    if bypassed:
        log.info("%d FP32 -> FP16 -> FP32 round trip(s) between FP32 nodes bypassed", bypassed)
    repaired = repair_boundaries(converted, keep) if repair else 0
    if repaired:
        log.info("inserted %d Cast(s) the converter missed at FP32/FP16 boundaries", repaired)
    return converted, casts


def blocked_nodes(model, keep_fp32: list[str], casts: list[str]) -> set[str]:
    """The converter's block list: ``keep_fp32`` and every own Cast (of ``casts``) that only feeds
    FP32 nodes (an island's upcast): it stays a Cast to FLOAT and is blocked itself; retargeted,
    the converter would pair it with its own Cast back and drop both, wiring an int64 or FP16
    tensor straight into the FP32 node. Likewise every Constant that only FP32 nodes read (the
    rotary frequencies: rounded to FP16 they move an angle of 120 rad by 0.013 rad)."""
    keep = set(keep_fp32)
    readers = consumers(model.graph.node)
    cast_set = set(casts)
    entries = {n.name for n in model.graph.node if (n.name in cast_set or n.op_type == "Constant")
               and n.name not in keep and any(readers.get(o) for o in n.output)
               and all(c.name in keep for o in n.output for c in readers.get(o, []))}
    return keep | entries


def _retarget_to_fp16(model, names: set[str]) -> None:
    """The Casts named ``names`` cast to FLOAT16 (in place)."""
    from onnx import TensorProto

    for node in model.graph.node:
        if node.name in names:
            for a in node.attribute:
                if a.name == "to":
                    a.i = TensorProto.FLOAT16


def _name_unused_outputs(model) -> set[str]:
    """Unused optional outputs are named "" (ONNX Runtime's fused ops have several); the
    converter's topological sort takes "" for a tensor and finds no first node. Name them (in
    place) for the conversion; the names, to unname them after."""
    unused = set()
    for i, node in enumerate(model.graph.node):
        for j, o in enumerate(node.output):
            if not o:
                node.output[j] = f"__vlsens_unused_{i}_{j}"
                unused.add(node.output[j])
    return unused


def keep_output_types(model, types: dict[str, int]) -> list[str]:
    """Graph outputs keep their FP32 type (in place): the converter casts the outputs of a
    blocked (FP32) node to FP16 also where they are graph outputs (e.g. a KV-cache decoder's
    ``present.*``, which must match its FP32 ``past_key_values.*`` inputs). A Cast producing such
    an output is retargeted to FLOAT; any other producer gets a Cast to FLOAT after it."""
    from onnx import TensorProto, helper

    F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
    producer = producers(model.graph.node)
    fixed = []
    for out in model.graph.output:
        if types.get(out.name) != F32 or out.type.tensor_type.elem_type != F16:
            continue
        node = producer.get(out.name)
        if node is not None and node.op_type == "Cast":
            for a in node.attribute:
                if a.name == "to":
                    a.i = F32
        else:
            raw = f"{out.name}__vlsens_fp16"
            if node is not None:
                node.output[list(node.output).index(out.name)] = raw
            model.graph.node.append(helper.make_node("Cast", [raw], [out.name], to=F32,
                                                     name=f"{out.name}__vlsens_to_fp32"))
        out.type.tensor_type.elem_type = F32
        fixed.append(out.name)
    return fixed


def bypass_round_trips(model, keep_fp32: set[str]) -> int:
    """Read FP32 values where the converter rounds them through FP16 and back (in place).

    Between two nodes kept in FP32 the converter casts the first one's output to FLOAT16 and the
    second one's input back to FLOAT, a round trip its own clean-up does not always remove: the
    rotary angles (position x frequency, up to a few hundred radians) then reach Cos and Sin at
    FP16's resolution there (1/16 rad at 128), and the cos / sin tables are off by up to 4 %. A
    ``Cast(to=FLOAT)`` that reads a ``Cast(to=FLOAT16)`` of an FP32 value (written by a node of
    ``keep_fp32`` or by a Cast to FLOAT) is replaced by that value; Casts to FLOAT16 nothing reads
    any more are dropped. Graph outputs are left as they are. Returns the round trips bypassed."""
    from onnx import TensorProto

    g = model.graph
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output if o}

    def cast_to(n) -> int | None:
        return next((a.i for a in n.attribute if a.name == "to"), None) if n.op_type == "Cast" else None

    def fp32(name: str) -> bool:
        p = producer.get(name)
        return p is not None and (p.name in keep_fp32 and p.op_type != "Cast" or cast_to(p) == TensorProto.FLOAT)

    replace: dict[str, str] = {}
    for n in g.node:
        if cast_to(n) != TensorProto.FLOAT or n.output[0] in outputs:
            continue
        down = producer.get(n.input[0])
        if down is not None and cast_to(down) == TensorProto.FLOAT16 and fp32(down.input[0]):
            replace[n.output[0]] = down.input[0]
    if not replace:
        return 0
    for n in g.node:
        for i, x in enumerate(n.input):
            n.input[i] = replace.get(x, x)
    ups = {producer[o].name for o in replace}
    nodes = [n for n in g.node if n.name not in ups]
    read = {x for n in nodes for x in n.input} | outputs
    nodes = [n for n in nodes if not (cast_to(n) == TensorProto.FLOAT16 and n.output[0] not in read)]
    del g.node[:]
    g.node.extend(nodes)
    return len(replace)


def repair_boundaries(model, keep_fp32: set[str]) -> int:
    """Insert Casts where a node's float inputs do not match its precision (in place).

    onnxconverter-common decides where to put Casts around blocked nodes from ``value_info`` and
    then removes Cast pairs it thinks redundant; in some layouts a kept-FP32 node ends up reading
    an FP16 tensor (or the reverse) and ORT refuses the graph. This pass propagates element types
    through the converted graph in topological order and, for every node whose float inputs
    differ from the precision it should run in (FP32 if kept, FP16 otherwise), casts them.
    Type-polymorphic ops only; nodes that take no float inputs are left alone.
    """
    from onnx import TensorProto, helper

    F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
    g = model.graph
    dtype: dict[str, int] = {i.name: i.data_type for i in g.initializer}
    dtype.update({i.name: i.type.tensor_type.elem_type for i in g.input})
    # Ops whose float inputs are not the data they compute on in that precision.
    fixed_type_inputs = {"Cast", "Shape", "Size", "ConstantOfShape", "Range", "NonZero"}
    new_nodes, inserted = [], 0
    for node in g.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    dtype[node.output[0]] = a.t.data_type
        elif node.op_type not in fixed_type_inputs:
            want = F32 if node.name in keep_fp32 else F16
            for i, name in enumerate(node.input):
                have = dtype.get(name) if name else None  # "": an omitted optional input
                if have in (F32, F16) and have != want and not (node.op_type in ("Resize",) and i > 0):
                    cast_out = f"{name}__vlsens_to{'32' if want == F32 else '16'}_{node.name}"
                    new_nodes.append(helper.make_node("Cast", [name], [cast_out], to=want,
                                                      name=f"{node.name}__vlsens_cast_in{i}"))
                    dtype[cast_out] = want
                    node.input[i] = cast_out
                    inserted += 1
        new_nodes.append(node)
        out_type = output_type(node, dtype)
        for o in node.output:
            if o and out_type is not None and o not in dtype:
                dtype[o] = out_type
    if inserted:
        del g.node[:]
        g.node.extend(new_nodes)
        # value_info may now disagree with the repaired types: drop the float entries ORT re-infers.
        stale = [v for v in g.value_info if v.type.tensor_type.elem_type in (F32, F16)]
        for v in stale:
            g.value_info.remove(v)
    return inserted


def convert_fp16(src_model: str | Path, feeds: list[dict], staged_model: Path, max_activation: float,
                 max_initializer: float = FP16_MAX, threads: int = 0, device: str = "auto") -> dict:
    """FP16 copy of ``src_model`` at ``staged_model`` (I/O FP32; range-based FP32 fallback measured
    on ``feeds``). Returns the facts for the parity record's ``extra``."""
    import onnx

    tmp = Path(staged_model).parent
    absmax = activation_absmax(src_model, feeds, tmp, threads=threads, device=device)
    # Path-based shape inference gives the converter the value types it needs to put Casts
    # around FP32 nodes; its in-memory inference would serialize (and fail above 2 GB). The
    # weights stay on disk: the converter only flips their type, save_streamed converts them.
    model = inferred_model(src_model)
    src_dir = Path(src_model).parent
    untied = untie_identity_initializers(model)
    was_float = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    islands = own_fp32_islands(model)
    ranged = range_fallbacks(model, absmax, max_activation, max_initializer, weights_dir=src_dir)
    keep = {**islands, **ranged}
    converted, casts = to_fp16(model, list(keep))
    del model
    own = set(casts)
    retargeted = sum(1 for n in converted.graph.node if n.name in own and n.op_type == "Cast"
                     and any(a.name == "to" and a.i == 10 for a in n.attribute))
    save_streamed(converted, src_dir, staged_model, *fp16_weights(was_float))
    del converted
    check_model(staged_model)
    return {
        "converter": "onnxconverter_common.float16.convert_float_to_float16(keep_io_types=True)",
        "max_activation": max_activation,
        "max_initializer": max_initializer,
        "fp32_fallback": [{"node": n, **f} for n, f in sorted(ranged.items())],
        "fp32_islands": {"nodes": len(set(islands) - set(ranged)),
                         "scopes": sorted({r.split(" in ", 1)[1] for r in islands.values()})},
        "retargeted_casts": retargeted,
        "untied_initializers": untied,
        "observed_max_activation": max(absmax.values()) if absmax else 0.0,
    }
