"""The report's landing page: the run's verdict before anything else.

``verdict.rst`` (written by rule ``report_tables`` under ``results/<model>/report/``) says, from
the run's own records: which folder to ship per device and what the run missed (``recommend.json``,
first), how many artifacts passed their parity gates (and the worst of them), each
profile's status against its target with its INT8 share, speed-up and the ops it keeps in float,
and each deploy folder's generation check (tokens identical to transformers, or KL and top-1
against the fp32 folder). The Snakefile makes it the first page of ``snakemake --report``
(``make report``) when it exists, followed by the workflow's description.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

#: Profile precisions with 8-bit weights: W8A8 and W8A16 (:mod:`vlsens.precision.wide`).
EIGHT_BIT = ("int8", "int8-a16")


def _literal(text: str) -> str:
    return "``" + str(text).replace("`", "'") + "``"


def _table(title: str, columns: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    out = [f".. list-table:: {title}", "   :header-rows: 1", ""]
    for r in [columns, *rows]:
        out.append(f"   * - {r[0]}")
        out += [f"     - {c}" for c in r[1:]]
    return out + [""]


def _short(op: str) -> str:
    """An op name without its module path's head: ``blocks.2/attn/qkv/Gemm``."""
    parts = op.strip("/").split("/")
    return "/".join(parts[-4:]) if len(parts) > 4 else "/".join(parts)


def _g(x, digits: int = 4) -> str:
    return "–" if x is None else f"{float(x):.{digits}g}"


def parity_lines(records: list[str]) -> list[str]:
    recs = [json.loads(Path(p).read_text()) for p in records]
    passed = [r for r in recs if r.get("passed")]
    failed = [r for r in recs if not r.get("passed")]
    worst = min(recs, key=lambda r: r["metrics"]["min_cosine"]) if recs else None
    line = (f"**Parity: {len(passed)} of {len(recs)} artifacts passed their gates** against transformers on real "
            "inputs (a graph that misses its tolerance is never written).")
    if worst is not None:
        line += (f" Lowest cosine: {worst['metrics']['min_cosine']:.6f}, {_literal(worst['artifact'])} "
                 f"({worst['variant']}, gate cosine ≥ {worst['tolerance']['min_cosine']:g}).")
    if failed:
        line += " **Failed:** " + ", ".join(_literal(r["artifact"]) for r in failed) + "."
    return [line, ""]


def profile_rows(profiles: dict[str, str]) -> list[list[str]]:
    rows = []
    for key, path in profiles.items():
        graph, variant = key.rsplit("/", 1)
        ev = json.loads(Path(path).read_text())
        t = ev["target"]
        kept_file = Path(path).with_name("profile.yaml")
        kept = []
        if kept_file.is_file():
            prof = yaml.safe_load(kept_file.read_text())
            kept = sorted(op for op, o in (prof.get("ops") or {}).items() if o.get("precision") not in EIGHT_BIT)
        shown = ", ".join(_literal(_short(k)) for k in kept[:3]) + (f" and {len(kept) - 3} more" if len(kept) > 3 else "")
        status = "**met**" if ev["status"] == "met" else f"**{ev['status']}**"
        sign = {">=": "≥", "<=": "≤"}.get(t["direction"], t["direction"])
        rows.append([f"{graph} [{variant}]", f"{t['metric']} {sign} {t['value']:g}",
                     f"{status} ({t['metric']} {_g(ev['measured'][t['metric']], 6)})",
                     f"{ev['int8_ops']} / {ev['quantizable_ops']} ops, {ev['int8_weight_share']:.0%} of weights"
                     + (f" ({ev['a16_ops']} at W8A16)" if ev.get("a16_ops") else ""),
                     _g((ev.get("speedup") or {}).get("vs_fp32"), 3) + "x",
                     shown or "none"])
    return rows


