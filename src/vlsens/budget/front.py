"""The measured front: the fewest bytes for each level of error of a whole deploy folder, and a few
plans (:class:`~vlsens.budget.plan.Plan`) spread along it.

1. The decoder's curve (:func:`decoder_curve`): for each of a dozen weight-byte budgets, the
   lowest-KL assignment that fits (:func:`vlsens.precision.nbits.search_budget`, every candidate
   measured exactly in the ``nbits`` engine's switch session); plus the two ends measured
   directly: all INT4, and all float, whose KL must be about 0 (the check that the engine's
   reference is its own float decoder). A smaller budget's assignment also fits every larger one,
   so each point is the best found within its budget (the curve never rises with bytes).
2. The combination (:func:`combine`): every decoder point with every vision format and every
   embedding format. Bytes add exactly (decoder weights, the decoder graph's other bytes, vision,
   embedding). KL is estimated as the sum of each part's KL, each measured end to end with the
   other parts float: an additive estimate (the parts' errors are small and enter the decoder at
   different places), which the folders built from the picked plans test. The Pareto set of the
   combinations is the estimated front.
3. The pick (:func:`pick`): the front's point at each anchor's bytes (the plan compared with
   that anchor), its two ends, and points filling the widest gaps in log bytes, so the built
   folders cover the whole range of sizes and no anchor needs a folder of its own.

:func:`search` runs the three on an engine folder and its sensitivity CSV and returns the plans
(``p1``.. in increasing bytes) and a record of the search.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vlsens.budget.plan import EMBEDDING_FORMATS, VISION_FORMATS, Plan
from vlsens.core.errors import ConfigError, VlsensError
from vlsens.quantize.nbits import FLOAT

log = logging.getLogger(__name__)

#: The all-float decoder's KL against the engine's reference above which the engine is not the
#: float decoder it claims to be.
FLOAT_KL_LIMIT = 1e-6
#: Decoder weight-byte budgets of :func:`search`, strictly between the all-INT4 and all-float bytes.
BUDGETS = 12


class Measured:
    """``measure`` (an assignment -> its KL) once per distinct assignment (the engine is
    deterministic; an op absent and an op at 0 bits are the same), counted: ``calls`` asked,
    ``evaluations`` run."""

    def __init__(self, measure: Callable[[Mapping[str, int]], float]):
        self.measure = measure
        self.cache: dict[tuple, float] = {}
        self.calls = 0

    def __call__(self, bits: Mapping[str, int]) -> float:
        self.calls += 1
        key = tuple(sorted((n, int(b)) for n, b in bits.items() if b != FLOAT))
        if key not in self.cache:
            self.cache[key] = float(self.measure(bits))
        return self.cache[key]

    @property
    def evaluations(self) -> int:
        return len(self.cache)


def assignment_bytes(rows: Sequence[Mapping], bits: Mapping[str, int]) -> int:
    """The weight bytes of an assignment, from the sensitivity CSV's rows (an op absent: float)."""
    return int(sum(r["bytes_float"] if bits.get(r["op"], FLOAT) == FLOAT else r[f"bytes_int{bits[r['op']]}"]
                   for r in rows))


