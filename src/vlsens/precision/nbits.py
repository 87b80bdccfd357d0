"""The weight-only mixed-precision profile: every weight MatMul INT4, INT8 or float, the fewest
bytes whose error meets the target, built by ONNX Runtime's ``MatMulNBitsQuantizer`` and measured.

Search (every candidate measured exactly in the ``nbits`` engine's switch session, which equals the
built model kernel for kernel, :mod:`vlsens.sensitivity.nbits`):

1. all INT4; done when it meets the target;
2. upgrades INT4 -> INT8 in the order of error saved per byte added,
   ``(error_int4 - error_int8) / (bytes_int8 - bytes_int4)`` from the sensitivity CSV; the
   shortest prefix that meets the target, by bisection (errors fall as ops are upgraded);
3. when even all INT8 misses it: INT8 -> float in the order of ``error_int8 / (bytes_float -
   bytes_int8)``, the shortest prefix likewise;
4. a pass that returns each upgraded op to its lower width when the target still holds without it
   (the cheapest first), within ``max_evals``.

The built model is measured again on its own (a plain session); the job fails when the built
error differs from the search's estimate (they are the same arithmetic) or misses the target.

Tied table (``deploy.nbits.embedding: tied``): the deploy folders' embedding then gathers lm_head's
weight at lm_head's bits, so lm_head's error is its own plus its table's. Every measurement of the
search (and of the built model, and at the heuristic's bytes) then feeds the decoder the evaluation
set's embeddings with every text row gathered from lm_head's weight at the bits the assignment
gives it (:func:`tied_feeds`; the text rows are found by their exact equality with the float
table's rows), and lm_head's row of the sensitivity CSV is measured again that way before the
search (the engine's CSV measures each MatMul with float embeddings).

The profile (:func:`profile_folder`), like the builder's ``-p int4`` decoders it is compared with
(:mod:`vlsens.deploy.genai.anchors`), is published as a decoder variant folder: ``model.onnx``
and the FP32 folder's ``embedding.onnx``, gated against transformers on the decoder's parity
cases (``deploy.nbits.tolerance``), the parity record carrying the bits of every MatMul.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vlsens.quantize.nbits import FLOAT, quantize, quantized_nodes, weight_matmuls
from vlsens.sensitivity import nbits as nb

if TYPE_CHECKING:
    from vlsens.variants import Gate

log = logging.getLogger(__name__)

MODEL = "model.onnx"
BITS_FILE = "bits.json"
EVAL = "eval.json"


def _ratio(saved: float, added: float) -> float:
    return saved / added if added > 0 else float("inf")


def search(measure, rows: Sequence[Mapping], target: float, max_evals: int = 200) -> tuple[dict[str, int], list[dict]]:
    """The assignment ``{op: bits}`` (0: float) and the trace of measured candidates; ``measure``
    maps an assignment to its error (lower is better)."""
    names = [r["op"] for r in rows]
    by = {r["op"]: r for r in rows}
    trace: list[dict] = []

    def cost(a: Mapping[str, int]) -> int:
        return sum(by[n]["bytes_float"] if b == FLOAT else by[n][f"bytes_int{b}"] for n, b in a.items())

    def run(a: dict[str, int], step: str) -> float:
        e = float(measure(a))
        trace.append({"step": step, "int4": sum(b == 4 for b in a.values()), "int8": sum(b == 8 for b in a.values()),
                      "float": sum(b == FLOAT for b in a.values()), "bytes": cost(a), "error": e})
        log.info("search %d: %s -> %.4g (%d bytes)", len(trace), step, e, trace[-1]["bytes"])
        return e

    def shortest(prefix_of, n: int, step: str) -> int | None:
        """Smallest k in 1..n with prefix_of(k) meeting the target (None if n does not)."""
        if run(prefix_of(n), f"{step} all {n}") > target:
            return None
        lo, hi = 0, n  # prefix_of(lo) misses (lo = 0 measured by the caller), prefix_of(hi) meets
        while hi - lo > 1 and len(trace) < max_evals:
            mid = (lo + hi) // 2
            if run(prefix_of(mid), f"{step} {mid}") <= target:
                hi = mid
            else:
                lo = mid
        return hi

    base = dict.fromkeys(names, 4)
    if run(base, "all int4") <= target:
        chosen = base
    else:
        up8 = sorted(names, key=lambda n: -_ratio(by[n]["error_int4"] - by[n]["error_int8"],
                                                   by[n]["bytes_int8"] - by[n]["bytes_int4"]))
        k = shortest(lambda k: {**base, **dict.fromkeys(up8[:k], 8)}, len(up8), "int8")
        if k is not None:
            chosen = {**base, **dict.fromkeys(up8[:k], 8)}
        else:
            all8 = dict.fromkeys(names, 8)
            upf = sorted(names, key=lambda n: -_ratio(by[n]["error_int8"], by[n]["bytes_float"] - by[n]["bytes_int8"]))
            j = shortest(lambda j: {**all8, **dict.fromkeys(upf[:j], FLOAT)}, len(upf), "float")
            chosen = {**all8, **dict.fromkeys(upf[:j], FLOAT)} if j is not None else dict.fromkeys(names, FLOAT)
    # Give back what the target does not need, the largest savings first.
    lower = {FLOAT: 8, 8: 4}
    for n in sorted((n for n, b in chosen.items() if b != 4),
                    key=lambda n: -(by[n]["bytes_float"] if chosen[n] == FLOAT else by[n]["bytes_int8"])):
        if len(trace) >= max_evals:
            break
        trial = {**chosen, n: lower[chosen[n]]}
        if run(trial, f"lower {n}") <= target:
            chosen = trial
    return chosen, trace


def search_budget(measure, rows: Sequence[Mapping], budget: int, max_evals: int = 200,
                  candidates: int = 8) -> tuple[dict[str, int], float]:
    """The lowest-error assignment whose weights fit ``budget`` bytes (the comparison with another
    model of that size). Four strategies from all INT4, every result measured, the best kept:
    two fills that widen ops (INT4 -> INT8, then INT8 -> float) while they fit, in the order of
    estimated error saved per byte and of estimated error (the sensitivity CSV); and two measured
    greedies that, each step, measure the ``candidates`` best-estimated widenings that fit and keep
    the one saving the most measured error per byte, or the most measured error. An op whose INT8
    costs more than its INT4 (:func:`_int8_dominated`) widens from INT4 straight to float.

    ``max_evals`` bounds the measured assignments besides all INT4 (which the caller's memoizing
    ``measure`` has measured once): 1 measures the per-byte fill alone, the one that finds the
    lower KL at nearly every budget (docs/plan.md, "One measured assignment per budget"); 2 both
    fills; more lets the greedies step."""
    by = {r["op"]: r for r in rows}
    names = [r["op"] for r in rows]
    evals = [0]

    def run(a):
        evals[0] += 1
        if evals[0] % 10 == 0:
            log.info("search within %d bytes: %d assignments measured", budget, evals[0])
        return float(measure(a))

    def cost(a):
        return sum(by[n]["bytes_float"] if b == FLOAT else by[n][f"bytes_int{b}"] for n, b in a.items())

    skip = _int8_dominated(rows)

    def widen(n, b):
        return _widen(by[n], b, n in skip)

    def greedy(per_byte: bool):
        a = dict.fromkeys(names, 4)
        e = run(a)
        while evals[0] < max_evals:
            options = [(n, *widen(n, a[n])) for n in names if widen(n, a[n]) is not None]
            options = sorted((o for o in options if cost({**a, o[0]: o[1]}) <= budget),
                             key=lambda o: -_ratio(o[2], o[3]))[:candidates]
            best = None
            for n, b, _, added in options:
                t = run({**a, n: b})
                gain = _ratio(e - t, added) if per_byte else e - t
                if t < e and (best is None or gain > best[0]):
                    best = (gain, n, b, t)
            if best is None:
                break
            a, e = {**a, best[1]: best[2]}, best[3]
        return a, e

    fills = (lambda o: _ratio(o[2], o[3]), lambda o: o[2])  # per byte, by error
    found = [(a, run(a)) for a in (_fill(names, widen, cost, budget, key) for key in fills[:max(1, max_evals)])]
    found += [greedy(True), greedy(False)]
    return min(found, key=lambda x: x[1])


def _fill(names: Sequence[str], widen, cost, budget: int, key) -> dict[str, int]:
    """From all INT4, the widening ``widen(op, bits)`` -> ``(width, error saved, bytes added)`` of
    largest ``key`` while the assignment's ``cost`` fits ``budget``."""
    a = dict.fromkeys(names, 4)
    while True:
        options = [(n, *widen(n, a[n])) for n in names if widen(n, a[n]) is not None]
        options = [o for o in options if cost({**a, o[0]: o[1]}) <= budget]
        if not options:
            return a
        n, b, *_ = max(options, key=key)
        a = {**a, n: b}


