"""Sensitivity rows: ranks, the CSV every engine writes, and shards of the op list.

Columns: ``rank`` (1 = most sensitive), ``op``, ``op_type``, ``block``, ``role``,
``weight_params``, ``mse``, ``cosine``, ``sqnr_db``; graphs with logits add ``kl`` and ``top1``;
engines with 16-bit activations add each metric at W8A16 (``mse_a16``, ``cosine_a16`` ...). The
rank is by the W8A8 MSE.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.fsutil import write_csv as _write_csv

CSV_COLUMNS = ["rank", "op", "op_type", "block", "role", "weight_params", "mse", "cosine", "sqnr_db"]
#: Extra columns of CSVs of graphs with logits: KL(float || int8) per position and top-1 agreement.
LOGIT_COLUMNS = ["kl", "top1"]
#: Suffix of the W8A16 columns (engines with 16-bit activations: ``mse_a16`` ... beside ``mse`` ...).
WIDE_SUFFIX = "_a16"


def rank_rows(rows: list[dict]) -> list[dict]:
    """Rank 1 = most sensitive (largest MSE); ties keep graph order."""
    order = sorted(range(len(rows)), key=lambda i: (-rows[i]["mse"], i))
    ranked = [dict(rows[i]) for i in order]
    for r, row in enumerate(ranked, 1):
        row["rank"] = r
    return ranked


def write_csv(rows: list[dict], path: str | Path) -> None:
    cols = CSV_COLUMNS if rows and "rank" in rows[0] else [c for c in CSV_COLUMNS if c != "rank"]
    if rows and all(c in rows[0] for c in LOGIT_COLUMNS):
        cols = cols + LOGIT_COLUMNS
    if rows and f"mse{WIDE_SUFFIX}" in rows[0]:
        metrics = [c for c in cols if c not in ("rank", "op", "op_type", "block", "role", "weight_params")]
        cols = cols + [f"{c}{WIDE_SUFFIX}" for c in metrics]
    _write_csv(path, rows, cols)


def read_csv(path: str | Path) -> list[dict]:
    import pandas as pd

    df = pd.read_csv(path, keep_default_na=False, dtype={"block": str})
    rows = df.to_dict("records")
    for r in rows:  # plain Python types (YAML/JSON friendly); block "" = not in a block
        for k, v in r.items():
            if isinstance(v, np.generic):
                r[k] = v.item()
        r["block"] = int(r["block"]) if str(r["block"]).strip() else ""
    return rows


def shard(items: Sequence, index: int, count: int) -> list:
    """Contiguous shard ``index`` (0-based) of ``count``; shards cover ``items`` exactly once."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}")
    bounds = np.linspace(0, len(items), count + 1).round().astype(int)
    return list(items[bounds[index]:bounds[index + 1]])
