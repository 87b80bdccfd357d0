"""One implementation of every output comparison: parity gates, sensitivity rows, profiles.

:class:`Metrics` accumulates the difference between outputs and their references feed by feed
(float64 sums, nothing kept), optionally over the valid positions of each output (real tokens of
a padded text batch). It reports two views of the same sums:

``result()``  ``mse``, ``cosine``, ``sqnr_db`` (signal = reference); with ``logits=True`` also
              ``kl`` (mean KL(reference || output) per position, softmax over the last axis) and
              ``top1`` (argmax agreement per position). Sensitivity CSVs and profiles use these.
``parity()``  ``max_abs_diff``, ``mean_abs_diff``, ``max_rel_error`` (max abs diff / max |reference|),
              ``cosine``; with ``logits=True`` also ``top1_agreement`` and ``positions``. Parity
              records use these.

A non-finite output makes every error infinite and the cosine -1.

:func:`spearman` ranks two scorings against each other (engines, estimates against measures).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Rows of logits compared at a time for KL (bounded temporaries for large vocabularies).
_KL_ROWS = 64


class Metrics:
    def __init__(self, logits: bool = False):
        self.logits = logits
        self.sq = self.dot = self.na = self.nr = self.abs_sum = 0.0
        self.abs_max = self.ref_max = 0.0
        self.n = 0
        self.kl = 0.0
        self.top1 = 0
        self.positions = 0
        self.finite = True

    def add(self, actual: np.ndarray, reference: np.ndarray, valid: np.ndarray | None = None) -> "Metrics":
        actual, reference = np.asarray(actual), np.asarray(reference)
        if actual.shape != reference.shape:
            raise ValueError(f"shape mismatch: {actual.shape} vs {reference.shape}")
        if valid is not None:
            actual, reference = actual[valid], reference[valid]
        if not np.isfinite(actual).all():
            self.finite = False
            return self
        a = actual.astype(np.float64).ravel()
        r = reference.astype(np.float64).ravel()
        e = a - r
        self.sq += float(e @ e)
        self.dot += float(a @ r)
        self.na += float(a @ a)
        self.nr += float(r @ r)
        if e.size:
            ae = np.abs(e)
            self.abs_sum += float(ae.sum())
            self.abs_max = max(self.abs_max, float(ae.max()))
            self.ref_max = max(self.ref_max, float(np.abs(r).max()))
        self.n += a.size
        if self.logits:
            act = actual.astype(np.float32, copy=False).reshape(-1, actual.shape[-1])
            ref = reference.astype(np.float32, copy=False).reshape(-1, reference.shape[-1])
            for lo in range(0, len(act), _KL_ROWS):
                self.kl += float(kl_rows(ref[lo:lo + _KL_ROWS], act[lo:lo + _KL_ROWS]).sum())
            self.top1 += int(np.sum(act.argmax(-1) == ref.argmax(-1)))
            self.positions += len(act)
        return self

    def _cosine(self) -> float:
        na, nr = np.sqrt(self.na), np.sqrt(self.nr)
        return float(self.dot / (na * nr)) if na > 0 and nr > 0 else float(na == nr)

    def _top1(self) -> float:
        return self.top1 / self.positions if self.positions else 1.0

    def result(self) -> dict[str, float]:
        if not self.finite:
            bad = {"mse": float("inf"), "cosine": -1.0, "sqnr_db": float("-inf")}
            return bad | ({"kl": float("inf"), "top1": 0.0} if self.logits else {})
        mse = self.sq / max(self.n, 1)
        if self.sq == 0:
            sqnr = float("inf")
        else:
            sqnr = float(10.0 * np.log10(self.nr / self.sq)) if self.nr > 0 else float("-inf")
        out = {"mse": float(mse), "cosine": self._cosine(), "sqnr_db": sqnr}
        if self.logits:
            out["kl"] = self.kl / max(self.positions, 1)
            out["top1"] = self._top1()
        return out

    def parity(self) -> dict[str, float]:
        if not self.finite:
            out = {"max_abs_diff": float("inf"), "mean_abs_diff": float("inf"), "max_rel_error": float("inf"),
                   "cosine": -1.0}
            return out | ({"top1_agreement": 0.0, "positions": self.positions} if self.logits else {})
        scale = self.ref_max or 1.0
        out = {"max_abs_diff": self.abs_max, "mean_abs_diff": self.abs_sum / max(self.n, 1),
               "max_rel_error": self.abs_max / scale, "cosine": self._cosine()}
        if self.logits:
            out |= {"top1_agreement": self._top1(), "positions": self.positions}
        return out


def compare(actual: np.ndarray, expected: np.ndarray, valid: np.ndarray | None = None,
            logits: bool = False) -> dict[str, float]:
    """:meth:`Metrics.parity` of one output against its reference."""
    return Metrics(logits).add(actual, expected, valid).parity()


def output_metrics(actual: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """:meth:`Metrics.result` of one output against its reference (MSE, cosine, SQNR)."""
    return Metrics().add(actual, reference).result()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def kl_rows(reference: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """KL(softmax(reference) || softmax(actual)) of each row of two float32 logit arrays, in
    float64 per row, never below 0.

    With ``d = reference - actual`` and ``p = softmax(reference)`` the KL is
    ``sum(p d) + log(sum(p exp(-d)))`` exactly (the two normalizers' difference is
    ``log sum(p exp(-d))``); computed as ``sum(p d) + log1p(sum(p expm1(-d)))`` it keeps its
    precision where the two distributions nearly agree. The difference of two log-softmaxes in
    float32 does not: on logits 1e-4 apart at a 151 936-token vocabulary it gave 3.3e-8 for a KL of
    5.0e-9 (this form: 5.0e-9, within 1e-5 of float64; at KL 5e-11, 4e-4), and below a quantized
    near-float decoder's KL it went negative. About as fast as float32 log-softmaxes, 2.5x faster
    than float64 ones (where an output logit exceeds its reference by more than 80, whose
    exponential float32 cannot hold, the row block takes the two log-softmaxes in float64). By
    Jensen's inequality the exact value is >= 0; a row rounding below 0 (logits equal to within
    float32 rounding) counts 0."""
    ref, act = np.asarray(reference, np.float32), np.asarray(actual, np.float32)
    d = ref - act
    if d.size and float(-d.min()) > 80.0:  # exp(-d) would overflow float32: the plain form in float64
        lp, lq = _log_softmax(ref.astype(np.float64)), _log_softmax(act.astype(np.float64))
        return np.maximum(np.sum(np.exp(lp) * (lp - lq), axis=-1), 0.0)
    p = np.exp(_log_softmax(ref))
    first = np.sum(p * d, axis=-1, dtype=np.float64)
    second = np.log1p(np.sum(p * np.expm1(-d), axis=-1, dtype=np.float64))
    return np.maximum(first + second, 0.0)


def average_ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties get the mean of their positions (as scipy.stats.rankdata)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho (Pearson correlation of average ranks); NaN when either side is constant."""
    if len(a) != len(b):
        raise ValueError("spearman: sequences differ in length")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra @ ra) * (rb @ rb)))
    return float(ra @ rb / den) if den > 0 else float("nan")
