"""SmoothQuant-style outlier migration on an FP32 graph: the ``fp32-smooth`` variant.

An activation channel with a large range costs every 8-bit op that reads it (its per-tensor
scale grows with the range). Where the graph allows, the range moves into the weights, exactly:
for a channel ``c`` with factor ``s_c``, the activation is divided by ``s_c`` where it is made and
the reading op's weight row for ``c`` multiplied by it (Xiao et al., SmoothQuant, 2023). Two
places in a graph allow it without new nodes (found on the graph, any tower):

* **norm -> linears**: ``Mul(x, g)`` with ``g`` a per-channel weight (an RMSNorm / LayerNorm's
  scale), read only by Gemm / MatMul ops with weights: ``g_c /= s_c``, every reader's input row
  ``c`` times ``s_c``;
* **linear -> (x) -> linear**: ``Mul(a, u)`` with ``u`` a Gemm / MatMul output read by nothing
  else (the gated MLP's up projection), read only by one Gemm / MatMul (the down projection):
  ``u``'s output column ``c`` (and bias) ``/= s_c``, the reader's input row ``c`` times ``s_c``.

``s_c = max|X_c|^alpha / max|W_c|^(1 - alpha)`` (``max|W_c|`` over every reader's row ``c``), one
``alpha`` **per block, chosen by measurement**: the block (its nodes, from the exporter's
``blocks.<i>`` names) is cut out of the graph as a model of its own, fed its inputs as the float
graph computes them on the first :data:`MEASURE_FEEDS` calibration inputs; its sites' readers are
quantized as the target quantizes them (ORT's QDQ with the target's settings, 8-bit activations,
calibrated on those inputs), and the block's output (the residual stream that the rest of the
graph reads) is compared with the float graph's, for every ``alpha`` in :data:`ALPHAS` and for no
migration. The smallest relative error wins; no migration when nothing beats it, so a block
without outlier channels stays as it is. (The readers' own output error, measured per site, is
not enough: it chose the strongest migration at every site of a tower without outliers and made
the tower worse.) The variant is gated against transformers at FP32's tolerance like every variant
(the migration is function-preserving up to float rounding).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: Migration strengths tried at each site (0.5: SmoothQuant's default).
ALPHAS = (0.25, 0.4, 0.5, 0.6, 0.75, 0.9)
#: Calibration inputs the blocks are measured on (their inputs and outputs are held in memory).
MEASURE_FEEDS = 8
EPS = 1e-8


@dataclass
class Reader:
    """A Gemm / MatMul reading a site's tensor: its node, weight initializer and layout."""

    node: object
    weight: str
    #: the weight's input-channel axis (Gemm with transB: 1; MatMul / Gemm without: 0)
    axis: int


@dataclass
class Site:
    """One place where a tensor's channels can be migrated."""

    tensor: str
    kind: str  # "norm" or "linear"
    readers: list[Reader]
    #: norm: the scale initializer; linear: the producing linear's weight and bias (may be "")
    source: str
    source_axis: int = 0
    bias: str = ""
    stats: dict = field(default_factory=dict)


def _reader(node, inits: dict) -> Reader | None:
    if node.op_type not in ("Gemm", "MatMul") or len(node.input) < 2 or node.input[1] not in inits:
        return None
    if node.op_type == "Gemm":
        attrs = {a.name: a.i for a in node.attribute}
        if attrs.get("transA", 0):
            return None
        return Reader(node, node.input[1], 1 if attrs.get("transB", 0) else 0)
    return Reader(node, node.input[1], 0) if len(inits[node.input[1]].dims) == 2 else None


def find_sites(model) -> list[Site]:
    """The migratable sites of ``model`` (untied: every weight an initializer of its own)."""
    from vlsens.core.onnxgraph import consumers, producers

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    readers_of, producer = consumers(g.node), producers(g.node)
    sites = []
    for node in g.node:
        if node.op_type != "Mul" or len(node.output) != 1:
            continue
        out = node.output[0]
        readers = [_reader(r, inits) for r in readers_of.get(out, [])]
        if not readers or any(r is None for r in readers) or any(o.name == out for o in g.output):
            continue
        scale = [x for x in node.input if x in inits and len(inits[x].dims) == 1]
        if len(scale) == 1 and len([x for x in node.input if x not in inits]) == 1:
            sites.append(Site(out, "norm", readers, scale[0]))
            continue
        if len(readers) != 1:
            continue
        for x in node.input:
            p = producer.get(x)
            src = _reader(p, inits) if p is not None else None
            if src is None or len(readers_of.get(x, [])) != 1:
                continue
            bias = p.input[2] if p.op_type == "Gemm" and len(p.input) > 2 and p.input[2] in inits else ""
            # the producer's output channels: rows of a transB weight, columns of a MatMul weight
            sites.append(Site(out, "linear", readers, src.weight, 0 if src.axis == 1 else 1, bias))
            break
    return sites


