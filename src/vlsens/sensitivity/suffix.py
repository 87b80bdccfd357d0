"""The suffix engine: an op can change nothing that is computed before it, so evaluate it on the
part of the graph from its first switch on, starting from float activations cached once.

The switch model (:mod:`vlsens.sensitivity.switch`) lists its nodes in topological order. For op
k, the *first affected node* is the earliest of its switches (its weight switch, the switches of
the activation tensors next to it). With every other op float, everything the graph computes
before that node equals the float model's values. So:

* **Cuts.** The ops, sorted by first affected node, are split into at most ``max_cuts``
  contiguous groups; a group's *cut* is the first affected node of its first op. The tensors
  *live* at a cut (produced before it, read at or after it; weights and graph inputs excluded)
  are the state a suffix run starts from: on a ViT tower, the residual stream, the tensor the
  op reads and the position/attention tensors every block shares.
* **Segmented model.** The nodes before the last cut are wrapped, segment by segment, in
  ``If(skip[s])`` nodes: the ``else`` branch computes the segment as before, the ``then`` branch
  returns the values fed for the tensors it exports (graph inputs ``vlsens_cache__<tensor>``,
  empty by default). With ``skip`` all false the model is the switch model, node for node. To
  evaluate a group, the segments before its cut are skipped and the cut's live tensors fed: ONNX
  Runtime runs only the suffix. One session serves every group.
* **Probe.** The same graph with every cut's live tensors as extra outputs: one float pass per
  evaluation input fills the cache (kept on disk, memory-mapped, one cut at a time).

Exactness: the suffix executes the same nodes on the same values as the full switch model (the
cached values *are* the float values), so every metric equals the full-graph engine's
(``tests/test_sensitivity.py`` checks every op).

Cost: an op in group g costs the nodes from cut g on; over a tower whose ops are spread evenly
that is about half a forward per op. Memory: one session of the switch model, plus the cache:
``n_eval x sum over cuts of the live bytes`` on disk, the probe run holding one input's share.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from vlsens.core.onnxgraph import element_types, node_reads, rename_reads

log = logging.getLogger(__name__)

SKIP_INPUT = "vlsens_skip"
CACHE_PREFIX = "vlsens_cache__"


def cache_input(tensor: str) -> str:
    return f"{CACHE_PREFIX}{tensor}"


@dataclass
class SuffixPlan:
    """Where the suffixes start: ``cuts[g]`` (node index), the ops of each group, the tensors live
    at each cut, and how many wrapped segments group g skips."""

    cuts: list[int]
    groups: list[list[str]]
    live: list[list[str]]
    skips: list[int]
    segments: int

    def to_json(self) -> dict:
        return {"cuts": self.cuts, "groups": self.groups, "live": self.live, "skips": self.skips,
                "segments": self.segments}

    @classmethod
    def from_json(cls, data: dict) -> "SuffixPlan":
        return cls(list(data["cuts"]), [list(g) for g in data["groups"]], [list(x) for x in data["live"]],
                   list(data["skips"]), int(data["segments"]))

    def group_of(self, int8_ops: Sequence[str]) -> int:
        """The group whose cut comes first among ``int8_ops``' groups (the last group for none:
        the float output is then computed from the last cut)."""
        if not int8_ops:
            return len(self.cuts) - 1
        return min(self._group[o] for o in int8_ops)

    @cached_property
    def _group(self) -> dict[str, int]:
        return {op: g for g, ops in enumerate(self.groups) for op in ops}


def first_affected(model, switches) -> dict[str, int]:
    """Index of the first node of each op's switches (its own, those of the tensors next to it)."""
    pos = {n.name: i for i, n in enumerate(model.graph.node) if n.name}
    n_ops = len(switches.ops)
    tensor_index = {t: n_ops + j for j, t in enumerate(switches.tensors)}
    first = {}
    for k, op in enumerate(switches.ops):
        cands = [pos[op]] if op in pos else []
        if f"vlsens_op{k}_Gather" in pos:
            cands.append(pos[f"vlsens_op{k}_Gather"])
        for t, adj in switches.tensors.items():
            if op in adj and f"vlsens_t{tensor_index[t]}_Gather" in pos:
                cands.append(pos[f"vlsens_t{tensor_index[t]}_Gather"])
        if not cands:
            raise ValueError(f"op {op} has no node in the switch model")
        first[op] = min(cands)
    return first