def decoder_curve(measure, rows: Sequence[Mapping], budgets: Sequence[float], max_evals: int) -> list[dict]:
    """``[{"budget", "bytes", "kl", "bits", "from", "searched"}]`` in increasing budget: all INT4,
    the best assignment within each of ``budgets`` (:func:`~vlsens.precision.nbits.search_budget`,
    at most ``max_evals`` measured assignments each; a smaller budget's point when that is better,
    ``from`` naming it and ``searched`` keeping the search's own KL), all float. ``measure``:
    assignment -> KL (a :class:`Measured` runs each assignment once). A VlsensError when the
    all-float end's KL exceeds :data:`FLOAT_KL_LIMIT`."""
    from vlsens.precision.nbits import search_budget

    names = [r["op"] for r in rows]
    low, high = dict.fromkeys(names, 4), dict.fromkeys(names, FLOAT)
    floor = assignment_bytes(rows, low)
    if any(b < floor for b in budgets):
        raise ValueError(f"budgets below the all-INT4 decoder's {floor} weight bytes: {sorted(budgets)[0]:.0f}")

    def point(budget, bits, kl, source, searched=None):
        return {"budget": int(budget), "bytes": assignment_bytes(rows, bits), "kl": float(kl),
                "bits": {n: int(bits.get(n, FLOAT)) for n in names}, "from": source, "searched": searched}

    curve = [point(floor, low, measure(low), "all int4")]
    for budget in sorted(budgets):
        t0 = time.perf_counter()
        bits, kl = search_budget(measure, rows, int(budget), max_evals)
        best = min(curve, key=lambda p: p["kl"])  # every earlier point fits: its bytes <= its budget
        p = point(budget, bits, kl, "search", float(kl)) if kl <= best["kl"] else \
            {**best, "budget": int(budget), "from": f"budget {best['budget']}", "searched": float(kl)}
        curve.append(p)
        log.info("decoder within %d weight bytes: KL %.4g at %d bytes (%.1f s)", budget, p["kl"], p["bytes"],
                 time.perf_counter() - t0)
    top = point(assignment_bytes(rows, high), high, measure(high), "all float")
    if top["kl"] > FLOAT_KL_LIMIT:
        raise VlsensError(f"the all-float decoder's KL against the engine's reference is {top['kl']:.3g} "
                          f"(> {FLOAT_KL_LIMIT:g}): the engine's switch model is not its float decoder")
    curve.append(top)
    return curve


def _components(components: Mapping) -> tuple[dict, dict]:
    """The vision and embedding tables of ``components``, checked: known formats, bytes and KL each."""
    from vlsens.budget.vision import MIXED_PREFIX

    out = []
    for part, known in (("vision", VISION_FORMATS), ("embedding", EMBEDDING_FORMATS)):
        table = components.get(part) or {}
        if not table:
            raise ConfigError(f"components: no {part} format (valid: {list(known)})")
        for fmt, c in table.items():
            if fmt not in known and not (part == "vision" and fmt.startswith(MIXED_PREFIX)):
                raise ConfigError(f"components: {part}: unknown format {fmt!r}; valid: {list(known)}")
            if "bytes" not in c or "kl" not in c:
                raise ConfigError(f"components: {part}: {fmt}: needs bytes and kl, has {sorted(c)}")
        out.append({fmt: {"bytes": int(c["bytes"]), "kl": float(c["kl"])} for fmt, c in table.items()})
    return out[0], out[1]


def pareto(points: Sequence[Mapping]) -> list[dict]:
    """The points no other point dominates (fewer or equal bytes and lower or equal KL, one
    strictly), in increasing bytes; of exact ties in both, the first."""
    out: list[dict] = []
    for p in sorted(points, key=lambda p: (p["bytes"], p["kl"])):
        if not out or p["kl"] < out[-1]["kl"]:
            out.append(dict(p))
    return out


def combine(curve: Sequence[Mapping], components: Mapping, other_bytes: int) -> list[dict]:
    """The estimated front: the :func:`pareto` set of :func:`combinations`."""
    return pareto(combinations(curve, components, other_bytes))


def combinations(curve: Sequence[Mapping], components: Mapping, other_bytes: int) -> list[dict]:
    """Every (decoder point, vision format, embedding format): ``bytes`` = decoder weight bytes +
    ``other_bytes`` (the decoder graph's bytes outside its weight MatMuls) + vision + embedding;
    ``kl`` = the sum of the parts' KL (``components``: ``{"vision": {fmt: {"bytes", "kl"}},
    "embedding": {...}}``, each measured with the other parts float); ``decode_ms`` the decoder
    point's (:mod:`vlsens.budget.latency`) where it has one. ``decoder``: the index of the decoder
    point in ``curve`` (the same assignment once)."""
    vision, embedding = _components(components)
    seen: set[tuple] = set()
    points = []
    for i, d in enumerate(curve):
        key = tuple(sorted(d["bits"].items()))
        if key in seen:
            continue
        seen.add(key)
        for v, vc in vision.items():
            for e, ec in embedding.items():
                parts = {"decoder": {"bytes": int(d["bytes"]), "kl": float(d["kl"])}, "other": {"bytes": int(other_bytes)},
                         "vision": vc, "embedding": ec}
                points.append({"bytes": sum(p["bytes"] for p in parts.values()),
                               "kl": sum(p.get("kl", 0.0) for p in parts.values()),
                               "decoder": i, "vision": v, "embedding": e, "parts": parts,
                               **({"decode_ms": float(d["decode_ms"])} if "decode_ms" in d else {})})
    return points


