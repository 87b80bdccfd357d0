"""One implementation of every comparison: its two views, streaming, valid positions, logits."""

import numpy as np
import pytest

from vlsens.core.metrics import Metrics, compare, output_metrics


def test_parity_view():
    a = np.array([1.0, 2.0, 3.0])
    m = compare(a, a)
    assert m["max_abs_diff"] == 0 and m["cosine"] == pytest.approx(1.0)
    m = compare(a + [0, 0, 0.3], a)
    assert m["max_abs_diff"] == pytest.approx(0.3) and m["max_rel_error"] == pytest.approx(0.1)
    assert m["mean_abs_diff"] == pytest.approx(0.1)
    m = compare(np.array([np.nan, 1, 1]), a)
    assert m["cosine"] == -1.0 and m["max_abs_diff"] == float("inf")
    with pytest.raises(ValueError, match="shape mismatch"):
        compare(a[:2], a)


def test_streamed_equals_whole_array():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(3, 5, 11)).astype(np.float32)
    act = ref + rng.normal(scale=0.1, size=ref.shape).astype(np.float32)
    acc = Metrics(logits=True)
    for i in range(3):
        acc.add(act[i:i + 1], ref[i:i + 1])
    a, r = act.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    e = a - r
    assert acc.result()["mse"] == pytest.approx(np.mean(e * e), rel=1e-12)
    assert acc.result()["sqnr_db"] == pytest.approx(10 * np.log10((r @ r) / (e @ e)), rel=1e-12)
    assert acc.result()["cosine"] == pytest.approx(a @ r / np.linalg.norm(a) / np.linalg.norm(r), rel=1e-12)
    assert acc.parity()["max_abs_diff"] == pytest.approx(np.abs(e).max())
    assert output_metrics(act, ref) == pytest.approx({k: v for k, v in acc.result().items() if k in ("mse", "cosine", "sqnr_db")})
    same = Metrics(logits=True).add(ref, ref)
    assert same.result()["kl"] == pytest.approx(0.0, abs=1e-9) and same.result()["top1"] == 1.0


def test_valid_positions_only():
    """Padded positions (mask False) count nowhere: not in errors, not in top-1, not in KL."""
    ref = np.zeros((1, 4, 3), np.float32)
    ref[..., 0] = 1.0
    act = ref.copy()
    act[0, :2] = [0.0, 9.0, 0.0]  # garbage at two padded positions
    valid = np.array([[False, False, True, True]])
    m = Metrics(logits=True).add(act, ref, valid)
    assert m.result()["mse"] == 0.0 and m.result()["top1"] == 1.0 and m.parity()["positions"] == 2
    assert Metrics(logits=True).add(act, ref).result()["top1"] == 0.5


def test_progress_lines_say_done_total_rate_and_eta():
    """Long loops log `what: done/total unit (pct), s/unit, ETA`, at most every `every` seconds
    and always at the end (tail -f on a job's log tells how long is left)."""
    from vlsens.core.job import Progress

    t = [0.0]
    lines = []

    class Log:
        def info(self, fmt, msg):
            lines.append(msg)

    p = Progress("sensitivity", 163, "ops", every=15, log=Log(), clock=lambda: t[0])
    for _ in range(10):  # 10 ops at 2.5 s: one line when 15 s have passed
        t[0] += 2.5
        p.step()
    assert lines == ["sensitivity: 6/163 ops (4 %), 2.50 s/op, ETA 6 min 32 s"]
    for _ in range(153):
        t[0] += 2.5
        p.step()
    assert lines[-1] == "sensitivity: 163/163 ops (100 %), 2.50 s/op, ETA 0 s"
    assert len(lines) == 28  # one line per 15 s (27) and the last op's


def _kl64(reference, actual):
    """KL per row from two log-softmaxes in float64 (the plain form, exact enough here)."""
    def log_softmax(x):
        z = x - x.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lp, lq = log_softmax(reference.astype(np.float64)), log_softmax(actual.astype(np.float64))
    return np.sum(np.exp(lp) * (lp - lq), -1)


@pytest.mark.parametrize("scale", [1e-4, 1e-2, 0.5, 5.0, 200.0])
def test_kl_keeps_its_precision_where_the_distributions_nearly_agree(scale):
    """The KL of near-identical logits (a near-float decoder's) stays within 1e-4 of float64's (a
    row's within 1e-3: at 5e-9 a row is 2.3e-4 off, both ways' rounding together),
    where the difference of two float32 log-softmaxes is off by far more and can go negative; logits
    apart by more than float32's exponential holds take the float64 form. Never below 0."""
    from vlsens.core.metrics import _log_softmax, kl_rows

    rng = np.random.default_rng(0)
    ref = (3 * rng.standard_normal((32, 50_000))).astype(np.float32)
    act = (ref + scale * rng.standard_normal(ref.shape)).astype(np.float32)
    want, got = _kl64(ref, act), kl_rows(ref, act)
    assert got == pytest.approx(want, rel=1e-3)
    assert got.mean() == pytest.approx(want.mean(), rel=1e-4)
    assert Metrics(logits=True).add(act, ref).result()["kl"] == pytest.approx(want.mean(), rel=1e-4)
    if scale == 1e-4:  # the float32 difference of log-softmaxes: what the metric computed before
        lp, lq = _log_softmax(ref), _log_softmax(act)
        plain = np.sum(np.exp(lp) * (lp - lq), -1, dtype=np.float64)
        assert abs(plain.mean() - want.mean()) > 0.5 * want.mean()
    assert (kl_rows(ref, ref) == 0).all() and (got >= 0).all()
