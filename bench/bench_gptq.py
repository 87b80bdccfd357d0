#!/usr/bin/env python
"""GPTQ per MatMul against round to nearest (and ONNX Runtime's vendored GPTQ) on a decoder's own
inputs: every weight MatMul's output error ``||X (W_q - W)||^2`` on samples GPTQ never saw, after
fitting on the others, and the time GPTQ takes per MatMul (its Hessian included). Prints a table.

    python bench/bench_gptq.py --model results/held-out/decoder/fp32/model.onnx \\
        --samples results/held-out/budget/decoder.npz --fit 12

``--samples``: a Samples npz of the model's inputs (the budget's decoder feeds: the measure's
cases); the first ``--fit`` samples are the calibration, the rest the held-out rows. Or
``--samples calib.npz --held eval.npz``: a run's calibration split and its evaluation split

    python bench/bench_gptq.py --model results/3b/decoder/fp32/model.onnx \
        --samples results/3b/calib/decoder/calib.npz --held results/3b/calib/decoder/eval.npz --no-ort
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _ort_gptq(w, h, bits, block, symmetric):
    """ONNX Runtime's vendored GPTQ as its quantizer stores it: fake-quantized, then round to nearest again."""
    from onnxruntime.quantization.neural_compressor.weight_only import gptq as ort

    from vlsens.quantize import gptq

    q = ort(w.astype(np.float64).copy(), h.copy(), num_bits=bits, group_size=block, scheme="sym" if symmetric else "asym")
    return gptq.dequantized(*gptq.codes(q.astype(np.float32), None, bits, block, symmetric), w.shape[0])


