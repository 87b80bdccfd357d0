"""The report's tables: self-contained HTML documents (no script, inline style), one row per
record."""

from __future__ import annotations

import html
from pathlib import Path

from vlsens.core.fsutil import atomic_file

PARITY_COLUMNS = ["artifact", "variant", "gate", "max rel error", "min cosine", "passed"]
PROFILE_COLUMNS = ["graph", "base", "target", "quant target", "estimate → built", "builds", "status", "INT8 ops",
                   "INT8 weights", "latency fp32 / int8-mixed (ms)", "speed-up vs fp32", "size (MB)"]

_STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1em; color: #222; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fde0dc; }
p { max-width: 60em; }
"""


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _gate(tol: dict | None) -> str:
    if not tol:
        return "–"
    return ", ".join(f"{k} {'≥' if k.startswith('min') else '≤'} {v:g}" for k, v in sorted(tol.items()))


def parity_row(record: dict, folder: Path, root: str | Path) -> dict:
    """A parity record as a table row: a variant folder's (``metrics``) or a deploy folder's
    (``images`` of its vision graph)."""
    try:
        artifact = str(Path(folder).relative_to(root))
    except ValueError:
        artifact = str(folder)
    if "metrics" in record:
        m = record["metrics"]
        rel, cos, variant = m.get("max_rel_error"), m.get("min_cosine"), record.get("variant")
    else:
        imgs = record.get("images", [])
        rel = max((float(i["max_rel_error"]) for i in imgs), default=None)
        cos = min((float(i["cosine"]) for i in imgs), default=None)
        variant = f"deploy {Path(folder).name} ({record.get('graph', '')})"
    return {"artifact": artifact, "variant": variant, "gate": _gate(record.get("tolerance")),
            "max rel error": rel, "min cosine": cos, "passed": bool(record.get("passed"))}


def profile_row(key: str, ev: dict) -> dict:
    graph, variant = key.rsplit("/", 1)
    t = ev["target"]
    lat = ev.get("latency_ms", {})
    sign = {">=": "≥", "<=": "≤"}.get(t["direction"], t["direction"])
    return {"graph": graph, "base": variant, "target": f"{t['metric']} {sign} {t['value']:g}",
            "quant target": (ev.get("quant_target") or {}).get("name", "–"),
            "measured": ev["measured"][t["metric"]], "status": ev["status"],
            "INT8 ops": f"{ev['int8_ops']} / {ev['quantizable_ops']} ({ev['int8_op_share']:.0%})",
            "INT8 weights": f"{ev['int8_weight_share']:.0%}",
            "estimate → built": (f"{_fmt(ev['estimate'][t['metric']], 6)} → {_fmt(ev['measured'][t['metric']], 6)}"
                                 if ev.get("estimate") else "–"),
            "builds": len(ev.get("builds", [])),
            "latency fp32 / int8-mixed (ms)": f"{_fmt(lat.get('fp32'), 3)} / {_fmt(lat.get('int8_mixed'), 3)}",
            "speed-up vs fp32": (ev.get("speedup") or {}).get("vs_fp32"),
            "size (MB)": ev["model_bytes"] / 1e6}


_NUM, _FAIL = ' class="num"', ' class="fail"'
#: Columns whose numbers need more than 4 significant digits (a cosine of 0.99999986 is not 1).
_DIGITS = {"min cosine": 8}


def _numeric(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def render(title: str, columns: list[str], rows: list[dict], intro: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows:
        failed = r.get("passed") is False or r.get("status") == "unreachable"
        cells = "".join(f"<td{_NUM if _numeric(r.get(c)) else ''}>{html.escape(_fmt(r.get(c), _DIGITS.get(c, 4)))}</td>"
                        for c in columns)
        body.append(f"<tr{_FAIL if failed else ''}>{cells}</tr>")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h2>{html.escape(title)}</h2>"
            f"{f'<p>{html.escape(intro)}</p>' if intro else ''}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></body></html>\n")


def write_html(out: str | Path, title: str, columns: list[str], rows: list[dict], intro: str = "") -> Path:
    with atomic_file(out, ".html") as tmp:
        Path(tmp).write_text(render(title, columns, rows, intro), encoding="utf-8")
    return Path(out)