def is_reference(curve: Sequence[Mapping], point: Mapping) -> bool:
    """Whether a combination is the fp32 folder itself (all-float decoder, fp32 vision and table):
    the reference every folder is measured against, no plan."""
    return (point["vision"], point["embedding"]) == ("fp32", "fp32") and not any(curve[point["decoder"]]["bits"].values())


def _key(p: Mapping) -> tuple:
    """A front point's identity (bytes, KL and the combination it is)."""
    return p["bytes"], p["kl"], p.get("decoder"), p.get("vision"), p.get("embedding")


#: :func:`pick` goes on adding points while a gap between two picked points is wider in log bytes
#: than this many times the even spacing of ``points`` points over the front.
GAP_FACTOR = 1.5


def pick(front: Sequence[Mapping], points: int, required: Sequence[Mapping] = ()) -> list[dict]:
    """At least ``points`` (>= 2) front points from its smallest to its largest bytes: the two ends
    and every point of ``required`` (the plans at the anchors' bytes: built anyway, so they count
    towards ``points``), then, one at a time, the point nearest in log bytes to the middle of the
    widest gap between two picked points (among the points inside it), until ``points`` are
    picked and no gap is wider than :data:`GAP_FACTOR` x the even spacing of ``points`` points.
    All of the front when it has no more than ``points``; increasing bytes."""
    if points < 2:
        raise ValueError(f"pick: points must be >= 2, got {points}")
    front = sorted(front, key=lambda p: p["bytes"])
    if len(front) <= points:
        return [dict(p) for p in front]
    logs = [math.log(max(p["bytes"], 1)) for p in front]
    spacing = (logs[-1] - logs[0]) / (points - 1)
    key = {_key(p): i for i, p in enumerate(front)}
    chosen = {0, len(front) - 1}
    for p in required:
        k = _key(p)
        if k not in key:
            raise ValueError(f"pick: a required point is not on the front: {k}")
        chosen.add(key[k])
    while True:
        order = sorted(chosen)
        gaps = [(logs[b] - logs[a], a, b) for a, b in zip(order, order[1:]) if b - a > 1]
        if not gaps:
            break
        width, a, b = max(gaps)
        if len(chosen) >= points and width <= GAP_FACTOR * spacing:
            break
        middle = (logs[a] + logs[b]) / 2
        chosen.add(min(range(a + 1, b), key=lambda j: (abs(logs[j] - middle), -j)))
    return [dict(front[i]) for i in sorted(chosen)]


def at_bytes(front: Sequence[Mapping], budget: int) -> dict | None:
    """The front point of lowest estimated KL whose bytes are at most ``budget`` (an anchor's
    folder: the plan compared with it at equal or fewer bytes); None when none fits."""
    fits = [p for p in front if p["bytes"] <= budget]
    return dict(min(fits, key=lambda p: (p["kl"], p["bytes"]))) if fits else None


def budgets_between(low: int, high: int, count: int = BUDGETS) -> list[int]:
    """``count`` budgets geometric strictly between ``low`` and ``high`` bytes."""
    ratio = (high / low) ** (1.0 / (count + 1))
    return [int(round(low * ratio ** k)) for k in range(1, count + 1)]


def calibration_of(meta: Mapping) -> str:
    """The SHA-256 of the calibration samples an engine's data-aware algorithms read (``engine.json``), or ''."""
    return str((meta.get("calibration") or {}).get("sha256", ""))


