"""AWQ for ``MatMulNBits`` weights: a data-aware INT4 / INT8 weight-only algorithm per MatMul that
scales the weight's input channels by the size of their activations before rounding.

AWQ (Lin et al., 2023) multiplies input channel ``i`` of the weight by ``s_i`` and its activation by
``1 / s_i`` (``y = (x / s) (s W)``, the same product in exact arithmetic), so channels that carry
large activations lose less to rounding. The scales are ``a^alpha`` with ``a`` the mean ``|x|`` per
channel over the calibration split, normalized by ``sqrt(max * min)``; ``alpha`` is searched on a
grid of :data:`GRID` values in ``[0, 1)`` for the lowest output error. Here, as in the other
data-aware algorithms (:mod:`vlsens.quantize.gptq`), the error is exact through the MatMul's Hessian
``H = X^T X`` over the calibration rows: ``tr(D^T H D)`` with ``D = W - diag(1 / s) deq(Q(s W))``
(llm-awq: the mean squared output of the whole block over its calibration tokens). ``alpha = 0``
is ``s = 1``, round to nearest itself, so on the rows it was fitted on AWQ is never above round to
nearest (test). The search reads at most :data:`SEARCH_COLUMNS` output columns (spread evenly;
columns do not interact); the codes then cover every column. Not done: llm-awq's weight clipping
search.

**One MatMul alone.** llm-awq and NNCF fold ``1 / s`` into the op before (a norm's weight, the
previous Linear), which ties the choice of every MatMul that reads that input (q, k and v read one
norm). Here the MatMul gets its own ``Mul`` by ``1 / s`` in front of its ``MatMulNBits`` (as NNCF's
ONNX backend inserts ``<node>/awq_mul`` where no fold applies), so a plan can give AWQ to one
MatMul and not its siblings: the graph gains one Mul of K activations and a K-element vector in the
activations' type per AWQ MatMul, counted in the op's bytes. ``Mul`` node ``<MatMul>_awq``, its
vector ``<MatMul>_awq_scale`` (:data:`SUFFIX`). The decoder's head keeps ``s = 1`` (no Mul): a
tied embedding gathers its quantized rows as they are.

``then``: the codes of ``s W`` by round to nearest (``awq``) or by scale estimation against the
scaled inputs' Hessian ``diag(1/s) H diag(1/s)`` (``awq_se``: AWQ + scale estimation, NNCF's
all-INT4 data-aware recipe)."""

from __future__ import annotations

import numpy as np

from vlsens.core.onnxgraph import AWQ_SUFFIX

#: the version of the codes: raised whenever :func:`codes` gives other codes (the store of a run's
#: codes keys AWQ's by it)
FORMAT = 1
#: values of alpha tried: k / GRID for k < GRID (llm-awq's ``n_grid``)
GRID = 20
#: output columns the alpha search reads at most
SEARCH_COLUMNS = 256
#: the Mul and its vector are named ``<MatMul><SUFFIX>`` and ``<MatMul><SUFFIX>_scale`` (the readers of
#: ``MatMulNBits`` graphs know it: :func:`vlsens.core.onnxgraph.input_scale`)
SUFFIX = AWQ_SUFFIX
#: smallest activation size a scale is taken from (llm-awq clamps the scales at 1e-4)
FLOOR = 1e-4


def _inverse(magnitude: np.ndarray, alpha: float, dtype) -> np.ndarray:
    """``1 / s`` in the type the graph stores it in (float64 array), ``s = a^alpha / sqrt(max * min)``."""
    s = np.maximum(np.asarray(magnitude, np.float64), FLOOR) ** alpha
    s = s / np.sqrt(s.max() * s.min())
    return (1.0 / s).astype(dtype).astype(np.float64)