def lifetimes(model) -> tuple[dict[str, int], dict[str, int]]:
    """(producer index, last reader index) of every tensor a top-level node writes; graph outputs
    are read at ``len(nodes)``."""
    nodes = model.graph.node
    prod, last = {}, {}
    for i, node in enumerate(nodes):
        for x in node_reads(node):
            last[x] = i
        for o in node.output:
            if o:
                prod[o] = i
    for o in model.graph.output:
        last[o.name] = len(nodes)
    return prod, last


def live_at(cut: int, prod: dict[str, int], last: dict[str, int]) -> list[str]:
    return sorted(t for t, p in prod.items() if p < cut <= last.get(t, -1))


def plan(model, switches, max_cuts: int) -> SuffixPlan:
    """Group the ops (by first affected node) into at most ``max_cuts`` cuts."""
    first = first_affected(model, switches)
    order = sorted(switches.ops, key=lambda o: (first[o], switches.ops.index(o)))
    n = len(order)
    g_count = max(1, min(int(max_cuts), n))
    bounds = [round(i * n / g_count) for i in range(g_count + 1)]
    groups = [order[bounds[i]:bounds[i + 1]] for i in range(g_count) if bounds[i] < bounds[i + 1]]
    cuts = [first[g[0]] for g in groups]
    # Equal cuts (ops sharing a first node) merge into one group.
    merged_cuts, merged_groups = [], []
    for c, g in zip(cuts, groups):
        if merged_cuts and merged_cuts[-1] == c:
            merged_groups[-1].extend(g)
        else:
            merged_cuts.append(c)
            merged_groups.append(list(g))
    prod, last = lifetimes(model)
    live = [live_at(c, prod, last) for c in merged_cuts]
    prefix = 1 if merged_cuts[0] > 0 else 0
    # Wrapped segments: [0, cuts[0]) when not empty, then [cuts[g], cuts[g+1]) for all but the last.
    skips = [prefix + g for g in range(len(merged_cuts))]
    return SuffixPlan(merged_cuts, merged_groups, live, skips, prefix + len(merged_cuts) - 1)


# --------------------------------------------------------------------------------------------
# Building the segmented switch model and its probe
# --------------------------------------------------------------------------------------------

def _typed(name: str, elem: int):
    from onnx import helper

    return helper.make_tensor_value_info(name, elem, None)


def _elem_of(t: str, elem_types: dict[str, int]) -> int:
    for key in (t, t.removesuffix("__raw")):
        if key in elem_types:
            return elem_types[key]
    raise ValueError(f"no element type known for tensor {t}")


def _owned_initializers(g, nodes: list, spans: list[tuple[int, int]], bounds: list[int]) -> dict[int, list[str]]:
    """The initializers read by one segment only, by segment: they move into its subgraph. ONNX
    Runtime folds and prepacks constants of a node's own or parent graph, not of a grandparent
    one, so a switch nested in a segment would otherwise run on unpacked weights (other rounding
    than the whole switch model and quantize_static's model)."""
    inits = {i.name for i in g.initializer}
    users: dict[str, set] = {}
    for s_idx, (a, b) in enumerate(spans):
        for node in nodes[a:b]:
            for x in node_reads(node):
                if x in inits:
                    users.setdefault(x, set()).add(s_idx)
    for node in nodes[bounds[-1]:] if spans else nodes:
        for x in node_reads(node):
            if x in inits:
                users.setdefault(x, set()).add(-1)
    for o in g.output:
        if o.name in inits:
            users.setdefault(o.name, set()).add(-1)
    # in the graph's initializer order: the same subgraphs on every run (node_reads is a set)
    return {i: [n.name for n in g.initializer if users.get(n.name) == {i}] for i in range(len(spans))}


