"""Scoring answers: normalisation, accuracy with its Wilson interval, paired comparisons (McNemar).

lm-evaluation-harness and VLMEvalKit report accuracy per task with its spread; a comparison of two
models on the same questions is paired: only the questions one gets right and the other wrong
(the discordant pairs) carry information, and McNemar's exact test asks whether they split
unevenly. Pure Python.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from statistics import NormalDist

_WORD = re.compile(r"[a-z0-9]+")


def normalise(text: str) -> str:
    """The answer a generated text gives: its first word, lower case, without punctuation."""
    m = _WORD.search(text.lower())
    return m.group(0) if m else ""


def wilson(correct: int, total: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of ``correct / total`` at ``level``."""
    if total <= 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = correct / total
    den = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / den
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def accuracy(right: Sequence[bool], level: float = 0.95) -> dict:
    """``{correct, questions, accuracy, low, high}`` of a list of right/wrong answers."""
    k, n = int(sum(bool(r) for r in right)), len(right)
    lo, hi = wilson(k, n, level)
    return {"correct": k, "questions": n, "accuracy": (k / n if n else 0.0), "low": lo, "high": hi}


def mcnemar(a: Sequence[bool], b: Sequence[bool], level: float = 0.95) -> dict:
    """Paired comparison of ``b`` against ``a`` on the same questions (exact McNemar test).

    ``lost``: questions ``a`` answers right and ``b`` wrong; ``gained``: the reverse. ``drop`` is
    ``b``'s accuracy minus ``a``'s (negative: ``b`` is worse) with a paired (Newcombe-free, Wald on
    the discordant counts) interval; ``resolved`` is ``worse`` / ``better`` when the two-sided
    exact p-value is below ``1 - level``, else ``not resolved``."""
    if len(a) != len(b):
        raise ValueError(f"paired answers differ in length ({len(a)} and {len(b)})")
    n = len(a)
    lost = sum(1 for x, y in zip(a, b) if x and not y)
    gained = sum(1 for x, y in zip(a, b) if y and not x)
    p = _exact_two_sided(lost, gained)
    diff = (gained - lost) / n if n else 0.0
    z = NormalDist().inv_cdf(0.5 + level / 2)
    var = ((lost + gained) / n - diff * diff) / n if n else 0.0
    half = z * math.sqrt(max(var, 0.0))
    state = "not resolved" if p >= 1 - level else ("worse" if lost > gained else "better")
    return {"questions": n, "lost": lost, "gained": gained, "difference": diff,
            "low": diff - half, "high": diff + half, "p": p, "resolved": state}


def _exact_two_sided(b: int, c: int) -> float:
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def prior_baseline(modality_kind_answers: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    """Per modality, the accuracy of a model that reads the question but not the image or the
    facts: for each question kind it always gives that kind's most frequent answer. What an
    accuracy has to beat to show the model learnt the task (``(modality, kind, answer)`` triples)."""
    from collections import Counter

    by_kind: dict[tuple[str, str], Counter] = {}
    for m, k, a in modality_kind_answers:
        by_kind.setdefault((m, k), Counter())[a] += 1
    out: dict[str, list[int]] = {}
    for (m, _), counts in by_kind.items():
        r = out.setdefault(m, [0, 0])
        r[0] += counts.most_common(1)[0][1]
        r[1] += sum(counts.values())
    return {m: right / total for m, (right, total) in out.items()}
