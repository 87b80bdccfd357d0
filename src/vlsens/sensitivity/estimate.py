"""Sensitivity estimated where measuring every op is too dear: each op's output error, scaled to
the measured metric by the ops that were measured.

An op's cost on the answer (KL per token) is measured by running the whole model with the op
quantized; at real size that is hundreds of such runs (at 3B, 253 decoder MatMuls x 2 widths, each
half a forward over the measure's cases: about 16.5 h on 2 cores). The estimate measures ``m`` of
them and prices the rest by their **output error**, ``e = sum ||X (Wq - W)||^2`` over the same
inputs (``X`` the op's input in the float model, ``Wq`` the weight the quantized op multiplies by):
per **role** (an op's node name without its block index: ``attn.q_proj``, ``mlp.down_proj``,
``lm_head``) the geometric mean of measured / ``e`` turns ``e`` into the metric, with one more
factor per relative depth where the measured ops, each held out, are predicted better with it
(:class:`Fit`, :func:`choose_depth`). Per role the op of largest ``e`` is measured first, then the
one of median ``e``, then the others of largest ``e`` (:func:`choose_measured`).

Used by the vision Linears of the plan (:mod:`vlsens.budget.vision`, ``plan.vision_measured``) and
by engine ``nbits`` on the decoder (:mod:`vlsens.sensitivity.nbits`, ``plan.decoder_measured``:
:func:`capture`, :func:`output_errors`, :func:`estimate_widths`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def role_of(op: str) -> str:
    """A Linear's role: its node name without the block index (``blocks.3/mlp/down_proj`` and
    ``blocks.7/mlp/down_proj`` share one; a Linear outside the blocks is its own)."""
    from vlsens.quantize.qdq import parse_op_name

    return parse_op_name(op, "MatMul")[1]


def choose_measured(errors: Mapping[str, Mapping[str, float]], count: int) -> list[str]:
    """The ``count`` Linears measured end to end: per role (:func:`role_of`) the one of largest
    output error (roles in decreasing order of it: the likeliest costly Linears, measured, not
    estimated); then per role the one of median output error (so that the role's scale is not
    fitted on its extreme alone); then the others in decreasing output error."""
    by_error = sorted(errors, key=lambda op: -errors[op]["all"])
    roles: dict[str, list[str]] = {}
    for op in by_error:
        roles.setdefault(role_of(op), []).append(op)
    largest = [ops[0] for ops in roles.values()]
    median = [ops[len(ops) // 2] for ops in roles.values() if len(ops) > 1]
    first = largest + median
    return (first + [op for op in by_error if op not in first])[:count]


def block_count(ops) -> int:
    """The number of blocks the ops' names span (the largest block index + 1; 0 where none is in a block)."""
    from vlsens.quantize.qdq import parse_op_name

    return max((b + 1 for b in (parse_op_name(op)[0] for op in ops) if b is not None), default=0)


def relative_depth(op: str, blocks: int) -> float | None:
    """A block's Linear: its block index over the last one's (0 the first block, 1 the last); None outside the blocks."""
    from vlsens.quantize.qdq import parse_op_name

    b = parse_op_name(op)[0]
    return None if b is None else b / max(blocks - 1, 1)


@dataclass(frozen=True)
class Fit:
    """``log(KL / output error) = intercept[role] + slope x relative depth``: the role's own path to the
    answer, and (``slope`` not 0) how much more an error costs the earlier its block (a random tower
    compounds an early error through every later block). ``slope`` is the pooled within-role
    least-squares slope, so only roles measured at two or more depths decide it; a role with none
    measured takes ``default``, the mean of every measured point's log ratio less its depth term.
    ``slope`` is 0 without the depth term, or where no role is measured at two depths."""

    intercepts: dict[str, float]
    default: float
    slope: float = 0.0

    @classmethod
    def of(cls, points: Sequence[tuple[str, float | None, float]], depth: bool) -> Fit:
        by: dict[str, list[tuple[float, float]]] = {}
        for role, d, y in points:
            by.setdefault(role, []).append((0.0 if d is None else d, y))
        slope = 0.0
        if depth:
            sxy = sxx = 0.0
            for pts in by.values():
                dm, ym = (sum(p[i] for p in pts) / len(pts) for i in (0, 1))
                sxy += sum((d - dm) * (y - ym) for d, y in pts)
                sxx += sum((d - dm) ** 2 for d, _ in pts)
            slope = sxy / sxx if sxx > 1e-12 else 0.0
        flat = {role: [y - slope * d for d, y in pts] for role, pts in by.items()}
        every = [y for v in flat.values() for y in v]
        return cls({role: sum(v) / len(v) for role, v in flat.items()}, sum(every) / len(every) if every else 0.0, slope)

    def log_scale(self, role: str, depth: float | None) -> float:
        return self.intercepts.get(role, self.default) + self.slope * (depth or 0.0)

    def scale(self, role: str, depth: float | None) -> float:
        return math.exp(self.log_scale(role, depth))


