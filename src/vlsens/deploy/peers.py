"""The deploy folders side by side on the end-to-end measure (:mod:`vlsens.deploy.measure`):
``results/<model>/measure/compare.json`` and ``compare.md``.

Per folder: its bytes, its KL per generated step against the fp32 folder per modality (text, one
image, two images: mean and range over the cases) and as one mean, its top-1 agreement. Then
int4-mixed, the folder vlsens chooses, against every other int4-class folder (the builder's,
the peers': ``deploy.peers``): the ratio of mean KLs with its paired bootstrap interval over the
cases and the share of cases it wins, over all cases and over the image prompts alone. A folder
is called better than another only where the interval's upper end is below 1.

The goals the issue states for the plan are checked against the *best anchor*: of the folders
with at least int4-mixed's bytes, the one with the lowest mean KL (and separately the one with
the lowest image-prompt KL). int4-mixed's KL at most half of it, on all prompts and on image
prompts; "met" only when the ratio is at most 0.5 and the paired interval lies below 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlsens.deploy import INT4, PEER_PREFIX

OURS = "int4-mixed"
#: The plan's KL against the best anchor's, at most (on all prompts and on image prompts).
GOAL = 0.5
MODALITY_TITLES = {"text": "text", "image": "one image", "images": "two images"}


def _order(modality: str) -> int:
    return list(MODALITY_TITLES).index(modality) if modality in MODALITY_TITLES else len(MODALITY_TITLES)


def _image_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["modality"] != "text"]


def anchors(measures: dict[str, dict]) -> list[str]:
    """The folders int4-mixed is held against: the builder's int4 decoders and the peers."""
    return [n for n in measures if n != OURS and (n in INT4 or n.startswith(PEER_PREFIX))]


def _best(measures: dict[str, dict], names: list[str], key) -> str | None:
    """Of ``names`` with at least int4-mixed's bytes, the one with the lowest ``key``."""
    fits = [n for n in names if measures[n]["bytes"] >= measures[OURS]["bytes"]]
    return min(fits, key=lambda n: key(measures[n])) if fits else None


def _image_kl(m: dict) -> float:
    rows = _image_rows(m["cases"])
    return sum(r["kl"] for r in rows) / len(rows) if rows else float("nan")


def _goal(measures: dict[str, dict], best: str | None, image: bool) -> dict | None:
    from vlsens.deploy.measure import paired

    if best is None:
        return None
    pick = _image_rows if image else list
    p = paired(pick(measures[OURS]["cases"]), pick(measures[best]["cases"]))
    ok = p["ratio"] is not None and p["ratio"] <= GOAL and p["better"]
    return {"statement": f"{OURS}: {'image-prompt ' if image else ''}KL <= {GOAL}x the best anchor's at equal or "
                         "fewer folder bytes", "anchor": best, "ratio": p["ratio"], "interval": p["interval"],
            "bytes_ratio": measures[OURS]["bytes"] / measures[best]["bytes"], "met": bool(ok)}


def table(measure_files: dict[str, str | Path], answers: dict[str, str | Path] | None = None) -> dict:
    """The comparison record of the measured folders (``{folder: measure record path}``); with
    ``answers`` (``{folder: answers record path}``, fp32's among them), each folder's task accuracy
    and its paired drop against fp32 (:mod:`vlsens.deploy.accuracy`) come first."""
    from vlsens.deploy import accuracy
    from vlsens.deploy.measure import paired

    measures = {n: json.loads(Path(f).read_text()) for n, f in measure_files.items()}
    rows = {n: {k: m[k] for k in ("bytes", "mean_kl", "top1", "modalities", "cases")} for n, m in measures.items()}
    out = {"reference": "the fp32 folder through onnxruntime-genai, teacher-forced on its greedy tokens",
           "rows": rows, "ours": OURS if OURS in measures else None, "paired": {}, "goals": []}
    if answers:
        scored = accuracy.table(accuracy.read(answers))["rows"]
        out["accuracy"] = {"reference": scored[accuracy.REFERENCE]}
        for n, row in rows.items():
            if n in scored:
                row["accuracy"] = scored[n]
    if OURS not in measures:
        return out
    for n in anchors(measures):
        out["paired"][n] = {"all": paired(measures[OURS]["cases"], measures[n]["cases"]),
                            "image": paired(_image_rows(measures[OURS]["cases"]), _image_rows(measures[n]["cases"]))}
    names = anchors(measures)
    for image in (False, True):
        best = _best(measures, names, _image_kl if image else (lambda m: m["mean_kl"]))
        if (g := _goal(measures, best, image)) is not None:
            out["goals"].append(g)
    return out


