"""Every folder's task accuracy side by side, each paired with the fp32 folder's on the same
questions: ``measure/accuracy.json`` and ``accuracy.md``.

A folder's accuracy is reported per modality with its Wilson interval; its drop against fp32 is
the paired difference (questions fp32 gets right and the folder wrong, and the reverse) with
McNemar's exact test: ``worse`` when the drop is resolved at the 95 % level, ``not resolved``
otherwise. A plan folder built at an anchor's bytes (``at-<anchor>``, or the plan the budget
report names for that anchor) is also paired with that anchor.
"""

from __future__ import annotations

from collections.abc import Mapping

from vlsens.deploy.genai.answers import read_answers, right_answers
from vlsens.task.questions import MODALITIES
from vlsens.task.score import mcnemar

REFERENCE = "fp32"


def _by_modality(record: dict) -> dict[str, list[bool]]:
    right = right_answers(record)
    return {m: [x for x, q in zip(right, record["modality"]) if q == m] for m in MODALITIES}


def paired(reference: dict, other: dict) -> dict:
    """``other`` against ``reference`` (answers records of the same questions): McNemar overall
    and per modality."""
    if reference["questions"] != other["questions"] or reference["count"] != other["count"]:
        raise ValueError(f"{other['folder']} and {reference['folder']} answered different questions "
                         f"({other['questions']} and {reference['questions']})")
    a, b = _by_modality(reference), _by_modality(other)
    return {"all": mcnemar(right_answers(reference), right_answers(other)),
            "modalities": {m: mcnemar(a[m], b[m]) for m in MODALITIES if a[m]}}


def resolved_worse(pair: dict) -> bool:
    """Whether a pairing resolves the folder below its reference, overall or in a modality."""
    return pair["all"]["resolved"] == "worse" or any(v["resolved"] == "worse" for v in pair["modalities"].values())


def table(records: Mapping[str, dict], anchors: Mapping[str, str] | None = None) -> dict:
    """The comparison of every folder's answers record (``{folder: record}``, fp32's among them);
    ``anchors``: ``{plan folder: anchor folder}`` pairs to compare as well."""
    if REFERENCE not in records:
        raise ValueError("the fp32 folder's answers are missing: every folder is paired with them")
    ref = records[REFERENCE]
    rows = {}
    for name, rec in sorted(records.items()):
        row = {"accuracy": rec["accuracy"], "modalities": rec["modalities"]}
        if name != REFERENCE:
            row["vs_fp32"] = paired(ref, rec)
            row["below_fp32"] = resolved_worse(row["vs_fp32"])
        rows[name] = row
    pairs = {plan: {"anchor": anchor, **paired(records[anchor], records[plan]),
                    "drops": {"anchor": rows[anchor]["vs_fp32"]["all"]["difference"],
                              "plan": rows[plan]["vs_fp32"]["all"]["difference"]}}
             for plan, anchor in sorted((anchors or {}).items()) if plan in records and anchor in records}
    return {"reference": REFERENCE, "questions": ref["questions"], "count": ref["count"], "rows": rows,
            "plans_vs_anchors": pairs}


def _cell(acc: dict) -> str:
    return f"{100 * acc['accuracy']:.1f} [{100 * acc['low']:.1f}, {100 * acc['high']:.1f}]"


def _drop(pair: dict) -> str:
    d = pair["all"]
    return (f"{100 * d['difference']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}], "
            f"{d['lost']} lost / {d['gained']} gained, p={d['p']:.2g}: {d['resolved']}")