def held_out(points: Sequence[tuple[str, float | None, float]], depth: bool) -> list[float]:
    """Each point's log ratio less its prediction by the fit on the other points (leave one out)."""
    return [y - Fit.of([p for j, p in enumerate(points) if j != i], depth).log_scale(role, d)
            for i, (role, d, y) in enumerate(points)]


def choose_depth(points: Sequence[tuple[str, float | None, float]]) -> dict:
    """Whether the estimate takes the depth term: the fit whose held-out predictions (:func:`held_out`)
    miss the measured points by less (root mean square of the log ratio), the role-only fit where they
    tie or where no role is measured at two depths. On the 3B tower (32 blocks, 14 Linears measured)
    the role-only fit ranked the measured Linears held out at Spearman's rho -0.12, early blocks
    measuring 4-8x their estimate and late ones 0.13-0.5x; on the 4-block tiny checkpoints a depth
    factor made the curve worse. So it is chosen per run on the run's own measures."""
    rms = {}
    for key, depth in (("role", False), ("role+depth", True)):
        res = held_out(points, depth) if len(points) > 1 else []
        rms[key] = math.sqrt(sum(r * r for r in res) / len(res)) if res else None
    fit = Fit.of(points, True)
    use = rms["role"] is not None and fit.slope != 0.0 and rms["role+depth"] < rms["role"]
    return {"used": bool(use), "slope": fit.slope if use else 0.0, "first_over_last": math.exp(-fit.slope) if use else 1.0,
            "held_out_rms_log": rms}


@dataclass(frozen=True)
class Inputs:
    """Every distinct input of a model's weight MatMuls over a set of feeds, as rows (positions x
    width, float32) in files under a scratch folder (:func:`capture`): ``source`` MatMul -> its
    input tensor, ``files`` / ``widths`` per tensor."""

    source: dict[str, str]
    files: dict[str, Path]
    widths: dict[str, int]

    def rows(self, op: str) -> np.ndarray:
        t = self.source[op]
        return np.memmap(self.files[t], np.float32, mode="r").reshape(-1, self.widths[t])


def capture(float_model: str | Path, feeds, ops: Sequence[Mapping], scratch: str | Path, threads: int = 0) -> Inputs:
    """The inputs of ``ops`` (:func:`vlsens.quantize.nbits.weight_matmuls` rows of ``float_model``)
    over ``feeds``, one session pass (:func:`vlsens.quantize.gptq.spill`), written to ``scratch``
    (positions x the sum of the distinct inputs' widths x 4 bytes: at 3B's 36 layers 2.5 GB per
    1 000 positions)."""
    import onnx

    from vlsens.quantize.gptq import spill

    graph = onnx.load(str(float_model), load_external_data=False).graph
    by_name = {n.name: n for n in graph.node}
    source = {o["name"]: by_name[o["name"]].input[0] for o in ops}
    return Inputs(source, *spill(float_model, feeds, list(dict.fromkeys(source.values())), scratch, threads))