def factors(site: Site, weights: list[tuple[np.ndarray, int]], alpha: float, feeds: list[int] | None = None) -> np.ndarray:
    """``s_c = max|X_c|^alpha / max|W_c|^(1 - alpha)`` for ``site`` (1 where a channel is all zero);
    ``max|X_c|`` over every calibration input, or over the captured ``feeds`` only."""
    absmax = site.stats["absmax"] if feeds is None else np.max([site.stats["feed_absmax"][i] for i in feeds], axis=0)
    wmax = np.max([np.max(np.abs(w), axis=1 - axis) for w, axis in weights], axis=0)
    s = np.power(np.maximum(absmax, EPS), alpha) / np.power(np.maximum(wmax, EPS), 1 - alpha)
    return np.where((absmax > 0) & (wmax > 0), s, 1.0).astype(np.float32)


def migrate(site: Site, s: np.ndarray, get) -> dict[str, np.ndarray]:
    """The site's initializers with its channels migrated by ``s`` (``get``: name -> float array)."""
    out = {}
    for r in site.readers:
        out[r.weight] = get(r.weight) * (s[None, :] if r.axis == 1 else s[:, None])
    if site.kind == "norm":
        out[site.source] = get(site.source) / s
    else:
        w = get(site.source)
        out[site.source] = w / (s[:, None] if site.source_axis == 0 else s[None, :])
        if site.bias:
            out[site.bias] = get(site.bias) / s
    return out


@dataclass
class Block:
    """The sites of one block and the nodes that hold them (a range of the graph's node order)."""

    key: int | None
    sites: list[Site]
    start: int
    end: int
    #: tensors the range reads that are made before it (graph inputs or node outputs)
    inputs: list[str] = field(default_factory=list)
    #: tensors the range makes that are read after it (the block's output: the residual stream)
    outputs: list[str] = field(default_factory=list)

    @property
    def readers(self) -> list[str]:
        return [r.node.name for s in self.sites for r in s.readers]


def blocks_of(model, sites: list[Site]) -> list[Block]:
    """``sites`` grouped by the block their readers' node names give (``parse_op_name``: the
    exporter's ``blocks.<i>``; sites outside any block form one group), each with the node range
    from the block's first node to its last."""
    from vlsens.core.onnxgraph import node_reads
    from vlsens.quantize.qdq import parse_op_name

    nodes = model.graph.node
    index = {n.name: i for i, n in enumerate(nodes)}
    key_of = [parse_op_name(n.name, n.op_type)[0] for n in nodes]
    produced = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    last_read = {x: i for i, n in enumerate(nodes) for x in node_reads(n)}
    last_read.update({o.name: len(nodes) for o in model.graph.output})
    inits = {i.name for i in model.graph.initializer}
    groups: dict = {}
    for s in sites:
        groups.setdefault(parse_op_name(s.readers[0].node.name, s.readers[0].node.op_type)[0], []).append(s)
    out = []
    for key, group in groups.items():
        idx = [produced[s.tensor] for s in group] + [index[r.node.name] for s in group for r in s.readers]
        if key is not None:
            idx += [i for i, k in enumerate(key_of) if k == key]
        start, end = min(idx), max(idx) + 1
        reads = set().union(*(node_reads(n) for n in nodes[start:end]))
        written = {o for n in nodes[start:end] for o in n.output if o}
        later = {o for o in written if last_read.get(o, -1) >= end}
        out.append(Block(key, group, start, end, sorted(reads - written - inits), sorted(later)))
    return out


