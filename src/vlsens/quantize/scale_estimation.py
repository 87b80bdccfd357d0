"""Scale estimation for ``MatMulNBits`` weights: a data-aware INT4 / INT8 weight-only algorithm per
MatMul that keeps round to nearest's rounding and chooses each block's scale by the MatMul's output.

NNCF's ``scale_estimation`` (``nncf.compress_weights(..., scale_estimation=True)``) moves each
group's scale away from the min / max one where that lowers the group's output error on calibration
activations: a few rounds of "the scale that fits these codes best", from the round-to-nearest
codes, then a grid of smaller scales (``1 - 0.05 k``, k = 0..9), each refitted the same way; the
best scale per group and output channel is kept. The same search here, with two differences that
follow from having the MatMul's Hessian ``H = X^T X`` over the calibration split (the one GPTQ
reads, :func:`vlsens.quantize.gptq.hessians`):

* the error of a block is exact, ``d^T H_b d`` with ``H_b`` the block's diagonal block of ``H``
  (NNCF: the mean squared output over a subset of 32 calibration rows);
* the scale that fits a block's codes ``t`` best is the least-squares one under that error,
  ``(t^T H_b w) / (t^T H_b t)`` (NNCF: an importance-weighted mean of ``|w| / |t|``).

The zero point is round to nearest's and stays (symmetric: ``2^(bits-1)``). The codes are rounded
with the float32 scale that is stored, and written by ONNX Runtime's ``MatMulNBits`` writer like every
other algorithm's (:func:`vlsens.quantize.gptq.node`), so the bytes are round to nearest's. The
round-to-nearest scale is the first candidate, so on the calibration rows a block's error is never
above its round-to-nearest error (test).
"""

from __future__ import annotations

import numpy as np

#: rounds of "the best scale for these codes" from round to nearest's codes (NNCF's ``initial_steps``)
INITIAL_STEPS = 5
#: scale factors tried, each refitted: ``1 - 0.05 k`` for k < SCALE_STEPS (NNCF's ``scale_steps``)
SCALE_STEPS = 10


def grid(w: np.ndarray, bits: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point per column of the block ``w`` (rows x N), by round to nearest's rule
    (``quant_tensor`` with unsigned codes): symmetric ``2 max|w| / (2^bits - 1)`` around
    ``2^(bits-1)``, asymmetric ``(max - min) / (2^bits - 1)`` with the zero point rounded and clipped.
    A block of zeros gets scale 1. The codes are rounded with the float64 scale and the float32 one
    is stored, as there."""
    maxq = (1 << bits) - 1
    lo, hi = w.min(axis=0), w.max(axis=0)
    scale = np.ones(w.shape[1])
    if symmetric:
        rng = np.maximum(np.abs(lo), np.abs(hi))
        scale[rng > 0] = rng[rng > 0] * 2.0 / maxq
        zero = np.full(w.shape[1], 1 << (bits - 1), dtype=np.float64)
    else:
        nz = lo != hi  # the range in float32, as quant_tensor takes it from a float32 weight
        scale[nz] = (hi.astype(np.float32) - lo.astype(np.float32)).astype(np.float64)[nz] / maxq
        zero = np.clip(np.round(-lo / scale), 0, maxq)
    return scale, zero


def _codes(w: np.ndarray, scale: np.ndarray, zero: np.ndarray, maxq: int) -> np.ndarray:
    return np.clip(np.round(w / scale) + zero, 0, maxq)


def _error(w: np.ndarray, h: np.ndarray, scale: np.ndarray, zero: np.ndarray, maxq: int) -> np.ndarray:
    """Per column, ``d^T H_b d`` for the block ``w`` (rows x N) at ``scale`` / ``zero``."""
    d = (_codes(w, scale, zero, maxq) - zero) * scale - w
    return np.sum((h @ d) * d, axis=0)


def _fit(w: np.ndarray, h: np.ndarray, t: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Per column, the scale that makes ``t`` (codes minus zero point) closest to ``w`` under ``h``."""
    num, den = np.sum(t * (h @ w), axis=0), np.sum(t * (h @ t), axis=0)
    ok = den > 0
    s = fallback.copy()
    s[ok] = num[ok] / den[ok]
    bad = ~(s > 0) | ~np.isfinite(s)
    s[bad] = fallback[bad]
    return s


def block_scale(w: np.ndarray, h: np.ndarray, bits: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """The scale (float32 values, float64 array) and zero point per column of the block ``w``
    (rows x N, float64) with Hessian block ``h`` (rows x rows): the search of the module docstring."""
    maxq = (1 << bits) - 1
    scale, zero = grid(w, bits, symmetric)
    best_s = scale.astype(np.float32).astype(np.float64)
    best_e = _error(w, h, best_s, zero, maxq)

    def offer(s):
        s = s.astype(np.float32).astype(np.float64)  # the scale as it is stored
        e = _error(w, h, s, zero, maxq)
        better = e < best_e
        best_s[better], best_e[better] = s[better], e[better]

    for _ in range(INITIAL_STEPS):
        offer(_fit(w, h, _codes(w, best_s, zero, maxq) - zero, best_s))
    for k in range(SCALE_STEPS):
        trial = (1.0 - 0.05 * k) * scale
        offer(_fit(w, h, _codes(w, trial, zero, maxq) - zero, trial))
    return best_s, zero


def codes(weight: np.ndarray, hessian: np.ndarray, bits: int, block_size: int,
          symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale estimation of ``weight`` (K x N) against ``hessian`` (K x K): the codes (N x k_blocks x
    block_size, uint8, padded rows included), the scales (N x k_blocks, float32) and the zero points
    (N x k_blocks, uint8), in ``MatMulNBits``' block order (:func:`vlsens.quantize.gptq.codes`')."""
    k, n = weight.shape
    blocks = -(-k // block_size)
    maxq = (1 << bits) - 1
    q = np.zeros((n, blocks, block_size), np.uint8)
    scales, zeros = np.zeros((n, blocks), np.float32), np.zeros((n, blocks), np.uint8)
    for b in range(blocks):
        r0, r1 = b * block_size, min((b + 1) * block_size, k)
        w = np.zeros((block_size, n), np.float64)
        w[:r1 - r0] = weight[r0:r1]
        h = np.zeros((block_size, block_size), np.float64)
        h[:r1 - r0, :r1 - r0] = hessian[r0:r1, r0:r1]
        s, z = block_scale(w, h, bits, symmetric)
        q[:, b, :] = _codes(w, s, z, maxq).T
        scales[:, b], zeros[:, b] = s, z
    return q, scales, zeros
