#!/usr/bin/env python
"""GPTQ of one Qwen2.5-VL-3B decoder layer at INT4 (and lm_head): the factor of each Hessian as it
was computed (the inverse, then its Cholesky factor, once per MatMul) against
:func:`vlsens.quantize.gptq.factor` (a Cholesky factorization of the reversed Hessian and a
triangular inverse, once per input, shared by the MatMuls that read it). Prints a table.

    python bench/bench_gptq_factor.py [--rows 1200] [--publish]

The layer's MatMuls at the 3b preset's widths (hidden 2048, intermediate 11008, 16 heads of 128,
2 key/value heads, vocabulary 151 936), random weights, and per distinct input a Hessian
``X^T X`` of ``--rows`` calibration rows (about what ``make scale-int4``'s 12 calibration prompts
give) of correlated channels: random, so rank-deficient where K exceeds the rows, as a real one
is at 11008, and dampened the same way. The row loop is the same code both ways; the codes are
compared element for element, and by their output error on the calibration rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

HIDDEN, INTER, HEAD, KV, VOCAB = 2048, 11008, 128, 2, 151936
#: distinct inputs of one layer: name, K, the MatMuls reading it (name, N)
LAYER = [("attention input", HIDDEN, [("q_proj", HIDDEN), ("k_proj", KV * HEAD), ("v_proj", KV * HEAD)]),
         ("attention output", HIDDEN, [("o_proj", HIDDEN)]),
         ("mlp input", HIDDEN, [("gate_proj", INTER), ("up_proj", INTER)]),
         ("mlp hidden", INTER, [("down_proj", HIDDEN)])]
HEAD_INPUT = ("final norm", HIDDEN, [("lm_head", VOCAB)])


def old_factor(hessian, k, kp, damp):
    """The factor as vlsens computed it before :func:`vlsens.quantize.gptq.factor`."""
    h = np.zeros((kp, kp), np.float64)
    h[:k, :k] = hessian
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h[np.diag_indices(kp)] += damp * np.mean(np.diag(h))
    return np.linalg.cholesky(np.linalg.inv(h)).T, dead


def hessian(k: int, rows: int, rng) -> tuple[np.ndarray, float]:
    """``X^T X`` in float64 of ``rows`` correlated rows (a shared low-rank part and noise) and its seconds."""
    x = rng.standard_normal((rows, k), dtype=np.float32)
    x += rng.standard_normal((rows, 64), dtype=np.float32) @ rng.standard_normal((64, k), dtype=np.float32) * 0.3
    t = time.perf_counter()
    h = x.astype(np.float64).T @ x.astype(np.float64)
    return h, time.perf_counter() - t


def output_error(w, h, coded, chunk: int = 16384) -> float:
    """``||X (W_q - W)||^2`` on the calibration rows, as ``sum(D * (H D))`` (``D = W_q - W``), in column chunks."""
    from vlsens.quantize import gptq

    q, s, z = coded
    total = 0.0
    for c0 in range(0, w.shape[1], chunk):
        c1 = min(c0 + chunk, w.shape[1])
        d = gptq.dequantized(q[c0:c1], s[c0:c1], z[c0:c1], w.shape[0]).astype(np.float64) - w[:, c0:c1]
        total += float(np.sum(d * (h @ d)))
    return total


def one_input(name, k, matmuls, rows, block, rng):
    from vlsens.quantize import gptq

    h, t_h = hessian(k, rows, rng)
    kp = -(-k // block) * block
    out = []
    t = time.perf_counter()
    shared = gptq.factor(h, k, kp)
    t_new_factor = time.perf_counter() - t
    for i, (op, n) in enumerate(matmuls):
        w = rng.standard_normal((k, n), dtype=np.float32) * 0.02
        t = time.perf_counter()
        old = old_factor(h, k, kp, gptq.DAMP)
        t_old_factor = time.perf_counter() - t
        t = time.perf_counter()
        a = gptq.codes(w, h, 4, block, True, factored=old)
        t_old_loop = time.perf_counter() - t
        t = time.perf_counter()
        b = gptq.codes(w, h, 4, block, True, factored=shared)
        t_new_loop = time.perf_counter() - t
        differ = int(np.count_nonzero(a[0] != b[0]))
        err_old, err_new = output_error(w, h, a), output_error(w, h, b)
        rel = float(np.abs(shared[0] - old[0]).max() / np.abs(old[0]).max())
        out.append({"input": name, "op": op, "K": k, "N": n, "hessian": t_h if i == 0 else 0.0,
                    "old": t_old_factor + t_old_loop, "new": (t_new_factor if i == 0 else 0.0) + t_new_loop,
                    "old_factor": t_old_factor, "new_factor": t_new_factor if i == 0 else 0.0,
                    "differ": differ, "codes": a[0].size, "rel": rel, "scales_equal": bool(np.array_equal(a[1], b[1])),
                    "error_ratio": err_new / err_old})
        del old, a, b, w
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1200, help="calibration rows of each Hessian")
    ap.add_argument("--block", type=int, default=128, help="quantization block (make scale-int4's: 128)")
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()

    from _publish import published

    rng = np.random.default_rng(0)
    with published("gptq-factor-3b", "GPTQ's factor once per input, by a triangular inverse, at Qwen2.5-VL-3B widths"):
        print(f"One decoder layer of the 3b preset and lm_head at INT4 (blocks of {args.block}, symmetric), "
              f"{args.rows} calibration rows per Hessian; seconds on this machine's cores. "
              "Old: per MatMul the inverse and its Cholesky factor, then the row loop; new: per input "
              "`gptq.factor`, then each MatMul's row loop.\n")
        rows = []
        for name, k, matmuls in [*LAYER, HEAD_INPUT]:
            rows += one_input(name, k, matmuls, args.rows, args.block, rng)
        print("| input | MatMul | K x N | X^T X s | old factor s | new factor s (once per input) | old s | new s "
              "| codes differing | factor max rel. diff | output error, new / old |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['input']} | {r['op']} | {r['K']} x {r['N']} | {r['hessian']:.2f} | {r['old_factor']:.2f} "
                  f"| {r['new_factor']:.2f} | {r['old']:.2f} | {r['new']:.2f} | {r['differ']} of {r['codes']} "
                  f"| {r['rel']:.1e} | {r['error_ratio']:.5f} |")
        ratios = [r["error_ratio"] for r in rows]
        print(f"\nThe factors agree to {max(r['rel'] for r in rows):.0e} relative, yet up to "
              f"{max(r['differ'] / r['codes'] for r in rows):.2%} of the codes differ: a code at a rounding tie "
              "that goes the other way moves a different error onto every later row, and the rows after it "
              "round accordingly. Both are GPTQ's codes: the output error on the calibration rows "
              f"(`||X (W_q - W)||^2`) of the new codes is {min(ratios):.5f}-{max(ratios):.5f}x the old ones'.")
        layer = [r for r in rows if r["op"] != "lm_head"]
        head = [r for r in rows if r["op"] == "lm_head"]

        def total(rs, key):
            return sum(r["hessian"] + r[key] for r in rs)

        lo, ln, ho, hn = total(layer, "old"), total(layer, "new"), total(head, "old"), total(head, "new")
        print(f"\nPer layer, X^T X included: old {lo:.1f} s, new {ln:.1f} s ({lo / ln:.2f}x); lm_head: old "
              f"{ho:.1f} s, new {hn:.1f} s. At 36 layers: old {(36 * lo + ho) / 60:.1f} min, new "
              f"{(36 * ln + hn) / 60:.1f} min.")


if __name__ == "__main__":
    main()