def _widen(r: Mapping, b: int, skip_int8: bool) -> tuple | None:
    """``(width, error saved, bytes added)`` of the next wider format of the op of row ``r`` at ``b``
    bits (None at float): INT4 -> INT8 -> float, or INT4 -> float where ``skip_int8``."""
    if b == 4 and skip_int8:  # its INT8 costs more than its INT4: INT4 widens to float
        return FLOAT, r["error_int4"], r["bytes_float"] - r["bytes_int4"]
    if b == 4:
        return 8, r["error_int4"] - r["error_int8"], r["bytes_int8"] - r["bytes_int4"]
    if b == 8:
        return FLOAT, r["error_int8"], r["bytes_float"] - r["bytes_int8"]
    return None


def _int8_dominated(rows: Sequence[Mapping]) -> set[str]:
    """The ops whose INT8 error exceeds their (positive) INT4 error by more than the table's noise,
    the largest negative error in it (an op's error below zero is the measure's own noise): a
    data-aware INT4 (AWQ on an outlier channel) against a data-free INT8. The search widens their
    INT4 straight to float."""
    noise = max([0.0] + [-float(r[f"error_int{b}"]) for r in rows for b in (4, 8)])
    return {r["op"] for r in rows if float(r["error_int4"]) > 0 and
            float(r["error_int8"]) - float(r["error_int4"]) > noise}