def collect(model_path: str | Path, sites: list[Site], blocks: list[Block], feeds: list[dict],
            threads: int = 0) -> list[dict[str, np.ndarray]]:
    """Each site's statistics over the calibration ``feeds`` (``site.stats``: per-channel min, max
    and |max|, the tensor's min and max) and, for the first :data:`MEASURE_FEEDS` feeds, every
    block's inputs and outputs (returned: one dict per feed)."""
    import onnx
    from onnx import helper

    from vlsens.core.onnxgraph import element_types
    from vlsens.core.onnxutil import make_session, save_with_external_data

    types = element_types(model_path)
    model = onnx.load(str(model_path), load_external_data=True)
    given = {i.name for i in model.graph.input}
    kept = sorted({t for b in blocks for t in b.inputs + b.outputs} - given)
    names = [s.tensor for s in sites] + kept
    have = {o.name for o in model.graph.output}
    for t in dict.fromkeys(names):
        if t not in have:
            model.graph.output.append(helper.make_tensor_value_info(t, types.get(t, onnx.TensorProto.FLOAT), None))
    probe = Path(model_path).with_name(".smooth-probe.onnx")
    save_with_external_data(model, probe)
    del model
    captured = []
    try:
        sess = make_session(probe, threads=threads, lean=True)
        for k, feed in enumerate(feeds):
            values = sess.run(names, feed)
            for s, v in zip(sites, values):
                v = np.asarray(v, dtype=np.float32).reshape(-1, v.shape[-1])
                lo, hi, st = v.min(axis=0), v.max(axis=0), s.stats
                st["cmin"] = np.minimum(st["cmin"], lo) if "cmin" in st else lo
                st["cmax"] = np.maximum(st["cmax"], hi) if "cmax" in st else hi
                if k < MEASURE_FEEDS:
                    st.setdefault("feed_absmax", []).append(np.maximum(np.abs(lo), np.abs(hi)))
            if k < MEASURE_FEEDS:
                captured.append({**{t: feed[t] for t in feed}, **dict(zip(kept, values[len(sites):]))})
        del sess
    finally:
        for p in (probe, probe.with_name(probe.name + ".data")):
            p.unlink(missing_ok=True)
    for s in sites:
        s.stats["min"], s.stats["max"] = float(s.stats["cmin"].min()), float(s.stats["cmax"].max())
        s.stats["absmax"] = np.maximum(np.abs(s.stats["cmin"]), np.abs(s.stats["cmax"]))
    return captured


def block_model(model, block: Block, arrays: dict[str, np.ndarray], captured: dict[str, np.ndarray]):
    """The block's nodes as a model of their own: its inputs and outputs typed as ``captured``
    holds them, its initializers from ``model`` with ``arrays`` replacing theirs."""
    from onnx import helper, numpy_helper

    from vlsens.core.onnxgraph import node_reads

    nodes = model.graph.node[block.start:block.end]
    reads = set().union(*(node_reads(n) for n in nodes))
    inits = [numpy_helper.from_array(arrays[i.name].astype(np.float32), i.name) if i.name in arrays else i
             for i in model.graph.initializer if i.name in reads]

    def typed(t):
        return helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(captured[t].dtype), None)

    graph = helper.make_graph(nodes, "block", [typed(t) for t in block.inputs], [typed(t) for t in block.outputs], inits)
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


def folds(n: int) -> list[tuple[list[int], list[int]]]:
    """Two-fold cross-validation over ``n`` inputs: (calibrate on, measure on), even and odd
    positions each way; with one input, that input both ways."""
    even, odd = list(range(0, n, 2)), list(range(1, n, 2))
    return [(even, odd), (odd, even)] if odd else [(even, even)]


def block_error(model, block: Block, arrays_for, captured: list[dict], settings, scratch: Path,
                threads: int = 0) -> float:
    """Relative squared error of the block's outputs with its sites' readers quantized as
    ``settings`` quantize them (ORT's QDQ), against the float graph's outputs: the factors
    (``arrays_for(inputs)``: the block's migrated initializers, from those inputs' ranges) and the
    quantizer's ranges taken from half of the captured inputs, measured on the other half, both
    ways (:func:`folds`), so that a strength which only fits the inputs it was fitted on does not
    win."""
    from vlsens.core.onnxutil import make_session, save_with_external_data
    from vlsens.data.samples import FeedReader, Samples
    from vlsens.quantize.qdq import quantize

    src, q, cache = scratch / "block.onnx", scratch / "block.q.onnx", scratch / "block.cache.json"
    feeds = [{t: c[t] for t in block.inputs} for c in captured]
    num = den = 0.0
    for fit, held in folds(len(feeds)):
        save_with_external_data(block_model(model, block, arrays_for(fit), captured[0]), src)
        cache.unlink(missing_ok=True)
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # ORT's quantizer advises pre-processing at every call
        try:
            quantize(src, q, block.readers, settings, cache, FeedReader(Samples([feeds[i] for i in fit])))
        finally:
            root.setLevel(level)
        sess = make_session(q, threads=threads, basic=True)
        for i in held:
            for t, y in zip(block.outputs, sess.run(block.outputs, feeds[i])):
                ref = captured[i][t]
                if np.issubdtype(ref.dtype, np.floating):
                    num += float(np.sum((np.asarray(y, np.float64) - ref) ** 2))
                    den += float(np.sum(np.asarray(ref, np.float64) ** 2))
        del sess
    return num / den if den else 0.0


