"""Stage: the two sensitivity engines side by side (``compare.json`` per size x variant).

Both CSVs name ops by the exported graph (``inc`` maps INC's renamed nodes back). Over the ops
both engines scored: Spearman rank correlation of the sensitivity scores (average ranks for
ties), overlap of the top-k most sensitive ops, and each engine's seconds per op as measured in
the run that produced its CSV (``ort.json`` / ``inc.json``), on the same evaluation set (checked
by its SHA-256).

Scores, most sensitive = highest: ``ort`` -> ``mse`` (op k alone INT8); ``inc`` -> ``-mse`` (op k
alone back in FP32, everything else INT8: a low error means the op matters).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from vlsens.core.errors import VlsensError
from vlsens.core.fsutil import write_json
from vlsens.core.metrics import average_ranks, spearman  # noqa: F401  (average_ranks: part of this module's API)
from vlsens.sensitivity.ranking import read_csv

#: engine -> sign that turns its CSV's ``mse`` into "higher = more sensitive"
SCORE_SIGN = {"ort": 1.0, "inc": -1.0}


def top_k(names: Sequence[str], scores: Sequence[float], k: int) -> list[str]:
    """The k highest-scoring names (ties keep the given order)."""
    order = sorted(range(len(names)), key=lambda i: (-scores[i], i))
    return [names[i] for i in order[:k]]


def compare(csvs: dict[str, str | Path], summaries: dict[str, str | Path], ks: Sequence[int] = (1, 5, 10)) -> dict:
    """The comparison record of two engines' CSVs (keys of ``csvs``: engine names)."""
    engines = list(csvs)
    if len(engines) != 2:
        raise ValueError(f"compare needs two engines, got {engines}")
    rows = {e: {r["op"]: r for r in read_csv(csvs[e])} for e in engines}
    info = {e: json.loads(Path(summaries[e]).read_text()) for e in engines}
    a, b = engines
    common = [op for op in rows[a] if op in rows[b]]  # in a's rank order
    score = {e: [SCORE_SIGN[e] * float(rows[e][op]["mse"]) for op in common] for e in engines}
    shas = {e: info[e].get("eval_sha256") for e in engines}
    record = {
        "engines": engines,
        "ops": {e: len(rows[e]) for e in engines},
        "common_ops": len(common),
        "only_in": {e: sorted(set(rows[e]) - set(common)) for e in engines},
        "spearman": spearman(score[a], score[b]) if len(common) > 1 else None,
        "top_k": {},
        "seconds_per_op": {e: info[e]["seconds_per_op"] for e in engines},
        "timing_source": {e: f"{Path(summaries[e]).name}: the run that wrote {Path(csvs[e]).name}" for e in engines},
        "eval_images": {e: info[e].get("eval_images") for e in engines},
        "same_eval_data": len(set(shas.values())) == 1 and None not in shas.values(),
        "eval_sha256": shas,
        "bounded": {e: bool(info[e].get("bounded", False)) for e in engines},
        "score": {e: ("mse" if SCORE_SIGN[e] > 0 else "-mse") + " (higher = more sensitive)" for e in engines},
    }
    record["speed_ratio"] = (record["seconds_per_op"][b] / record["seconds_per_op"][a]
                             if record["seconds_per_op"][a] else None)
    for k in ks:
        k_eff = min(int(k), len(common))
        if k_eff == 0:
            continue
        ta, tb = top_k(common, score[a], k_eff), top_k(common, score[b], k_eff)
        record["top_k"][str(k)] = {"k": k_eff, "overlap": len(set(ta) & set(tb)) / k_eff, a: ta, b: tb}
    return record


def compare_stage(csvs: dict, summaries: dict, out_json: str | Path, ks: Sequence[int]) -> dict:
    record = compare(csvs, summaries, ks)
    if not record["same_eval_data"]:
        raise VlsensError(f"compare: the engines were measured on different evaluation sets: {record['eval_sha256']}")
    write_json(out_json, record)
    return record