def _k_quant(w, bits, block):
    """llama.cpp's k_quant as ONNX Runtime's quantizer writes it (asymmetric, zero points), dequantized."""
    from onnxruntime.quantization.neural_compressor.weight_only import pad_tensor, quant_tensor_k_quant_cuda

    k, n = w.shape
    blocks = -(-k // block)
    q, scale, zero = quant_tensor_k_quant_cuda(pad_tensor(w, block, blocks).T, bits, block)
    deq = (q - zero.astype(np.float64)) * scale.astype(np.float32).astype(np.float64)
    return deq.reshape(n, blocks * block)[:, :k].T.astype(np.float32)


def _deq(coded, c0: int, c1: int, k: int) -> np.ndarray:
    """Columns c0:c1 of the weight :func:`vlsens.quantize.gptq.codes` wrote."""
    from vlsens.quantize import gptq

    q, s, z = coded
    return gptq.dequantized(q[c0:c1], s[c0:c1], z[c0:c1], k)


def _scaled(coded, c0: int, c1: int, k: int) -> np.ndarray:
    """Columns c0:c1 of the weight an AWQ MatMul multiplies by: ``diag(1 / s)`` times its codes'."""
    return (coded[3].astype(np.float64)[:, None] * _deq(coded[:3], c0, c1, k)).astype(np.float32)


def _errors(xs, w: np.ndarray, quantized) -> list[float]:
    """``||x (W_q - W)||^2`` for each ``x`` of ``xs``, ``quantized(c0, c1)`` giving W_q's columns
    c0:c1: summed over column chunks (a 3B lm_head is 2048 x 151936)."""
    from vlsens.quantize.gptq import COLUMNS

    out = [0.0] * len(xs)
    for c0 in range(0, w.shape[1], COLUMNS):
        c1 = min(c0 + COLUMNS, w.shape[1])
        d = quantized(c0, c1) - w[:, c0:c1]
        for j, x in enumerate(xs):
            out[j] += float(np.sum((x @ d) ** 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--samples", required=True, type=Path)
    ap.add_argument("--fit", type=int, help="the first FIT samples calibrate, the rest are held out")
    ap.add_argument("--held", type=Path, help="held-out samples (then every one of --samples calibrates)")
    ap.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--asymmetric", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime's vendored GPTQ out (slow at real widths)")
    ap.add_argument("--publish", action="store_true", help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    import onnx

    from vlsens.core.onnxutil import tensor_array
    from vlsens.data.samples import Samples
    from vlsens.model.family import NODE_NAMES
    from vlsens.quantize import awq, gptq, scale_estimation
    from vlsens.quantize.nbits import weight_matmuls
    from vlsens.quantize.qdq import parse_op_name

    sym = not a.asymmetric
    ops = weight_matmuls(a.model)
    graph = onnx.load(str(a.model), load_external_data=False)
    reads = {n.name: n.input[0] for n in graph.graph.node if n.name in {o["name"] for o in ops}}
    head = {n.name for n in graph.graph.node if NODE_NAMES.logits in n.output}  # AWQ keeps it unscaled
    inits = {i.name: i for i in graph.graph.initializer}
    samples = Samples.load(a.samples, a.model)
    if a.held is not None:
        a.fit = samples.count
        samples = Samples(samples.feeds + Samples.load(a.held, a.model).feeds)
    elif a.fit is None or not 0 < a.fit < samples.count:
        sys.exit(f"--fit {a.fit}: between 1 and {samples.count - 1} (the samples: {samples.count}), or --held")
    t0 = time.perf_counter()
    rows = list(gptq.captured(a.model, samples.feeds, sorted(set(reads.values())), a.threads))
    fit = {t: np.concatenate([r[t] for r in rows[:a.fit]]) for t in set(reads.values())}
    held = {t: np.concatenate([r[t] for r in rows[a.fit:]]) for t in set(reads.values())}
    print(f"{a.model}: {len(ops)} weight MatMuls; {a.fit} samples fitted ({next(iter(fit.values())).shape[0]} rows), "
          f"{samples.count - a.fit} held out ({next(iter(held.values())).shape[0]} rows); inputs captured in "
          f"{time.perf_counter() - t0:.1f} s\n")
    cols = ["gptq / rtn", "scale_estimation / rtn", "gptq + scale estimation / rtn", "awq / rtn",
            "awq + scale estimation / rtn", "k_quant / rtn"]
    cols += [] if a.no_ort else ["ORT's gptq / rtn"]
    print(f"| op | K x N | bits | rtn error (held out) | {' | '.join(cols)} | gptq / rtn on the fitted rows | "
          "s GPTQ (Hessian + loop) |")
    print("| --- | --- | ---: | ---: |" + " ---: |" * len(cols) + " ---: | ---: |")
    ratios: dict[int, list[float]] = {b: [] for b in a.bits}
    versus_k: dict[int, list[float]] = {b: [] for b in a.bits}
    se_ratios: dict[int, list[float]] = {b: [] for b in a.bits}
    gse_ratios: dict[int, list[float]] = {b: [] for b in a.bits}
    awq_ratios: dict[str, dict[int, list[float]]] = {w: {b: [] for b in a.bits} for w in ("awq", "awq_se")}
    for o in ops:
        w = np.asarray(tensor_array(inits[o["weight"]], a.model.parent), np.float32)
        xf, xh = fit[reads[o["name"]]], held[reads[o["name"]]]
        block, role = parse_op_name(o["name"], "MatMul")
        t1 = time.perf_counter()
        xd = xf.astype(np.float64)
        h = xd.T @ xd
        del xd
        t_h = time.perf_counter() - t1
        for b in a.bits:
            t1 = time.perf_counter()
            g = gptq.codes(w, h, b, a.block, sym)
            sec = time.perf_counter() - t1 + t_h
            r = gptq.codes(w, None, b, a.block, sym)
            s = scale_estimation.codes(w, h, b, a.block, sym)
            gs = gptq.codes(w, h, b, a.block, sym, estimate_scales=True)
            mag = np.abs(xf).mean(axis=0)
            aw = {then: (awq.unscaled(w, h, b, a.block, sym, then) if o["name"] in head else
                         awq.codes(w, h, mag, b, a.block, sym, then)) for then in ("rtn", "se")}
            k, wb = o["K"], w
            ways = {"gptq": lambda c0, c1, g=g, k=k: _deq(g, c0, c1, k), "rtn": lambda c0, c1, r=r, k=k: _deq(r, c0, c1, k),
                    "k_quant": lambda c0, c1, b=b, wb=wb: _k_quant(wb[:, c0:c1], b, a.block),
                    "se": lambda c0, c1, s=s, k=k: _deq(s, c0, c1, k),
                    "gse": lambda c0, c1, gs=gs, k=k: _deq(gs, c0, c1, k),
                    "awq": lambda c0, c1, c=aw["rtn"], k=k: _scaled(c, c0, c1, k),
                    "awq_se": lambda c0, c1, c=aw["se"], k=k: _scaled(c, c0, c1, k)}
            if not a.no_ort:
                ways["ort"] = lambda c0, c1, b=b, wb=wb, h=h: _ort_gptq(wb[:, c0:c1], h, b, a.block, sym)
            e = {name: _errors((xh, xf), w, f) for name, f in ways.items()}
            e_r = e["rtn"][0]
            cells = [f"{e[x][0] / e_r:.3f}" for x in ("gptq", "se", "gse", "awq", "awq_se", "k_quant")]
            awq_ratios["awq"][b].append(e["awq"][0] / e_r)
            awq_ratios["awq_se"][b].append(e["awq_se"][0] / e["se"][0])
            gse_ratios[b].append(e["gse"][0] / e["gptq"][0])
            se_ratios[b].append(e["se"][0] / e_r)
            if not a.no_ort:
                cells.append(f"{e['ort'][0] / e_r:.3f}")
            ratios[b].append(e["gptq"][0] / e_r)
            versus_k[b].append(e["gptq"][0] / e["k_quant"][0])
            print(f"| {role}{'' if block is None else f' (block {block})'} | {o['K']} x {o['N']} | {b} | {e_r:.4g} | "
                  f"{' | '.join(cells)} | {e['gptq'][1] / e['rtn'][1]:.3f} | {sec:.2f} |", flush=True)
    print()
    for b, r in ratios.items():
        r = np.array(r)
        print(f"INT{b}: GPTQ / RTN output error on held-out rows, over {r.size} MatMuls: median {np.median(r):.3f}, "
              f"geometric mean {np.exp(np.log(r).mean()):.3f}, range {r.min():.3f} .. {r.max():.3f}; "
              f"{int((r < 1).sum())} of {r.size} lower")
        k = np.array(versus_k[b])
        print(f"INT{b}: GPTQ / k_quant: median {np.median(k):.3f}, geometric mean {np.exp(np.log(k).mean()):.3f}, "
              f"range {k.min():.3f} .. {k.max():.3f}; {int((k < 1).sum())} of {k.size} lower")
        se = np.array(se_ratios[b])
        print(f"INT{b}: scale estimation / RTN on held-out rows: median {np.median(se):.3f}, geometric mean "
              f"{np.exp(np.log(se).mean()):.3f}, range {se.min():.3f} .. {se.max():.3f}; {int((se < 1).sum())} of "
              f"{se.size} lower")
        gs = np.array(gse_ratios[b])
        print(f"INT{b}: GPTQ with estimated scales / GPTQ on held-out rows: median {np.median(gs):.3f}, geometric mean "
              f"{np.exp(np.log(gs).mean()):.3f}, range {gs.min():.3f} .. {gs.max():.3f}; {int((gs < 1).sum())} of "
              f"{gs.size} lower")
        for way, label in (("awq", "AWQ / RTN"), ("awq_se", "AWQ + scale estimation / scale estimation")):
            r = np.array(awq_ratios[way][b])
            print(f"INT{b}: {label} on held-out rows: median {np.median(r):.3f}, geometric mean "
                  f"{np.exp(np.log(r).mean()):.3f}, range {r.min():.3f} .. {r.max():.3f}; {int((r < 1).sum())} of "
                  f"{r.size} lower")
    import resource

    print(f"\nPeak resident memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB.")
    print(f"\nBlocks of {a.block}, {'symmetric' if sym else 'asymmetric'}; error: sum of squares of the MatMul's "
          "output change on the held-out samples' rows. ORT's gptq: onnxruntime.quantization's vendored GPTQ "
          "(neural_compressor.weight_only.gptq) on the same weight and Hessian, stored as its quantizer stores it "
          "(round to nearest of its fake-quantized weight). k_quant: llama.cpp's scale search as ONNX Runtime's "
          "quantizer writes it (asymmetric: zero points, 0.5 byte more a block of 32 than symmetric GPTQ and RTN). awq: "
          "input channels scaled by mean |x|^alpha (alpha searched on the fitted rows), round to nearest or scale "
          "estimation after (vlsens.quantize.awq; K more values per MatMul for its Mul; the head keeps s = 1).")


if __name__ == "__main__":
    from _publish import published

    name = Path(sys.argv[sys.argv.index("--model") + 1]).parts[1] if "--model" in sys.argv else "run"
    with published(f"gptq-{name}", "GPTQ per MatMul against round to nearest"):
        main()