def choose(model, block: Block, get, captured: list[dict], settings, scratch: Path, threads: int = 0) -> dict:
    """The measured strength of one block: every alpha of :data:`ALPHAS` and no migration, each
    judged by :func:`block_error`; the smallest wins, no migration on a tie. Returns ``{"alpha",
    "error", "error_without", "errors", "arrays"}`` (``arrays``: the chosen initializers)."""
    weights = {id(s): [(get(r.weight), r.axis) for r in s.readers] for s in block.sites}

    def migrated(alpha, feeds=None):
        arrays: dict[str, np.ndarray] = {}
        for s in block.sites:
            arrays.update(migrate(s, factors(s, weights[id(s)], alpha, feeds), lambda n: arrays.get(n, get(n))))
        return arrays

    best = {"alpha": None, "arrays": {}, "errors": {}}
    best["error"] = best["error_without"] = block_error(model, block, lambda fit: {}, captured, settings, scratch,
                                                        threads)
    best["errors"]["none"] = best["error"]
    for a in ALPHAS:
        e = block_error(model, block, lambda fit, a=a: migrated(a, fit), captured, settings, scratch, threads)
        best["errors"][str(a)] = e
        if e < best["error"]:
            best.update(alpha=a, error=e)
    if best["alpha"] is not None:
        best["arrays"] = migrated(best["alpha"])
    return best


def _load_untied(src_model: str | Path, untied: Path):
    """``src_model`` with shared weights untied and every node named, saved as ``untied`` and
    loaded back with its weights."""
    import onnx

    from vlsens.quantize.qdq import prepare_float_model

    return onnx.load(str(prepare_float_model(src_model, untied)), load_external_data=True)


def _set(inits: dict, arrays: dict[str, np.ndarray]) -> None:
    from onnx import numpy_helper

    for name, a in arrays.items():
        inits[name].CopyFrom(numpy_helper.from_array(a.astype(np.float32), name))


def smooth_model(src_model: str | Path, calib_npz: str | Path, staged_model: Path, settings, threads: int = 0) -> dict:
    """The migrated graph of ``src_model`` into ``staged_model``, each block at the strength that
    measures best at its output (:func:`choose`; ``settings``: the target's
    :class:`~vlsens.quantize.qdq.QuantSettings`, 8-bit activations; weights rounded to nearest
    whatever ``weight_rounding`` says: GPTQ codes are fitted by the engine, on the graph this
    variant produces). Returns the record's facts: every block with its measurements."""
    import dataclasses
    import tempfile

    from onnx import numpy_helper

    from vlsens.core.onnxutil import save_with_external_data
    from vlsens.data.samples import Samples

    staged_model = Path(staged_model)
    settings = dataclasses.replace(settings, weight_rounding="rtn")
    untied = staged_model.with_name(".smooth-untied.onnx")
    try:
        model = _load_untied(src_model, untied)
        sites = find_sites(model)
        blocks = blocks_of(model, sites)
        feeds = Samples.load(calib_npz, untied).feeds
        captured = collect(untied, sites, blocks, feeds, threads) if sites else []
    finally:
        for p in (untied, untied.with_name(untied.name + ".data")):
            p.unlink(missing_ok=True)
    inits = {i.name: i for i in model.graph.initializer}
    original: dict[str, np.ndarray] = {}

    def get(name):
        if name not in original:
            original[name] = numpy_helper.to_array(inits[name]).astype(np.float32)
        return original[name]

    facts = []
    with tempfile.TemporaryDirectory(prefix=".smooth-", dir=staged_model.parent) as scratch:
        for b in blocks:
            pick = choose(model, b, get, captured, settings, Path(scratch), threads)
            _set(inits, pick.pop("arrays"))
            facts.append({"block": b.key, "sites": [s.tensor for s in b.sites], "readers": b.readers, **pick})
    save_with_external_data(model, staged_model)
    return _summary(facts, len(sites), len(captured))


def _summary(facts: list[dict], sites: int, feeds: int) -> dict:
    migrated = [f for f in facts if f["alpha"] is not None]
    log.info("smooth: %d site(s) in %d block(s), %d block(s) migrated", sites, len(facts), len(migrated))
    return {"method": "SmoothQuant-style migration, strength per block by the block's output error at 8 bits "
                      "(the target's settings), two-fold over the calibration inputs",
            "alphas": list(ALPHAS), "measure_feeds": feeds, "blocks": facts, "sites": sites,
            "migrated": len(migrated), "sites_migrated": sum(len(f["sites"]) for f in migrated),
            "readers_migrated": sum(len(f["readers"]) for f in migrated)}