def _wrap_segment(g, seg: list, s: int, end: int, last: dict, own: list, elem_types: dict[str, int],
                  cache_inputs: list[str]) -> list:
    """Segment ``s`` (the nodes ``seg``, which end before node ``end``) as ``If(skip[s])``: ``then``
    passes the cache inputs of the tensors read after it on, ``else`` computes them (with the
    initializers ``own``). Adds the cache inputs (to ``g`` and ``cache_inputs``), their empty
    defaults and the segment's index to ``g``; returns the Gather and If nodes."""
    from onnx import TensorProto, helper

    exported = [o for node in seg for o in node.output if o and last.get(o, -1) >= end]
    tag = f"vlsens_seg{s}"
    rename = {t: f"{t}__{tag}" for t in exported}
    else_nodes = []
    for node in seg:
        rename_reads(node, rename)
        for i, o in enumerate(node.output):
            if o in rename:
                node.output[i] = rename[o]
        else_nodes.append(node)
    then_nodes = []
    for t in exported:
        ci = cache_input(t)
        cache_inputs.append(ci)
        then_nodes.append(helper.make_node("Identity", [ci], [f"{t}__{tag}_cached"], name=f"{tag}_cached_{t}"))
        g.input.append(_typed(ci, _elem_of(t, elem_types)))
        dims = [0]
        g.initializer.append(helper.make_tensor(ci, _elem_of(t, elem_types), dims, []))
    then_g = helper.make_graph(then_nodes, f"{tag}_cached", [],
                               [_typed(f"{t}__{tag}_cached", _elem_of(t, elem_types)) for t in exported])
    else_g = helper.make_graph(else_nodes, f"{tag}_compute", [],
                               [_typed(rename[t], _elem_of(t, elem_types)) for t in exported], initializer=own)
    idx = f"{tag}_index"
    g.initializer.append(helper.make_tensor(idx, TensorProto.INT64, [], [s]))
    return [helper.make_node("Gather", [SKIP_INPUT, idx], [f"{tag}_cond"], name=f"{tag}_Gather", axis=0),
            helper.make_node("If", [f"{tag}_cond"], exported, name=f"{tag}_If", then_branch=then_g,
                             else_branch=else_g)]


def segment_model(model, sp: SuffixPlan, elem_types: dict[str, int]):
    """The switch model with the nodes before the last cut wrapped in ``If(skip[s])`` (in place);
    returns the names of the cache inputs added."""
    from onnx import TensorProto, helper

    g = model.graph
    nodes = list(g.node)
    bounds = ([0] if sp.cuts[0] > 0 else []) + list(sp.cuts)
    spans = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    assert len(spans) == sp.segments, (spans, sp.segments)
    _, last = lifetimes(model)
    cache_inputs = []
    inits = {i.name: i for i in g.initializer}
    own = _owned_initializers(g, nodes, spans, bounds)
    moved = {n for names in own.values() for n in names}
    kept_inits = [i for i in g.initializer if i.name not in moved]
    new_nodes = []
    for s, (a, b) in enumerate(spans):
        new_nodes.extend(_wrap_segment(g, nodes[a:b], s, b, last, [inits[n] for n in own[s]], elem_types,
                                       cache_inputs))
    new_nodes.extend(nodes[bounds[-1]:] if spans else nodes)
    del g.node[:]
    g.node.extend(new_nodes)
    if moved:
        keep_new = [i for i in g.initializer if i.name not in inits]  # added above (indices, cache defaults)
        del g.initializer[:]
        g.initializer.extend(kept_inits + keep_new)
    # Always present (one element when nothing can be skipped), so every engine feeds it alike.
    g.input.append(helper.make_tensor_value_info(SKIP_INPUT, TensorProto.BOOL, [max(sp.segments, 1)]))
    return cache_inputs