def _quantized(w: np.ndarray, inv: np.ndarray, hessian: np.ndarray | None, bits: int, block_size: int,
               symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The codes of ``w / inv`` (rows scaled): round to nearest without ``hessian``, else scale
    estimation against the scaled inputs' Hessian."""
    from vlsens.quantize import gptq, scale_estimation

    scaled = (np.asarray(w, np.float64) / inv[:, None]).astype(np.float32)
    if hessian is None:
        return gptq.codes(scaled, None, bits, block_size, symmetric)
    return scale_estimation.codes(scaled, hessian * inv[:, None] * inv[None, :], bits, block_size, symmetric)


def _error(w: np.ndarray, h: np.ndarray, inv: np.ndarray, got: tuple) -> float:
    """``tr(D^T H D)`` for the effective weight ``diag(inv) deq``."""
    from vlsens.quantize import gptq

    d = inv[:, None] * gptq.dequantized(*got, w.shape[0]).astype(np.float64) - w
    return float(np.sum((h @ d) * d))


def search(weight: np.ndarray, hessian: np.ndarray, magnitude: np.ndarray, bits: int, block_size: int,
           symmetric: bool, dtype=np.float32) -> tuple[float, np.ndarray, list[float]]:
    """``(alpha, 1 / s, errors)``: the alpha of the grid whose round-to-nearest codes of ``s W`` give
    the lowest output error on ``hessian`` (on at most :data:`SEARCH_COLUMNS` columns), its ``1 / s``
    (float64 array of ``dtype`` values) and every alpha's error (the first: round to nearest's)."""
    k, n = weight.shape
    cols = np.unique(np.linspace(0, n - 1, min(n, SEARCH_COLUMNS)).round().astype(int))
    w = np.asarray(weight[:, cols], np.float64)
    errors = []
    for j in range(GRID):
        inv = _inverse(magnitude, j / GRID, dtype)
        errors.append(_error(w, hessian, inv, _quantized(w, inv, None, bits, block_size, symmetric)))
    best = int(np.argmin(errors))
    return best / GRID, _inverse(magnitude, best / GRID, dtype), errors


def codes(weight: np.ndarray, hessian: np.ndarray, magnitude: np.ndarray, bits: int, block_size: int,
          symmetric: bool, then: str = "rtn", dtype=np.float32) -> tuple[np.ndarray, ...]:
    """AWQ of ``weight`` (K x N) with its calibration inputs' ``hessian`` (K x K) and mean ``|x|``
    per channel ``magnitude`` (K): the codes, scales and zero points of ``s W`` in
    :func:`vlsens.quantize.gptq.codes`' layout, then ``1 / s`` (K, ``dtype``: what the Mul in
    front multiplies the activations by). ``then``: ``rtn`` or ``se`` (module docstring)."""
    _check(then)
    _, inv, _ = search(weight, hessian, magnitude, bits, block_size, symmetric, dtype)
    return _coded(weight, hessian, inv, bits, block_size, symmetric, then, dtype)


def unscaled(weight: np.ndarray, hessian: np.ndarray, bits: int, block_size: int, symmetric: bool,
             then: str = "rtn", dtype=np.float32) -> tuple[np.ndarray, ...]:
    """:func:`codes` at ``s = 1`` (the decoder's head): round to nearest or scale estimation, and a
    vector of ones (no Mul is written for it)."""
    _check(then)
    return _coded(weight, hessian, np.ones(weight.shape[0]), bits, block_size, symmetric, then, dtype)


def _check(then: str) -> None:
    if then not in ("rtn", "se"):
        raise ValueError(f"awq then: {then!r}; valid: rtn, se")


def _coded(weight, hessian, inv: np.ndarray, bits: int, block_size: int, symmetric: bool, then: str,
           dtype) -> tuple[np.ndarray, ...]:
    """The codes of ``diag(1 / inv) weight`` by ``then``, and ``inv`` in ``dtype``."""
    got = _quantized(weight, inv, hessian if then == "se" else None, bits, block_size, symmetric)
    return (*got, inv.astype(dtype))