def _plans(curve: Sequence[Mapping], picked: Sequence[Mapping], ops: Sequence[str], settings: dict,
           mixed: Mapping[str, Mapping] | None = None,
           algorithms: Mapping[str, Mapping[str, str]] | None = None, calibration: str = "") -> list[Plan]:
    """The picked points as plans ``p1``.. (increasing bytes; the decoder's MatMuls in ``ops``'
    order), the estimate of each part in them. ``mixed``: the mixed vision options by name
    (``mixed:<k>`` -> its Linears' bits, :func:`vlsens.budget.vision.mixed_curve`);
    ``algorithms``: the engine's per-op algorithms by width (``engine.json``), which each plan
    takes for its quantized MatMuls; ``calibration``: the SHA-256 of the calibration samples a
    data-aware one read (:func:`calibration_of`), named by the plans that take one."""
    from vlsens.quantize.nbits import data_aware

    per_width = {int(w): dict(a) for w, a in (algorithms or {}).items()}
    from vlsens.budget.plan import MIXED
    from vlsens.budget.vision import MIXED_PREFIX

    plans = []
    for k, p in enumerate(picked, 1):
        d = curve[p["decoder"]]
        estimate = {"bytes": int(p["bytes"]), "kl": float(p["kl"]), "decoder_budget": int(d["budget"]),
                    "parts": {part: dict(v) for part, v in p["parts"].items()},
                    **({"decode_ms": float(p["decode_ms"])} if "decode_ms" in p else {})}
        vision, vision_ops = p["vision"], {}
        if vision.startswith(MIXED_PREFIX):
            if not mixed or vision not in mixed:
                raise VlsensError(f"front point names vision {vision!r}, which the search was not given")
            estimate["vision_option"] = vision
            vision, vision_ops = MIXED, dict(mixed[vision])
        bits = {n: d["bits"][n] for n in ops}
        algos = {n: per_width[b][n] for n, b in bits.items() if b and n in per_width.get(b, {})}
        plans.append(Plan(f"p{k}", vision, p["embedding"], bits, settings, estimate, vision_ops, algos,
                          calibration if data_aware(algos.values()) else ""))
    return plans


