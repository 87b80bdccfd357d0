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

``s_c = max|X_c|^alpha / max|W_c|^(1 - alpha)`` (``max|W_c|`` over every reader's row ``c``), with
``alpha`` chosen **per site by measurement**: on the calibration set's activations of the site
(a row sample; the channel maxima over every row), each reader's output with the input quantized
per tensor to uint8 (min-max) and the weights per output channel to int8 is compared with the
float output, for every ``alpha`` in :data:`ALPHAS` and for no migration; the smallest relative
error wins (no migration when nothing beats it). The variant is gated against transformers at
FP32's tolerance like every variant (the migration is function-preserving up to float rounding).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: Migration strengths tried at each site (0.5: SmoothQuant's default).
ALPHAS = (0.25, 0.4, 0.5, 0.6, 0.75, 0.9)
#: Rows of each site's activations kept for the measurement (over all calibration inputs).
SAMPLE_ROWS = 1024
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


def _fake_quant_input(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0 or 1.0
    zero = np.round(-lo / scale)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def _fake_quant_weight(w: np.ndarray, in_axis: int) -> np.ndarray:
    """Symmetric int8 per output channel (the maximum over the input axis), as ORT's per-channel."""
    m = np.max(np.abs(w), axis=in_axis, keepdims=True)
    scale = np.where(m > 0, m / 127.0, 1.0)
    return np.clip(np.round(w / scale), -127, 127) * scale


def _error(x: np.ndarray, lo: float, hi: float, weights: list[tuple[np.ndarray, int]], s: np.ndarray) -> float:
    """Relative error of the readers' outputs with ``x / s`` quantized per tensor (its range
    ``lo``..``hi`` divided the same way) and each weight times ``s`` per output channel."""
    xs = x / s
    xq = _fake_quant_input(xs, lo, hi)
    num = den = 0.0
    for w, axis in weights:
        ws = w * (s[None, :] if axis == 1 else s[:, None])
        wq = _fake_quant_weight(ws, axis)
        mat = (lambda a: a.T) if axis == 1 else (lambda a: a)
        y = x @ mat(w)
        num += float(np.sum((xq @ mat(wq) - y) ** 2))
        den += float(np.sum(y ** 2))
    return num / den if den else 0.0


def choose(site: Site, sample: np.ndarray, absmax: np.ndarray, weights: list[tuple[np.ndarray, int]]) -> dict:
    """The measured choice for one site: ``{"alpha": a or None, "error": e, "error_none": e0, "s": s}``."""
    wmax = np.max([np.max(np.abs(w), axis=1 - axis) for w, axis in weights], axis=0)
    ones = np.ones_like(absmax)
    lo, hi = site.stats["min"], site.stats["max"]
    best = {"alpha": None, "error": _error(sample, lo, hi, weights, ones), "s": ones}
    best["error_none"] = best["error"]
    for a in ALPHAS:
        s = np.power(np.maximum(absmax, EPS), a) / np.power(np.maximum(wmax, EPS), 1 - a)
        s = np.where((absmax > 0) & (wmax > 0), s, 1.0).astype(np.float32)
        # the tensor's calibration range after migration: bounded by the per-channel extremes
        lo_s = float(np.min(site.stats["cmin"] / s))
        hi_s = float(np.max(site.stats["cmax"] / s))
        e = _error(sample, lo_s, hi_s, weights, s)
        if e < best["error"]:
            best.update(alpha=a, error=e, s=s)
    return best


def collect(model_path: str | Path, sites: list[Site], feeds: list[dict], threads: int = 0) -> dict[str, np.ndarray]:
    """Each site's statistics over the calibration ``feeds`` (``site.stats``: per-channel min, max
    and |max|, the tensor's min and max) and a sample of its rows (returned by tensor)."""
    import onnx
    from onnx import helper

    from vlsens.core.onnxutil import make_session, save_with_external_data

    model = onnx.load(str(model_path), load_external_data=True)
    have = {o.name for o in model.graph.output}
    for s in sites:
        if s.tensor not in have:
            model.graph.output.append(helper.make_tensor_value_info(s.tensor, onnx.TensorProto.FLOAT, None))
    probe = Path(model_path).with_name(".smooth-probe.onnx")
    save_with_external_data(model, probe)
    del model
    per_feed = max(1, SAMPLE_ROWS // max(len(feeds), 1))
    samples: dict[str, list] = {s.tensor: [] for s in sites}
    try:
        sess = make_session(probe, threads=threads, lean=True)
        names = [s.tensor for s in sites]
        for feed in feeds:
            for s, v in zip(sites, sess.run(names, feed)):
                v = np.asarray(v, dtype=np.float32).reshape(-1, v.shape[-1])
                st = s.stats
                cmin, cmax = v.min(axis=0), v.max(axis=0)
                st["cmin"] = np.minimum(st["cmin"], cmin) if "cmin" in st else cmin
                st["cmax"] = np.maximum(st["cmax"], cmax) if "cmax" in st else cmax
                idx = np.linspace(0, len(v) - 1, min(per_feed, len(v))).round().astype(int)
                samples[s.tensor].append(v[idx])
        del sess
    finally:
        for p in (probe, probe.with_name(probe.name + ".data")):
            p.unlink(missing_ok=True)
    for s in sites:
        s.stats["min"], s.stats["max"] = float(s.stats["cmin"].min()), float(s.stats["cmax"].max())
        s.stats["absmax"] = np.maximum(np.abs(s.stats["cmin"]), np.abs(s.stats["cmax"]))
    return {t: np.concatenate(v) for t, v in samples.items()}


def smooth_model(src_model: str | Path, calib_feeds: list[dict], staged_model: Path, threads: int = 0) -> dict:
    """The migrated graph of ``src_model`` into ``staged_model``; returns the record's facts: every
    site with its readers, the chosen strength and the measured errors."""
    import onnx
    from onnx import numpy_helper

    from vlsens.core.onnxutil import save_with_external_data, untie_identity_initializers

    model = onnx.load(str(src_model), load_external_data=True)
    untie_identity_initializers(model)
    untied = Path(staged_model).with_name(".smooth-untied.onnx")
    save_with_external_data(model, untied)
    try:
        sites = find_sites(model)
        samples = collect(untied, sites, calib_feeds, threads) if sites else {}
        stats = {x.tensor: x.stats for x in sites}
        model = onnx.load(str(untied), load_external_data=True)  # saving made its weights refer to the file
        sites = find_sites(model)
        for x in sites:
            x.stats = stats[x.tensor]
    finally:
        for p in (untied, untied.with_name(untied.name + ".data")):
            p.unlink(missing_ok=True)
    inits = {i.name: i for i in model.graph.initializer}
    arr = {}

    def get(name):
        if name not in arr:
            arr[name] = numpy_helper.to_array(inits[name]).astype(np.float32)
        return arr[name]

    facts = []
    for site in sites:
        weights = [(get(r.weight), r.axis) for r in site.readers]
        c = choose(site, samples[site.tensor], site.stats["absmax"], weights)
        facts.append({"tensor": site.tensor, "kind": site.kind, "readers": [r.node.name for r in site.readers],
                      "alpha": c["alpha"], "error": c["error"], "error_without": c["error_none"],
                      "max_factor": float(np.max(c["s"])), "min_factor": float(np.min(c["s"]))})
        if c["alpha"] is None:
            continue
        s = c["s"]
        for r in site.readers:
            w = get(r.weight)
            arr[r.weight] = w * (s[None, :] if r.axis == 1 else s[:, None])
        if site.kind == "norm":
            arr[site.source] = get(site.source) / s
        else:
            w = get(site.source)
            arr[site.source] = w / (s[:, None] if site.source_axis == 0 else s[None, :])
            if site.bias:
                arr[site.bias] = get(site.bias) / s
    for name, a in arr.items():
        inits[name].CopyFrom(numpy_helper.from_array(a.astype(np.float32), name))
    save_with_external_data(model, staged_model)
    migrated = [f for f in facts if f["alpha"] is not None]
    log.info("smooth: %d site(s), %d migrated", len(facts), len(migrated))
    return {"method": "SmoothQuant-style migration, strength per site by measured 8-bit error",
            "alphas": list(ALPHAS), "sites": facts, "migrated": len(migrated),
            "readers_migrated": sum(len(f["readers"]) for f in migrated)}