def add_probe_outputs(model, sp: SuffixPlan, elem_types: dict[str, int]) -> None:
    """Every cut's live tensors as extra graph outputs (in place)."""
    from onnx import helper

    have = {o.name for o in model.graph.output}
    for t in sorted({t for live in sp.live for t in live}):
        if t not in have:
            elem = elem_types.get(t, elem_types.get(t.removesuffix("__raw")))
            model.graph.output.append(helper.make_tensor_value_info(t, elem, None))


def build(switch_model: str | Path, probe_model: str | Path, switches, max_cuts: int) -> SuffixPlan:
    """Rewrite ``switch_model`` as the segmented model (in place, weights untouched) and write its
    probe beside it (same weights file). Returns the plan (for the engine's metadata)."""
    import onnx

    from vlsens.core.fsutil import atomic_file
    from vlsens.core.onnxutil import check_compact

    switch_model, probe_model = Path(switch_model), Path(probe_model)
    elem = element_types(switch_model)
    model = onnx.load(str(switch_model), load_external_data=False)
    sp = plan(model, switches, max_cuts)
    segment_model(model, sp, elem)
    with atomic_file(switch_model) as tmp:
        onnx.save_model(model, str(tmp))
    check_compact(switch_model)
    add_probe_outputs(model, sp, elem)
    with atomic_file(probe_model) as tmp:
        onnx.save_model(model, str(tmp))
    log.info("suffix engine: %d cut(s) over %d op(s), %d wrapped segment(s); live tensors per cut: %s",
             len(sp.cuts), len(switches.ops), sp.segments, [len(x) for x in sp.live])
    return sp


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

class SuffixCache:
    """Float values of every cut's live tensors, per evaluation input, on disk (memory-mapped)."""

    def __init__(self, sp: SuffixPlan, folder: Path, names: Sequence[str], count: int):
        self.plan, self.dir, self.count = sp, Path(folder), count
        self._file = {t: f"{j:05d}.npy" for j, t in enumerate(names)}

    @classmethod
    def fill(cls, probe_model: str | Path, sp: SuffixPlan, feeds: list[dict], folder: str | Path,
             mask_input: str | Sequence[str], mask_size: int, threads: int = 0, mask_dtype=bool,
             basic: bool = True) -> "SuffixCache":
        """One float pass of the probe per input (the switch input, or each of several, all zeros,
        of ``mask_dtype``;
        ``basic``: the engine session's optimization level, so the cached values are the ones the
        full switch model computes); live tensor j of input i saved as ``<i>/<j>.npy``."""
        from vlsens.core.onnxutil import make_session

        folder = Path(folder)
        names = sorted({t for live in sp.live for t in live})
        sess = make_session(probe_model, threads=threads, basic=basic)
        masks = [mask_input] if isinstance(mask_input, str) else list(mask_input)
        base = {**{name: np.zeros(mask_size, dtype=mask_dtype) for name in masks},
                SKIP_INPUT: np.zeros(max(sp.segments, 1), dtype=bool)}
        for i, feed in enumerate(feeds):
            vals = sess.run(names, {**feed, **base})
            d = folder / str(i)
            d.mkdir(parents=True, exist_ok=True)
            for j, (_name, v) in enumerate(zip(names, vals)):
                np.save(d / f"{j:05d}.npy", v, allow_pickle=False)
            del vals
        del sess
        return cls(sp, folder, names, len(feeds))

    def feed(self, group: int, i: int) -> dict:
        """Extra inputs that start input ``i`` at cut ``group`` (memory-mapped, opened per call so
        that only the running cut's pages are mapped)."""
        skip = np.zeros(max(self.plan.segments, 1), dtype=bool)
        skip[: self.plan.skips[group]] = True
        out = {SKIP_INPUT: skip}
        if self.plan.skips[group]:
            for t in self.plan.live[group]:
                out[cache_input(t)] = np.load(self.dir / str(i) / self._file[t], mmap_mode="r", allow_pickle=False)
        return out
