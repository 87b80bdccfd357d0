"""The profile search where an op may take 16-bit activations: W8A8, W8A16 or float per op.

Targets with 16-bit activations (``quant.target`` npu / qnn, :data:`vlsens.quantize.target.WIDE_TARGETS`)
raise an op from W8A8 to W8A16 before giving up its 8-bit weights: the fewest W8A16 ops first,
float last (what Qualcomm's AIMET AMP searches). Every candidate is one pass of the engine's
switch model (:mod:`vlsens.sensitivity.switch`, both widths in one session); the choice's value
is the **estimate**, and the built model (ORT's ``TensorQuantOverrides``) equals it.

1. Every op W8A8: done when it meets the target.
2. Every op W8A16 misses too: the fewest ops to float, in decreasing W8A16 error alone (prefix
   bisection), then each of them back to W8A16 where the set still meets (greedy). Nothing meets
   with any 8-bit op: ``unreachable``.
3. Among the 8-bit ops, the fewest W8A16: a prefix of the ops in decreasing gain (W8A8 error
   alone minus W8A16 error alone), bisected, then each back to W8A8 where the set still meets.

The trace's last step that meets is the choice (every accepted step replaces it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vlsens.sensitivity.ranking import WIDE_SUFFIX

#: Profile precisions of a wide profile's ops (``profile.yaml``: ``precision``).
W8A8, W8A16 = "int8", "int8-a16"


class _Steps:
    """Evaluations of the search: each one traced with its counts, weight shares and verdict."""

    def __init__(self, evaluate: Callable[[list[str], list[str]], dict], meets: Callable[[dict], bool],
                 weights: dict[str, int], max_evals: int):
        self.evaluate, self.meets, self.weights, self.max_evals = evaluate, meets, weights, max_evals
        self.total = sum(weights.values())
        self.trace: list[dict] = []

    @property
    def spent(self) -> bool:
        return len(self.trace) >= self.max_evals

    def ok(self, int8: Sequence[str], wide: Sequence[str], step: str) -> bool:
        m = self.evaluate(list(int8), list(wide))
        def share(ops):
            return sum(self.weights[o] for o in ops) / self.total if self.total else 0.0
        self.trace.append({"step": step, "int8_ops": len(int8), "a16_ops": len(wide), **m, "meets": self.meets(m),
                           "int8_weight_share": share(int8), "a16_weight_share": share(wide)})
        return self.trace[-1]["meets"]

    def smallest_prefix(self, order: list[str], make: Callable[[list[str]], tuple], step: str) -> int:
        """The smallest k with ``make(order[:k])`` meeting, k = 0 known to miss and k = len(order)
        known (or taken) to meet: bisection."""
        lo, hi = 0, len(order)
        while hi - lo > 1 and not self.spent:
            mid = (lo + hi) // 2
            if self.ok(*make(order[:mid]), f"{step} {mid}"):
                hi = mid
            else:
                lo = mid
        return hi


def search_wide(ranking: Sequence[str], rows: dict[str, dict], evaluate: Callable[[list[str], list[str]], dict],
                meets: Callable[[dict], bool], max_evals: int, weights: dict[str, int]
                ) -> tuple[list[str], list[str], list[dict]]:
    """(8-bit ops, the W8A16 ones among them, trace): the module's steps 1-3. ``ranking``: least
    sensitive first (W8A8); ``rows``: the sensitivity CSV's rows by op (``mse``, ``mse_a16``)."""
    st = _Steps(evaluate, meets, weights, max_evals)
    ops = list(ranking)
    if st.ok(ops, [], "all W8A8"):
        return ops, [], st.trace
    floats: list[str] = []
    if not st.ok(ops, ops, "all W8A16"):
        by_a16 = sorted(ops, key=lambda o: -float(rows[o][f"mse{WIDE_SUFFIX}"]))

        def rest(prefix):
            keep = [o for o in ops if o not in set(prefix)]
            return keep, keep

        k = st.smallest_prefix(by_a16, rest, "float prefix")
        if k == len(by_a16):
            return [], [], st.trace
        floats = by_a16[:k]
        for op in reversed(list(floats)):
            if st.spent:
                break
            trial = [o for o in floats if o != op]
            if st.ok(*rest(trial), f"a16 {op}"):
                floats = trial
    eight = [o for o in ops if o not in set(floats)]
    by_gain = sorted(eight, key=lambda o: -(float(rows[o]["mse"]) - float(rows[o][f"mse{WIDE_SUFFIX}"])))
    k = st.smallest_prefix(by_gain, lambda prefix: (eight, prefix), "W8A16 prefix")
    wide = by_gain[:k]
    for op in reversed(list(wide)):
        if st.spent:
            break
        trial = [o for o in wide if o != op]
        if st.ok(eight, trial, f"a8 {op}"):
            wide = trial
    return eight, wide, st.trace


def precision_of(op: str, int8: set[str], wide: set[str], float_name: str) -> str:
    return W8A16 if op in wide else (W8A8 if op in int8 else float_name)


def explain_wide(rows: dict, ranking: list[str], int8: Sequence[str], wide: Sequence[str], trace: list[dict],
                 measured: dict, metric: str, value: float, sign: str) -> dict[str, str]:
    """What was measured for every op of a wide profile, one sentence each (``why``)."""
    n = len(rows)
    tried = {t["step"].split(" ", 1)[1]: t for t in trace if t["step"].startswith(("a16 ", "a8 "))}
    int8_set, wide_set = set(int8), set(wide)
    out = {}
    def fmt(x):
        return f"{float(x):.6g}"
    for name in ranking:
        r = rows[name]
        head = (f"rank {r['rank']}/{n} (alone: MSE {float(r['mse']):.3g} at W8A8, "
                f"{float(r[f'mse{WIDE_SUFFIX}']):.3g} at W8A16)")
        t = tried.get(name)
        if name in wide_set:
            why = (f"W8A16: at W8A8 the set's estimate was {metric} {fmt(t[metric])}, which misses {sign} {value:g}"
                   if t is not None else "W8A16: among the ops whose W8A16 gain the smallest prefix that meets needs")
        elif name in int8_set:
            why = f"W8A8 in the shipped model, which measured {metric} {fmt(measured[metric])} {sign} {value:g}"
        else:
            alone = r.get(f"{metric}{WIDE_SUFFIX}")
            alone_text = f"; alone at W8A16 it measured {metric} {fmt(alone)}" if alone not in (None, "") else ""
            why = (f"float: with it W8A16 the set's estimate was {metric} {fmt(t[metric])}, which misses "
                   f"{sign} {value:g}{alone_text}" if t is not None
                   else f"float: among the ops with the largest W8A16 error{alone_text}")
        out[name] = f"{head}; {why}"
    return out