def recommend_lines(rec: dict) -> list[str]:
    """The first section: which folder to ship per device and what was missed (recommend.json)."""
    from vlsens.report.recommend import device_lines

    scored = any("accuracy" in f for f in rec["folders"])
    first = ("its accuracy on the task's evaluation questions (greedy answers through onnxruntime-genai) not resolved "
             "below the fp32 folder's, paired on the same questions; " if scored else "")
    out = ["Which folder to ship", "--------------------", "",
           f"Every folder is judged one way: {first}its mean KL per generated step against {rec['reference']}, within "
           f"the run's KL budget {rec['kl_budget']:g}; its vision graph past its gate; the fewest bytes wins.", ""]
    out += device_lines(rec, ship=lambda device, path: f"**{device}: ship** {_literal(path)}", path=_literal)
    out.append("")
    if rec["missed"]:
        out += [f"**Missed ({len(rec['missed'])}):**", ""] + [f"- {_literal(m)}" for m in rec["missed"]] + [""]
    return out


def deploy_rows(deploy: dict[str, str], rec: dict | None = None) -> list[list[str]]:
    """A line per folder: its task accuracy where the run scored it (first), its generation check;
    with the recommendation, every folder's KL against the one KL budget (not only the folders
    whose own profile set a target)."""
    from vlsens.report.recommend import accuracy_cell

    facts = {f["folder"]: f for f in (rec or {}).get("folders", [])}
    scored = any("accuracy" in f for f in facts.values())
    rows = []
    for precision, folder in deploy.items():
        ev = json.loads((Path(folder) / "eval.json").read_text())
        cases = ev.get("cases") or []
        if "identical" in ev:
            same = sum(bool(c.get("identical")) for c in cases)
            check = f"tokens identical to transformers' generate in {same} of {len(cases)} cases"
            check = ("**" + check + "**") if ev["identical"] else f"**differs**: {check}"
        else:
            check = (f"KL {_g(ev.get('mean_kl'), 3)} per token, top-1 {_g(ev.get('top1_agreement'), 3)} against the "
                     "fp32 folder (teacher-forced)")
            f = facts.get(precision)
            if f is not None:
                within = f["kl"] <= rec["kl_budget"]
                check += (f"; {f['source']} ({f['cases']} cases): KL {_g(f['kl'], 3)} — "
                          + ("within" if within else "**above**") + f" the budget {rec['kl_budget']:g}")
        speed = ev.get("tokens_per_second")
        acc = [accuracy_cell(facts.get(precision, {}))] if scored else []
        rows.append([precision, *acc, check, _g(speed, 3) if speed else "–"])
    return rows


def build(records: list[str], profiles: dict[str, str], deploy: dict[str, str], description: str | Path,
          model: str, out: str | Path, recommend: str | Path | None = None) -> str:
    """Write the landing page (reStructuredText) and return it; ``recommend``: the run's
    recommend.json, shown first."""
    rec = json.loads(Path(recommend).read_text()) if recommend else None
    lines = [f"Verdict: {model}", "=" * (9 + len(model)), ""]
    lines += recommend_lines(rec) if rec else []
    lines += parity_lines(records)
    lines += _table("Mixed-precision profiles (the built model, measured in its deployment target's arithmetic)",
                    ["graph [base]", "target", "status", "INT8", "speed-up vs fp32", "kept in float"],
                    profile_rows(profiles))
    rows = deploy_rows(deploy, rec)
    scored = bool(rows) and len(rows[0]) == 4  # deploy_rows put each folder's accuracy first
    columns = ["folder", *(["task accuracy [95 %], paired drop"] if scored else []), "generation check", "tokens/s"]
    lines += _table("Deploy folders, run by onnxruntime-genai", columns, rows)
    lines += ["The categories below hold the figures and tables behind each line.", "", "About this workflow",
              "-------------------", ""]
    lines += [Path(description).read_text()]
    text = "\n".join(lines)
    Path(out).write_text(text)
    return text
