"""The statistics of the end-to-end measure of deploy folders, independent of the folder format:
KL per generated step, a summary per modality with its spread, and paired intervals for "folder A
is better than folder B".

A folder's measure is one row per evaluation case (its mean KL against the fp32 folder over the
generated steps, and its top-1 agreement). Cases of one modality differ by far more than two
folders usually do, so two folders are compared on the *same* cases: the ratio of their mean KLs,
with a paired bootstrap interval that resamples cases within each modality (every resample keeps
each modality's case count, so the mix of text and image cases stays the one measured). numpy
only: the runtime side (:mod:`vlsens.deploy.genai.measure`) produces the rows.
"""

from __future__ import annotations

import numpy as np

from vlsens.core.errors import VlsensError

#: The modality order of every summary (others follow, in the order they first appear).
ORDER = ("text", "image", "images")


def log_softmax(x) -> np.ndarray:
    """Log-softmax over the last axis, in float64."""
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl_steps(p_logp, q_logits) -> np.ndarray:
    """KL(p || q) per row (the last axis is the vocabulary): ``p`` as log-probabilities (float32
    or float64), ``q`` as raw logits (log-softmaxed here in float64). ``p`` is renormalized in
    float64 first: log-probabilities stored as float32 sum to 1 only within their rounding, which
    would enter the KL at first order (about 1e-9 for a folder against its own reference); two
    proper distributions leave it at second order, and never below 0."""
    lp = log_softmax(p_logp)
    lq = log_softmax(q_logits)
    if lp.shape != lq.shape:
        raise VlsensError(f"KL of log-probabilities {lp.shape} against logits {lq.shape}: the shapes differ")
    p = np.exp(lp)
    terms = np.where(p > 0, p * (lp - lq), 0.0)  # 0 log 0 = 0
    return terms.sum(-1)


def _modalities(rows) -> list[str]:
    seen = list(dict.fromkeys(r["modality"] for r in rows))
    return [m for m in ORDER if m in seen] + [m for m in seen if m not in ORDER]


def summarize(rows) -> dict:
    """Over per-case rows (``modality``, ``kl``: the case's mean KL over its steps, ``top1``): the
    mean over all cases (each case weighs the same) and per modality the mean, the sample
    standard deviation across its cases (0 for a single case), min, max, median and top-1."""
    if not rows:
        raise VlsensError("nothing to summarize: no evaluation cases")
    out = {}
    for m in _modalities(rows):
        kl = np.array([float(r["kl"]) for r in rows if r["modality"] == m])
        top1 = np.array([float(r["top1"]) for r in rows if r["modality"] == m])
        out[m] = {"cases": int(kl.size), "mean_kl": float(kl.mean()),
                  "std": float(kl.std(ddof=1)) if kl.size > 1 else 0.0,
                  "min": float(kl.min()), "max": float(kl.max()), "median": float(np.median(kl)),
                  "top1": float(top1.mean())}
    return {"mean_kl": float(np.mean([float(r["kl"]) for r in rows])),
            "top1": float(np.mean([float(r["top1"]) for r in rows])), "cases": len(rows), "modalities": out}


def _matched(a_rows, b_rows) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(modality per case, A's KL, B's KL) in A's case order; raises VlsensError unless both hold
    the same case names (once each) with the same modalities."""
    a = {r["name"]: r for r in a_rows}
    b = {r["name"]: r for r in b_rows}
    if len(a) != len(a_rows) or len(b) != len(b_rows):
        raise VlsensError("paired comparison: a case name occurs twice in one measure")
    if set(a) != set(b):
        raise VlsensError(f"paired comparison needs the same cases: only in A {sorted(set(a) - set(b))}, "
                          f"only in B {sorted(set(b) - set(a))}")
    if not a:
        raise VlsensError("paired comparison: no cases")
    for n in a:
        if a[n]["modality"] != b[n]["modality"]:
            raise VlsensError(f"paired comparison: case {n} is {a[n]['modality']} in A but {b[n]['modality']} in B")
    names = list(a)
    return ([a[n]["modality"] for n in names], np.array([float(a[n]["kl"]) for n in names]),
            np.array([float(b[n]["kl"]) for n in names]))


def _ratio(sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """A / B element-wise: inf where only B is 0, nan where both are."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(sa, np.float64) / np.asarray(sb, np.float64)


def _interval(ratios: np.ndarray, level: float) -> list[float | None]:
    """The percentile interval at ``level`` (a resample whose B mean is 0 counts as +inf; an
    endpoint that is not finite is None)."""
    r = np.where(np.isnan(ratios), np.inf, ratios)
    lo, hi = np.quantile(r, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return [float(v) if np.isfinite(v) else None for v in (lo, hi)]


def _stat(a: np.ndarray, b: np.ndarray, boot_a: np.ndarray, boot_b: np.ndarray, level: float) -> dict:
    """Ratio of means, its bootstrap interval (from resampled sums) and the fraction of cases A wins."""
    out = {"ratio": None, "interval": [None, None], "wins": float(np.mean(a < b)), "ties": float(np.mean(a == b))}
    if b.mean() == 0:
        out["note"] = ("B's mean KL is 0 on these cases (A's is " + ("0 too" if a.mean() == 0 else f"{a.mean():.3g}")
                       + "): no ratio")
        return out
    out["ratio"] = float(a.mean() / b.mean())
    out["interval"] = _interval(_ratio(boot_a, boot_b), level)
    if None in out["interval"]:
        out["note"] = "B's mean KL is 0 in some resamples: the interval is open on that side (None)"
    return out


def paired(a_rows, b_rows, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Folder A against folder B on the same cases (matched by name; VlsensError otherwise): the
    ratio of mean KLs A / B overall and per modality, its paired percentile-bootstrap interval at
    ``level`` (case indices resampled with replacement within each modality, ``n_boot`` times,
    ``seed``), and ``wins``: the fraction of cases where A's KL is below B's (``ties``: equal).
    ``better``: the interval lies below 1; ``worse``: above 1."""
    if not 0 < level < 1 or n_boot < 1:
        raise VlsensError(f"paired comparison: level {level} must lie in (0, 1) and n_boot {n_boot} be >= 1")
    mods, a, b = _matched(a_rows, b_rows)
    mods = np.array(mods)
    rng = np.random.default_rng(seed)
    per, tot_a, tot_b = {}, np.zeros(n_boot), np.zeros(n_boot)
    for m in _modalities([{"modality": m} for m in mods]):
        am, bm = a[mods == m], b[mods == m]
        idx = rng.integers(0, am.size, size=(n_boot, am.size))
        sa, sb = am[idx].sum(1), bm[idx].sum(1)
        tot_a, tot_b = tot_a + sa, tot_b + sb
        per[m] = _stat(am, bm, sa, sb, level)
    out = _stat(a, b, tot_a, tot_b, level)
    lo, hi = out["interval"]
    out.update(better=out["ratio"] is not None and hi is not None and hi < 1,
               worse=out["ratio"] is not None and lo is not None and lo > 1,
               modalities=per, n_boot=n_boot, level=level)
    return out