def _kl_cell(mod: dict | None) -> str:
    if not mod:
        return "-"
    return f"{mod['mean_kl']:.3g} ({mod['min']:.2g}-{mod['max']:.2g})"


def pair_cell(p: dict, wins: bool = True) -> str:
    """A paired comparison as a table cell: the ratio, its interval, the verdict (and the share
    of cases won)."""
    if p["ratio"] is None:
        return "-"
    verdict = "better" if p["better"] else "worse" if p["worse"] else "not separated"
    cell = f"{p['ratio']:.2f} [{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] {verdict}"
    return f"{cell}, wins {p['wins']:.0%}" if wins else cell


def markdown(result: dict) -> str:
    from vlsens.deploy import accuracy

    mods = list(MODALITY_TITLES)
    scored = "accuracy" in result
    acc_head = (" | ".join(accuracy.COLUMNS) + " | ") if scored else ""
    lines = [f"| folder | {acc_head}MB | mean KL | " + " | ".join(f"KL {MODALITY_TITLES[m]} (min-max)" for m in mods)
             + f" | top-1 | {OURS} / folder: all prompts | image prompts |",
             "| --- | " + ("--- | --- | " if scored else "") + "---: | ---: | " + " | ".join("---:" for _ in mods)
             + " | ---: | --- | --- |"]
    if scored:
        lines.append(f"| fp32 | {accuracy.columns(result['accuracy']['reference'], reference=True)} | "
                     + " | ".join("-" for _ in range(len(mods) + 5)) + " |")
    for n, r in result["rows"].items():
        p = result["paired"].get(n)
        pair = f"{pair_cell(p['all'])} | {pair_cell(p['image'])}" if p else "- | -"
        acc = (accuracy.columns(r.get("accuracy")) + " | ") if scored else ""
        lines.append(f"| {n} | {acc}{r['bytes'] / 1e6:.3f} | {r['mean_kl']:.3g} | "
                     + " | ".join(_kl_cell(r["modalities"].get(m)) for m in mods) + f" | {r['top1']:.3f} | {pair} |")
    n_cases = {m: v["cases"] for m, v in next(iter(result["rows"].values()))["modalities"].items()} \
        if result["rows"] else {}
    lines += ["", f"KL per generated step against {result['reference']}; cases per modality: "
                  + ", ".join(f"{MODALITY_TITLES.get(m, m)} {n_cases[m]}" for m in sorted(n_cases, key=_order))
                  + ". Ratios: mean KL of int4-mixed / the folder's, with the 95 % paired bootstrap interval over "
                    "the cases (resampled within each modality); better / worse only where the interval excludes 1; "
                    "wins: the share of cases where int4-mixed's KL is lower."]
    if scored:
        lines += ["", accuracy.NOTE]
    for g in result["goals"]:
        lines += ["", f"Goal ({g['statement']}): against {g['anchor']} (bytes {g['bytes_ratio']:.2f}x): KL "
                      f"{g['ratio']:.2f}x [{g['interval'][0]:.2f}, {g['interval'][1]:.2f}]: "
                      f"{'met' if g['met'] else 'not met'}."]
    return "\n".join(lines) + "\n"


def write(measure_files: dict[str, str | Path], out_json: str | Path, out_md: str | Path,
          answers: dict[str, str | Path] | None = None) -> dict:
    from vlsens.deploy.compare import write_pair

    return write_pair(table(measure_files, answers), markdown, out_json, out_md)