def _fingerprints(rows: np.ndarray, coeff: np.ndarray) -> np.ndarray:
    """A 64-bit fingerprint of each float32 row (its bits, a fixed random linear form mod 2**64)."""
    out = np.empty(len(rows), np.uint64)
    for i in range(0, len(rows), 4096):
        out[i:i + 4096] = (rows[i:i + 4096].view(np.uint32).astype(np.uint64) * coeff).sum(axis=1, dtype=np.uint64)
    return out


def text_ids(embeds: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The token id of every row of ``embeds`` (..., H) that equals a row of ``table`` (V, H) bit
    for bit (a text position), -1 elsewhere (image features)."""
    flat = np.ascontiguousarray(embeds, np.float32).reshape(-1, table.shape[1])
    coeff = np.random.default_rng(0).integers(1, 2 ** 63, table.shape[1], dtype=np.uint64) | np.uint64(1)
    ft = _fingerprints(table, coeff)
    order = np.argsort(ft, kind="stable")
    fe = _fingerprints(flat, coeff)
    pos = np.minimum(np.searchsorted(ft[order], fe), len(order) - 1)
    ids = order[pos]
    hit = (ft[ids] == fe) & np.all(table[ids] == flat, axis=1)
    return np.where(hit, ids, -1).reshape(embeds.shape[:-1])


def tied_feeds(feeds: Sequence[Mapping[str, np.ndarray]], float_table: np.ndarray,
               tables: Mapping[int, np.ndarray], name: str = "inputs_embeds") -> tuple[dict[int, list], dict]:
    """``{bits: feeds}``: ``feeds`` with every text row of ``name`` (a row equal to one of
    ``float_table``'s, :func:`text_ids`) replaced by that token's row of ``tables[bits]`` (lm_head's
    weight at those bits; ``FLOAT``: the feeds themselves). Facts: text rows found per feed."""
    out: dict[int, list] = {FLOAT: list(feeds)}
    ids = []
    for f in feeds:
        if name not in f:
            raise ValueError(f"a tied table needs the decoder's '{name}' input; the feeds have {sorted(f)[:4]}")
        ids.append(text_ids(f[name], float_table))
    if not any((i >= 0).any() for i in ids):
        raise ValueError(f"no row of '{name}' equals a row of the float table: not the table the embeddings came from")
    for b, t in tables.items():
        new = []
        for f, i in zip(feeds, ids, strict=True):
            e = np.array(f[name], np.float32, copy=True)
            e[i >= 0] = t[i[i >= 0]]
            new.append({**f, name: e})
        out[b] = new
    return out, {"text_rows": [int((i >= 0).sum()) for i in ids], "rows": [int(i.size) for i in ids]}


def engine_tied_feeds(eng_dir, feeds, others: Mapping[str, str | Path] | None = None) -> tuple[str, dict, dict]:
    """lm_head's name and :func:`tied_feeds` from the engine folder's float / all-INT4 / all-INT8
    models (the weights the switch session multiplies by); ``others``: ``{key: decoder}``, more
    feeds under ``key`` gathered from that decoder's lm_head."""
    import onnx

    from vlsens.quantize.nbits import lm_head, lm_head_table

    node, _ = lm_head(onnx.load(str(eng_dir.folder / nb.FILES["float"]), load_external_data=False))
    float_table = lm_head_table(eng_dir.folder / nb.FILES["float"])
    tables = {b: lm_head_table(eng_dir.folder / nb.FILES[f"q{b}"]) for b in nb.BITS}
    tables.update({k: lm_head_table(m) for k, m in (others or {}).items()})
    by_bits, facts = tied_feeds(feeds, float_table, tables)
    return node.name, by_bits, facts


def _search(eng, ref, rows, target, max_evals):
    """:func:`search` in the engine's session; also the chosen assignment's metrics."""
    chosen, trace = search(lambda a: nb.error(eng.evaluate(a, ref), eng.logits), rows, target, max_evals)
    return chosen, trace, eng.evaluate(chosen, ref)


@dataclass(frozen=True)
class SearchSettings:
    """The profile search's knobs: the error ``target`` (KL with logits, else 1 - cosine), at most
    ``max_evals`` measured assignments, sessions on ``threads``; ``tied``: lm_head measured with its
    table (the module's "Tied table")."""

    target: float
    max_evals: int = 200
    threads: int = 0
    tied: bool = False


def _tie_lm_head(eng_dir, eng, rows: list[dict], ref) -> tuple[dict, dict]:
    """The session ``eng`` fed lm_head's tied table and lm_head's row of ``rows`` measured again that
    way (both in place). Returns the record's ``tied`` and the feeds by lm_head's bits."""
    lm, by_bits, facts = engine_tied_feeds(eng_dir, eng.samples.feeds)
    eng.tie(lm, by_bits)
    row = next(r for r in rows if r["op"] == lm)
    tie = {"op": lm, **facts, "csv": {f"error_int{b}": row[f"error_int{b}"] for b in nb.BITS}}
    for b in nb.BITS:
        row[f"error_int{b}"] = nb.error(eng.evaluate({lm: b}, ref), eng.logits)
    tie["with_table"] = {f"error_int{b}": row[f"error_int{b}"] for b in nb.BITS}
    log.info("lm_head with its tied table: error INT4 %.4g (alone %.4g), INT8 %.4g (alone %.4g)",
             row["error_int4"], tie["csv"]["error_int4"], row["error_int8"], tie["csv"]["error_int8"])
    return tie, by_bits


#: How far the built model's error may be from the search's estimate of it. The two are the same
#: quantized MatMuls; on the random tiny preset they agree exactly, on the trained preset (activations
#: of a trained model) the built model's KL was 1.9 % above the engine's (9.29e-5 against 9.12e-5).
BUILD_TOLERANCE = 0.05
#: Below this relative difference the built model's error and the search's are the rounding of two
#: sessions summing in another order (a log line, not a warning).
BUILD_NOISE = 1e-3


def _check_built(e_built: float, e_est: float) -> None:
    """The built model's error is the search's estimate of it, within :data:`BUILD_TOLERANCE`
    (a VlsensError beyond it; a warning where it is not exact)."""
    from vlsens.core.errors import VlsensError

    if abs(e_built - e_est) > BUILD_TOLERANCE * max(abs(e_est), 1e-30):
        raise VlsensError(f"the built model's error {e_built:.6g} differs from the search's {e_est:.6g} by more "
                          f"than {BUILD_TOLERANCE:.0%}: the engine and the build are not the same arithmetic")
    rel = abs(e_built - e_est) / max(abs(e_est), 1e-30)
    # the same quantized MatMuls in two sessions: below BUILD_NOISE their sums' order alone (logged)
    (log.warning if rel > BUILD_NOISE else log.info)(
        "the built model's error %.6g differs from the search's %.6g (%.2g relative)", e_built, e_est, rel)


def _measure_built(model: Path, eng_dir, eval_npz, ref, feeds, threads: int) -> dict:
    """The built model's metrics on the evaluation set in a plain session, against the engine's
    reference; ``feeds``: the tied feeds at lm_head's bits (None: the evaluation set's own)."""
    from vlsens.core.metrics import Metrics
    from vlsens.core.onnxutil import make_session

    sess = make_session(model, threads=threads)
    acc = Metrics(eng_dir.meta["logits"])
    samples = eng_dir.samples(eval_npz)
    feeds = samples.feeds if feeds is None else feeds
    out_name = sess.get_outputs()[0].name
    for i, feed in enumerate(feeds):
        rows, valid = nb.plain_rows(sess, out_name, feed, samples.valid[i])
        acc.add(rows, ref[i], valid)
    return acc.result()


def build(engine_dir: str | Path, eval_npz: str | Path, sensitivity_csv: str | Path, out_dir: str | Path,
          search: SearchSettings) -> dict:
    """Search, build and measure the profile into ``out_dir`` (staged; ``eval.json`` last)."""
    import pandas as pd

    from vlsens.core.errors import VlsensError
    from vlsens.core.fsutil import atomic_dir, write_json

    t0 = time.perf_counter()
    target = search.target
    eng_dir = nb.Prepared(engine_dir)
    ref = eng_dir.reference()
    rows = pd.read_csv(sensitivity_csv).to_dict("records")
    if sorted(r["op"] for r in rows) != sorted(eng_dir.ops):
        raise VlsensError(f"{sensitivity_csv} does not list the engine's ops ({engine_dir})")
    eng = eng_dir.session(eval_npz, search.threads)
    tie, by_bits = _tie_lm_head(eng_dir, eng, rows, ref) if search.tied else (None, None)
    chosen, trace, estimate = _search(eng, ref, rows, target, search.max_evals)
    del eng
    t_search = time.perf_counter()
    with atomic_dir(out_dir) as tmp:
        model = quantize(eng_dir.folder / nb.FILES["float"], tmp / MODEL, {n: b for n, b in chosen.items() if b},
                         eng_dir.settings)
        built = _measure_built(model, eng_dir, eval_npz, ref, None if tie is None else by_bits[chosen[tie["op"]]],
                               search.threads)
        e_est, e_built = nb.error(estimate, eng_dir.meta["logits"]), nb.error(built, eng_dir.meta["logits"])
        _check_built(e_built, e_est)
        if e_built > target:
            raise VlsensError(f"the built model's error {e_built:.6g} misses the target {target:g}")
        by = {r["op"]: r for r in rows}
        nodes = quantized_nodes(model)
        size = {"float": sum(r["bytes_float"] for r in rows),
                "chosen": sum(nodes[n]["bytes"] if n in nodes else by[n]["bytes_float"] for n in chosen),
                "all_int4": sum(r["bytes_int4"] for r in rows), "all_int8": sum(r["bytes_int8"] for r in rows)}
        write_json(tmp / BITS_FILE, {n: chosen[n] for n in eng_dir.ops})
        record = {
            "engine": "nbits",
            "settings": eng_dir.settings.as_dict(),
            "metric": "kl" if eng_dir.meta["logits"] else "1 - cosine",
            "target": target,
            "estimate": estimate,
            "built": built,
            "ops": {"int4": sum(b == 4 for b in chosen.values()), "int8": sum(b == 8 for b in chosen.values()),
                    "float": sum(b == FLOAT for b in chosen.values())},
            "weight_bytes": size,
            "not_int4": [{"op": n, "bits": b, "error_int4": by[n]["error_int4"], "rank": int(by[n]["rank"])}
                         for n, b in chosen.items() if b != 4],
            "trace": trace,
            "tied": tie,
            "seconds": {"search": t_search - t0, "total": time.perf_counter() - t0},
        }
        write_json(tmp / EVAL, record)
    log.info("nbits profile: %s INT4, %s INT8, %s float; %.4g (target %.4g); %d of %d weight bytes",
             record["ops"]["int4"], record["ops"]["int8"], record["ops"]["float"], e_built, target,
             size["chosen"], size["float"])
    return record


def weight_facts(model: str | Path) -> dict:
    """Bits of every weight MatMul (0: float) and the bytes of all their weights as stored."""
    nodes = quantized_nodes(model)
    floats = {o["name"]: 4 * o["K"] * o["N"] for o in weight_matmuls(model)}
    return {"bits": {**{n: v["bits"] for n, v in nodes.items()}, **dict.fromkeys(floats, FLOAT)},
            "weight_bytes": sum(v["bytes"] for v in nodes.values()) + sum(floats.values())}


def compare_at_bytes(engine_dir: str | Path, eval_npz: str | Path, sensitivity_csv: str | Path,
                     other: str | Path, threads: int = 0, max_evals: int = 200, tied: bool = False) -> dict:
    """``other`` (a decoder from the builder) measured on the engine's evaluation set, against
    the lowest-error assignment :func:`search_budget` finds within its weight bytes (at most
    ``max_evals`` measured assignments). ``tied``: both with their tables gathered from their own
    lm_head weights."""
    import pandas as pd

    from vlsens.core.metrics import Metrics
    from vlsens.core.onnxutil import make_session

    eng_dir = nb.Prepared(engine_dir)
    eng, ref = eng_dir.session(eval_npz, threads), eng_dir.reference()
    rows = pd.read_csv(sensitivity_csv).to_dict("records")
    facts = weight_facts(other)
    feeds = eng.samples.feeds
    if tied:
        lm, by_bits, _ = engine_tied_feeds(eng_dir, feeds, {"other": other})
        feeds = by_bits.pop("other")
        eng.tie(lm, by_bits)
    sess, acc = make_session(other, threads=threads), Metrics(eng.logits)
    out = sess.get_outputs()[0].name
    for i, feed in enumerate(feeds):
        got, valid = nb.plain_rows(sess, out, feed, eng.samples.valid[i])
        acc.add(got, ref[i], valid)
    del sess
    theirs = nb.error(acc.result(), eng.logits)
    t0 = time.perf_counter()
    mine, e = search_budget(lambda a: nb.error(eng.evaluate(a, ref), eng.logits), rows, facts["weight_bytes"],
                            max_evals)
    log.info("at the heuristic's %d weight bytes: searched in %.0f s", facts["weight_bytes"], time.perf_counter() - t0)
    by = {r["op"]: r for r in rows}
    mine_bytes = sum(by[n]["bytes_float"] if b == FLOAT else by[n][f"bytes_int{b}"] for n, b in mine.items())
    return {"other": str(other), "other_weight_bytes": facts["weight_bytes"], "other_error": theirs,
            "other_not_int4": {n: b for n, b in facts["bits"].items() if b != 4},
            "vlsens_weight_bytes": mine_bytes, "vlsens_error": e,
            "vlsens_not_int4": {n: b for n, b in mine.items() if b != 4},
            "error_ratio": e / theirs if theirs > 0 else None, "tied": tied}


def profile_folder(engine_dir: str | Path, eval_npz: str | Path, sensitivity_csv: str | Path, fp32_dir: str | Path,
                   reference: str | Path, out_dir: str | Path, search: SearchSettings, gate: Gate,
                   heuristic: str | Path | None = None) -> dict:
    """The int4-mixed decoder folder: search (:func:`search`, with ``search``'s settings), build,
    measure the built model against the search, gate against transformers on its own weights
    (``gate``, with the tower's ``reference_for``:
    :func:`vlsens.variants.gate_own_weights`), publish. ``heuristic``: a builder decoder to
    compare with at its own weight bytes (:func:`compare_at_bytes`, in the record)."""
    import shutil
    import tempfile

    from vlsens.core.onnxutil import copy_model
    from vlsens.variants import variant_folder

    with tempfile.TemporaryDirectory(prefix="vlsens-nbits-") as work:
        found = build(engine_dir, eval_npz, sensitivity_csv, Path(work) / "profile", search)
        if heuristic is not None:
            found["at_heuristic_bytes"] = compare_at_bytes(engine_dir, eval_npz, sensitivity_csv, heuristic,
                                                           search.threads, search.max_evals, search.tied)
        built = Path(work) / "profile" / MODEL

        def transform(src: Path, feeds, staged: Path) -> dict:
            if src.name != MODEL:
                copy_model(src, staged)
                return {}
            copy_model(built, staged)
            return {**weight_facts(staged), "search": {k: v for k, v in found.items() if k != "settings"},
                    "settings": found["settings"]}

        record = variant_folder(fp32_dir, reference, out_dir, "int4-mixed", transform, gate)
        shutil.rmtree(Path(work) / "profile", ignore_errors=True)
    return record
