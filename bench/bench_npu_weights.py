#!/usr/bin/env python
"""How much of an NPU profile's W8A16 floor is its INT8 weights, and what rounding them by GPTQ
would give back: on a run's fixed-size vision graph (``quant.target: npu``), every quantizable op's
weight on the grid the QDQ models use (per output channel, symmetric, ``2 max|w| / 255``, codes
-128..127), activations left float, measured against the float graph on the evaluation images
(cosine as the profile measures it), rounded to nearest and by GPTQ (the same per-channel scale,
fixed before the pass; the Hessian of each op's input over the calibration images; dampening 0.01;
lazy batches of 128 rows). Printed beside the engine's all-W8A16 and all-W8A8 models (``ort.json``)
and each op's output error on the calibration rows, GPTQ over round to nearest.

Nothing here changes what a profile builds: it measures whether the weights' rounding is where the
W8A16 ops of a profile come from.

    python bench/bench_npu_weights.py results/3b --graph vision/448x448 --variant fp32-smooth [--publish]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))


def as_kn(node, w: np.ndarray) -> np.ndarray:
    """The weight as K x N (inputs x output channels)."""
    if node.op_type == "Conv":
        return w.reshape(w.shape[0], -1).T
    if node.op_type == "Gemm" and next((a.i for a in node.attribute if a.name == "transB"), 0):
        return w.T
    return w


def from_kn(node, shape, wk: np.ndarray) -> np.ndarray:
    if node.op_type == "Conv":
        return np.ascontiguousarray(wk.T.reshape(shape), np.float32)
    if node.op_type == "Gemm" and next((a.i for a in node.attribute if a.name == "transB"), 0):
        return np.ascontiguousarray(wk.T, np.float32)
    return np.ascontiguousarray(wk, np.float32)


def scale_of(w: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(w).max(0), 1e-30) * 2 / 255


def rtn(w: np.ndarray) -> np.ndarray:
    s = scale_of(w)
    return np.clip(np.round(w / s), -128, 127) * s


def gptq(w: np.ndarray, h: np.ndarray, damp: float = 0.01) -> np.ndarray:
    """GPTQ of ``w`` (K x N, float64) on the per-channel grid of :func:`rtn` (scale fixed up front):
    the package's fixed-grid loop (:func:`vlsens.quantize.gptq.channel_codes`)."""
    from vlsens.quantize.gptq import channel_codes

    s = scale_of(w)
    return channel_codes(w, h, s, np.zeros_like(s), -128, 127, damp) * s


def output_error(d: np.ndarray, h: np.ndarray) -> float:
    """``sum ||X d||^2`` over the calibration rows, from their Hessian ``X^T X``."""
    return float(np.sum((h @ d) * d))


def hessians(model: Path, calib: Path, widths: dict[str, int]) -> dict[str, np.ndarray]:
    from vlsens.data.samples import Samples
    from vlsens.quantize.gptq import captured

    out: dict[str, np.ndarray] = {}
    for rows in captured(model, Samples.load(calib, model).feeds, sorted(widths), threads=2):
        for name, x in rows.items():
            x = x.reshape(-1, widths[name]).astype(np.float64)  # a Conv's patches: one row per patch
            out[name] = out[name] + x.T @ x if name in out else x.T @ x
    return out


def evaluate(model, weights: dict[str, np.ndarray], feeds, reference, work: Path) -> dict:
    """The float graph with ``weights`` in place of its own, against ``reference`` on ``feeds``."""
    import onnx
    from onnx import numpy_helper

    from vlsens.core.metrics import Metrics
    from vlsens.core.onnxutil import make_session

    m = onnx.load(str(model))
    for init in m.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    path = work / "model.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="model.onnx.data")
    del m
    sess = make_session(path, threads=2)
    total, per = Metrics(), []
    for feed, ref in zip(feeds, reference):
        out = sess.run(None, feed)[0]
        total.add(out, ref)
        per.append(Metrics().add(out, ref).result()["cosine"])
    del sess
    for f in work.iterdir():
        f.unlink()
    return {"cosine": total.result()["cosine"], "per_image": per}