def _entry_bytes(message) -> int:
    """What one element of a repeated message field of a graph costs in the file beside any tensor
    bytes it holds inline (those the CSV counts): its tag (one byte: ``node`` and ``initializer``
    are fields 1 and 5), its length as a varint, itself."""
    n = message.ByteSize()
    inline = len(message.raw_data) if hasattr(message, "raw_data") else 0
    return 1 + max(1, (n.bit_length() + 6) // 7) + n - inline


def op_entries(model) -> dict[str, int]:
    """Per weight MatMul of a graph (float ``MatMul`` or ``MatMulNBits`` ``<name>_Q<bits>``) the
    bytes its node and its initializers' entries take in the ``.onnx`` file (their data is in
    the data file): names differ in length, so each op's are its own."""
    import onnx

    from vlsens.core.onnxgraph import input_scale, producers

    m = onnx.load(str(model), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    writers = producers(m.graph.node)
    out = {}
    for n in m.graph.node:
        if n.op_type not in ("MatMul", "MatMulNBits") or not any(x in inits for x in n.input[1:]):
            continue
        awq = input_scale(n, writers, inits) if n.op_type == "MatMulNBits" else None
        out[n.name.rsplit("_Q", 1)[0] if n.op_type == "MatMulNBits" else n.name] = \
            _entry_bytes(n) + sum(_entry_bytes(inits[x]) for x in n.input[1:] if x in inits) + \
            (_entry_bytes(awq[0]) + _entry_bytes(awq[1]) if awq else 0)
    return out


def shipped_rows(eng_dir, rows: Sequence[Mapping]) -> list[dict]:
    """``rows`` with each quantized MatMul's bytes as a graph file ships it: the CSV counts the
    weights' bytes; a ``MatMulNBits`` node and its initializers' entries take other bytes in the
    graph than the float node and weight they replace (about 340 more each on the tiny preset),
    read per op and width from the engine's all-INT4 / all-INT8 graphs against its float one
    (:func:`op_entries`; what is left of the graphs' difference, the external data offsets'
    digits, spread evenly)."""
    from vlsens.core.onnxutil import model_bytes
    from vlsens.sensitivity import nbits as nb

    folder, n = Path(eng_dir.folder), len(rows)
    base = model_bytes(folder / nb.FILES["float"]) - sum(r["bytes_float"] for r in rows)
    flt = op_entries(folder / nb.FILES["float"])
    extra = {}
    for b in (4, 8):
        q = op_entries(folder / nb.FILES[f"q{b}"])
        per_op = {r["op"]: q.get(r["op"], 0) - flt.get(r["op"], 0) for r in rows}
        rest = model_bytes(folder / nb.FILES[f"q{b}"]) - sum(r[f"bytes_int{b}"] for r in rows) - base - sum(per_op.values())
        extra[b] = {op: v + rest / n for op, v in per_op.items()}
    return [{**r, **{f"bytes_int{b}": int(round(r[f"bytes_int{b}"] + extra[b][r["op"]])) for b in (4, 8)}} for r in rows]


@dataclass(frozen=True)
class Extras:
    """What a search adds to the decoder's curve and the parts: ``mixed``, the Linears' bits of each
    ``mixed:<k>`` vision option the components hold; ``anchor_bytes``, the anchors' folder bytes
    (the point at each is picked); ``uniform_ms``, the measured decode step of the uniform
    decoders (width -> ms), from which each decoder point's ``decode_ms`` is estimated
    (:func:`vlsens.budget.latency.estimate_ms`)."""

    mixed: Mapping[str, Mapping] | None = None
    anchor_bytes: Sequence[int] = ()
    uniform_ms: Mapping[int, float] | None = None


def search(engine_dir: str | Path, eval_npz: str | Path, csv: str | Path, components: Mapping, other_bytes: int,
           points: int = 8, max_evals: int = 60, threads: int = 0,
           extras: Extras | None = None) -> tuple[list[Plan], dict]:
    """The plans of the measured front and the search's record. On the ``nbits`` engine folder
    (its session on ``eval_npz``, ``threads``) and its sensitivity ``csv``: the decoder's curve at
    :data:`BUDGETS` budgets geometric between the all-INT4 and all-float weight bytes (at most
    ``max_evals`` measured assignments each, :func:`decoder_curve`), combined with ``components``
    and ``other_bytes`` (:func:`combine`), ``points`` plans picked (:func:`pick`), among them the
    point at each anchor's bytes (:func:`at_bytes`; :class:`Extras`)."""
    import pandas as pd

    from vlsens.sensitivity import nbits as nb

    t0 = time.perf_counter()
    eng_dir = nb.Prepared(engine_dir)
    if not eng_dir.meta["logits"]:
        raise VlsensError(f"{engine_dir}: the engine's graph has no logits; the front is measured in KL")
    rows = pd.read_csv(csv).to_dict("records")
    if sorted(r["op"] for r in rows) != sorted(eng_dir.ops):
        raise VlsensError(f"{csv} does not list the engine's ops ({engine_dir})")
    rows = shipped_rows(eng_dir, rows)
    eng, ref = eng_dir.session(eval_npz, threads), eng_dir.reference()
    measured = Measured(lambda a: nb.error(eng.evaluate(a, ref), True))
    low = assignment_bytes(rows, {r["op"]: 4 for r in rows})
    budgets = budgets_between(low, assignment_bytes(rows, {}))
    curve = decoder_curve(measured, rows, budgets, max_evals)
    extras = extras or Extras()
    if extras.uniform_ms:
        from vlsens.budget.latency import estimate_ms

        for d in curve:
            d["decode_ms"] = estimate_ms(d["bits"], rows, extras.uniform_ms)
    t_curve = time.perf_counter()
    # the all-float point with the fp32 vision graph and table is the fp32 folder, the reference
    front = [p for p in combine(curve, components, other_bytes) if not is_reference(curve, p)]
    required = [p for p in (at_bytes(front, b) for b in extras.anchor_bytes) if p is not None]
    plans = _plans(curve, pick(front, points, required), eng_dir.ops, eng_dir.settings.as_dict(), extras.mixed,
                   eng_dir.meta.get("algorithms"), calibration_of(eng_dir.meta))
    record = {"engine_dir": str(engine_dir), "metric": "kl", "settings": eng_dir.settings.as_dict(),
              "budgets": budgets, "max_evals": max_evals, "other_bytes": int(other_bytes),
              "float_bytes": {r["op"]: int(r["bytes_float"]) for r in rows},
              "components": {k: dict(v) for k, v in components.items()}, "curve": curve, "front": front,
              "picked": [p.entry() for p in plans],
              "evaluations": {"measured": measured.evaluations, "asked": measured.calls},
              "seconds": {"curve": t_curve - t0, "total": time.perf_counter() - t0}}
    log.info("front: %d decoder points, %d front points, %d plans; %d assignments measured (%d asked) in %.0f s",
             len(curve), len(front), len(plans), measured.evaluations, measured.calls, t_curve - t0)
    return plans, record