def output_errors(inputs: Inputs, float_model: str | Path, quantized: Mapping[int, str | Path],
                  ops: Sequence[Mapping]) -> dict[str, dict[str, float]]:
    """Per MatMul of ``ops`` ``{str(bits): sum ||X (W_b - W)||^2}`` over the captured positions
    (``inputs``, :func:`capture`): ``W_b`` the weight the ``MatMulNBits`` node of ``quantized[bits]``
    multiplies by (:func:`vlsens.core.onnxgraph.dequantize_matmulnbits`, AWQ's input scale
    included), ``W`` the float model's. Memory: one op's weights and a chunk of its products
    (2**26 values); time: positions x K x N per op and width."""
    import onnx

    from vlsens.core.onnxgraph import dequantize_matmulnbits
    from vlsens.core.onnxutil import tensor_array

    float_model = Path(float_model)
    inits = {i.name: i for i in onnx.load(str(float_model), load_external_data=False).graph.initializer}
    weight = {o["name"]: o["weight"] for o in ops}
    out: dict[str, dict[str, float]] = {name: {} for name in weight}
    for b, path in quantized.items():
        for name, wq in dequantize_matmulnbits(path, names=list(weight)):
            if name not in weight:
                continue
            delta = wq - np.asarray(tensor_array(inits[weight[name]], float_model.parent), np.float32)
            x, e = inputs.rows(name), 0.0
            step = max(16, (1 << 26) // delta.shape[1])
            for i in range(0, len(x), step):
                y = (x[i:i + step] @ delta).astype(np.float64)
                e += float(np.einsum("ij,ij->", y, y))
            out[name][str(b)] = e
    missing = sorted(n for n, v in out.items() if set(v) != {str(b) for b in quantized})
    if missing:
        raise ValueError(f"MatMuls not quantized in every model of {sorted(quantized)} bits: {missing[:5]}")
    return out


def estimate_widths(rows: list[dict], errors: Mapping[str, Mapping[str, float]], widths: Sequence[int],
                    logits: bool) -> dict:
    """Engine ``nbits``' rows (``measured`` 1: ``error_int<b>`` measured; 0: to be estimated) priced
    per width from their output errors (``errors[op][str(b)]``, :func:`output_errors`): a fit per
    width (:class:`Fit`, with the depth term where :func:`choose_depth` takes it) on the measured
    rows' log(error / output error). Every row gets ``output_error_int<b>`` and ``estimate_int<b>``
    (a measured row's from the fit on the other measured rows: held out); a row not measured takes
    the estimate as its ``error_int<b>`` (and ``kl_int<b>`` with ``logits``), its cosine and top-1
    unknown (NaN). The record: per width the fit, the depth choice, measured / estimate over the
    measured rows (held out) and their rank correlation (None below 3 rows)."""
    from vlsens.core.metrics import spearman

    blocks = block_count(r["op"] for r in rows)
    record = {"measured": sum(1 for r in rows if r["measured"]), "estimated": sum(1 for r in rows if not r["measured"]),
              "widths": {}}
    for b in widths:
        key, w = f"error_int{b}", str(b)
        pts = {i: (role_of(r["op"]), relative_depth(r["op"], blocks), math.log(float(r[key]) / errors[r["op"]][w]))
               for i, r in enumerate(rows) if r["measured"] and float(r[key]) > 0 and errors[r["op"]][w] > 0}
        depth = choose_depth(list(pts.values()))
        fit = Fit.of(list(pts.values()), depth["used"])
        pairs = []
        for i, r in enumerate(rows):
            e, role, d = errors[r["op"]][w], role_of(r["op"]), relative_depth(r["op"], blocks)
            held = Fit.of([p for j, p in pts.items() if j != i], depth["used"]) if i in pts else fit
            r[f"output_error_int{b}"], r[f"estimate_int{b}"] = e, (held if r["measured"] else fit).scale(role, d) * e
            if r["measured"]:
                pairs.append((float(r[key]), r[f"estimate_int{b}"]))
                continue
            r[key] = r[f"estimate_int{b}"]
            r[f"cosine_int{b}"] = float("nan")
            if logits:
                r[f"kl_int{b}"], r[f"top1_int{b}"] = r[key], float("nan")
        ratios = [m / e for m, e in pairs if e > 0 and m > 0]  # a measure at or below 0 is the engine's noise
        record["widths"][w] = {
            "points": len(pts), "depth": depth,
            "scales": {role: fit.scale(role, 0.0) for role in sorted({role_of(r["op"]) for r in rows})},
            "measured_over_estimate": {"min": min(ratios), "median": float(np.median(ratios)), "max": max(ratios)}
            if ratios else None,
            "rank_correlation": spearman([m for m, _ in pairs], [e for _, e in pairs]) if len(pairs) >= 3 else None}
    return record