def measure(results: Path, graph: str, variant: str) -> dict:
    import onnx
    import pandas as pd
    from onnx import numpy_helper

    from vlsens.core.onnxutil import make_session
    from vlsens.data.samples import Samples

    t0 = time.perf_counter()
    model = results / graph / variant / "model.onnx"
    names = set(pd.read_csv(results / "sensitivity" / graph / variant / "ort.csv")["op"])
    m = onnx.load(str(model))
    inits = {i.name: i for i in m.graph.initializer}
    nodes = [n for n in m.graph.node if n.name in names and len(n.input) > 1 and n.input[1] in inits]
    weights = {n.name: numpy_helper.to_array(inits[n.input[1]]) for n in nodes}
    del m, inits
    widths = {n.input[0]: as_kn(n, weights[n.name]).shape[0] for n in nodes}
    hess = hessians(model, results / "calib" / graph / "calib.npz", widths)
    t_h = time.perf_counter() - t0
    rounded: dict[str, dict[str, np.ndarray]] = {"rtn": {}, "gptq": {}}
    ratios = []
    for n in nodes:
        w = weights.pop(n.name)
        wk, h = as_kn(n, w).astype(np.float64), hess[n.input[0]]
        r, g = rtn(wk), gptq(wk, h)
        ratios.append(output_error(g - wk, h) / output_error(r - wk, h))
        rounded["rtn"][n.input[1]], rounded["gptq"][n.input[1]] = from_kn(n, w.shape, r), from_kn(n, w.shape, g)
    del hess
    t_q = time.perf_counter() - t0 - t_h
    ev = Samples.load(results / "calib" / graph / "eval.npz", model)
    feeds = list(ev.feeds)
    sess = make_session(model, threads=2)
    reference = [sess.run(None, f)[0] for f in feeds]
    del sess
    with tempfile.TemporaryDirectory(prefix="bench-npu-weights-", dir=results) as work:
        got = {k: evaluate(model, v, feeds, reference, Path(work)) for k, v in rounded.items()}
    ort = json.loads((results / "sensitivity" / graph / variant / "ort.json").read_text())
    return {"ops": len(nodes), "images": len(feeds), "ratios": ratios, "got": got, "ort": ort,
            "seconds": {"hessians": t_h, "rounding": t_q, "total": time.perf_counter() - t0}}


def _whole(ort: dict, wide: bool) -> float | None:
    """The engine's all-op model's cosine (``ort.json``: ``all_int8``, or ``wide.all_a16``)."""
    node = (ort.get("wide") or {}).get("all_a16") if wide else ort.get("all_int8")
    val = (node or {}).get("cosine")
    return None if val is None else float(val)


def report(results: Path, graph: str, variant: str, r: dict) -> None:
    g = r["ratios"]
    geo = math.exp(sum(math.log(x) for x in g) / len(g))
    print(f"{results} {graph} {variant}: {r['ops']} ops, {r['images']} evaluation images; cosine against the float "
          f"graph, 1 - cosine the cost (the profile's target 0.999 allows 0.001)")
    print()
    print("| model | cosine | 1 - cosine | per image |")
    print("| --- | ---: | ---: | --- |")
    for name, val in (("every op W8A8 (the engine, ort.json)", _whole(r["ort"], False)),
                      ("every op W8A16 (the engine, ort.json)", _whole(r["ort"], True))):
        if val is not None:
            print(f"| {name} | {val:.5f} | {1 - val:.5f} | |")
    for key, name in (("rtn", "every weight INT8 by round to nearest, activations float"),
                      ("gptq", "every weight INT8 by GPTQ, activations float")):
        c = r["got"][key]
        print(f"| {name} | {c['cosine']:.5f} | {1 - c['cosine']:.5f} | "
              f"{', '.join(f'{x:.5f}' for x in c['per_image'])} |")
    print()
    print(f"Per op, output error on the calibration rows, GPTQ over round to nearest: geometric mean {geo:.3f} "
          f"(min {min(g):.3f}, median {float(np.median(g)):.3f}, max {max(g):.3f}; {sum(x < 1 for x in g)} of "
          f"{len(g)} lower).")
    s = r["seconds"]
    print(f"Time: Hessians {s['hessians']:.0f} s, rounding {s['rounding']:.0f} s, in all {s['total']:.0f} s.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--graph", default="vision/448x448")
    ap.add_argument("--variant", default="fp32-smooth")
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    from _publish import published

    r = measure(args.results, args.graph, args.variant)
    with published(f"npu-weights-{args.results.name}", "The INT8 weights' share of an NPU profile's W8A16 floor",
                   results=args.results):
        report(args.results, args.graph, args.variant, r)


if __name__ == "__main__":
    main()