def markdown(t: dict) -> str:
    head = ("| folder | accuracy % [95 % Wilson] | text | one image | two images | against fp32 (paired, points) |\n"
            "| --- | --- | --- | --- | --- | --- |\n")
    lines = []
    for name, row in t["rows"].items():
        mods = [_cell(row["modalities"][m]) if m in row["modalities"] else "-" for m in MODALITIES]
        against = "reference" if name == t["reference"] else _drop(row["vs_fp32"])
        lines.append(f"| {name} | {_cell(row['accuracy'])} | {' | '.join(mods)} | {against} |")
    out = [f"# Task accuracy: {t['count']} evaluation questions, greedy answers through onnxruntime-genai\n",
           head + "\n".join(lines) + "\n",
           "Each folder's drop is paired with fp32 on the same questions (McNemar's exact test at 95 %): "
           "'worse' only when the questions it loses outnumber those it gains beyond chance.\n"]
    if t["plans_vs_anchors"]:
        out.append("\n## Plans against the anchor at their bytes\n\n| plan | anchor | anchor's drop | plan's drop |"
                   " plan against anchor |\n| --- | --- | ---: | ---: | --- |\n")
        for plan, p in t["plans_vs_anchors"].items():
            out.append(f"| {plan} | {p['anchor']} | {100 * p['drops']['anchor']:+.1f} | "
                       f"{100 * p['drops']['plan']:+.1f} | {_drop(p)} |\n")
    return "".join(out)


#: The prefix of a job's named inputs that are answered deploy folders (``answers_<folder>``), beside
#: its other inputs (rules/common.smk: ``task_answers``).
INPUT_PREFIX = "answers_"


def split_inputs(inputs: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A job's named inputs as (the others, ``{folder name: deploy folder}``)."""
    answers = {k.removeprefix(INPUT_PREFIX): v for k, v in inputs.items() if k.startswith(INPUT_PREFIX)}
    return {k: v for k, v in inputs.items() if not k.startswith(INPUT_PREFIX)}, answers


def read(answers: Mapping[str, str]) -> dict[str, dict]:
    """The answers records ``{folder: the deploy folder (its answers.json) or the record}`` read."""
    return {name: read_answers(p) for name, p in answers.items()}


def columns(row: dict | None, reference: bool = False) -> str:
    """A folder's accuracy and its paired drop against fp32 as two Markdown cells (the other tables
    that show accuracy first: measure/compare.md, budget/measured.md)."""
    if row is None:
        return "- | -"
    if reference or "vs_fp32" not in row:
        return f"{_cell(row['accuracy'])} | reference"
    return f"{_cell(row['accuracy'])} | {drop_cell(row['vs_fp32'])}"


def drop_cell(pair: dict | None) -> str:
    """A paired comparison (:func:`paired`) as one cell: the difference in points, its interval and
    McNemar's verdict."""
    if not pair:
        return "-"
    d = pair["all"]
    return f"{100 * d['difference']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] {d['resolved']}"


#: The header cells of :func:`columns`.
COLUMNS = ("accuracy % [95 %]", "against fp32, points")
#: What :func:`columns` means, for the tables' notes.
NOTE = ("Accuracy: greedy answers to the task's evaluation questions through onnxruntime-genai, with the 95 % "
        "Wilson interval; against fp32: the paired difference on the same questions with its 95 % interval, "
        "'worse' only where McNemar's exact test resolves it (measure/accuracy.md).")


def plan_anchors(measured: dict) -> dict[str, str]:
    """``{plan folder: anchor}`` of the budget's measured front (``budget/measured.json``): the best
    plan within each anchor's bytes."""
    return {f"plan-{v['plan']}": v["anchor"] for v in measured.get("versus", []) if v and v.get("plan")}


def write(answers: Mapping[str, str], out_json, out_md, measured: str | None = None) -> dict:
    """Read the folders' answers records (``{folder name: deploy folder}``; ``measured``: the
    budget's measured front, for the plans' anchors) and write the comparison as JSON and Markdown."""
    import json
    from pathlib import Path

    from vlsens.core.fsutil import atomic_file, write_json

    records = read(answers)
    anchors = plan_anchors(json.loads(Path(measured).read_text())) if measured else {}
    t = table(records, anchors)
    write_json(out_json, t)
    with atomic_file(out_md, suffix=".md") as tmp:
        Path(tmp).write_text(markdown(t))
    return t
