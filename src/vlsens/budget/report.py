"""The measured front beside the anchors: ``results/<model>/budget/measured.json``, ``measured.md``
and ``front.png``.

Every plan's folder and every anchor (the int4 folders, the peers' folders) measured alike
(:mod:`vlsens.deploy.genai.measure`): bytes, mean KL per generated step over all cases and per
modality. Per plan, the search's estimate against its built folder's measure. Per anchor, the plan
with the lowest measured KL among those with at most the anchor's bytes, and their ratio of mean
KLs with its paired bootstrap interval over the cases, over all prompts and over the image prompts
(:func:`vlsens.deploy.measure.paired`): the issue's goal, a ratio of at most 0.5 with an interval
below 1, is checked per anchor. The recommended folder: the smallest plan whose measured KL meets
the KL budget (``text.profile.target``), else the plan of lowest KL.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

#: A plan's measured KL at most this share of an anchor's, at equal or fewer bytes.
GOAL = 0.5
#: The estimate of a built plan within this share of its measured KL.
ESTIMATE_GOAL = 0.10
#: Below this KL per step a folder's measure is the rounding of two runtimes, not quantization
#: (the fp16 folder: 4.5e-9 on the tiny preset); an estimate there is not held to the 10 %.
NOISE_KL = 1e-7
PLAN_PREFIX = "plan-"

log = logging.getLogger(__name__)


def _image_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["modality"] != "text"]


def _plans(front: dict, measures: dict[str, dict], latency: dict | None = None) -> list[dict]:
    rows = []
    timed = (latency or {}).get("plans", {})
    for p in front.get("plans", front["picked"]):
        m = measures.get(PLAN_PREFIX + p["name"])
        if m is None:
            continue
        est = p["kl"]
        rows.append({"plan": p["name"], "vision": p["vision"], "embedding": p["embedding"],
                     "int4": p["int4"], "int8": p["int8"], "float": p["float"], "algorithms": p.get("algorithms", {}),
                     "estimate_bytes": p["bytes"], "bytes": m["bytes"], "estimate_kl": est, "kl": m["mean_kl"],
                     "estimate_error": (est - m["mean_kl"]) / m["mean_kl"] if m["mean_kl"] > NOISE_KL else None,
                     "modalities": {k: v["mean_kl"] for k, v in m["modalities"].items()}, "top1": m["top1"]})
        t = timed.get(p["name"])
        if t:
            rows[-1].update({"decode_ms": t["measured"]["ms"], "decode_q": [t["measured"]["q1"], t["measured"]["q3"]],
                             "estimate_decode_ms": t["estimate_ms"], "decode_error": t["error"]})
    return rows


def _versus(plans: list[dict], measures: dict[str, dict], anchor: str) -> dict | None:
    """The best plan within ``anchor``'s bytes against it, paired, on all prompts and image prompts."""
    from vlsens.deploy.measure import paired

    a = measures[anchor]
    fits = [p for p in plans if p["bytes"] <= a["bytes"]]
    if not fits:
        return {"anchor": anchor, "plan": None, "note": "no plan at or below the anchor's bytes"}
    best = min(fits, key=lambda p: p["kl"])
    mine = measures[PLAN_PREFIX + best["plan"]]["cases"]
    out = {"anchor": anchor, "plan": best["plan"], "bytes_ratio": best["bytes"] / a["bytes"],
           "all": paired(mine, a["cases"]), "image": paired(_image_rows(mine), _image_rows(a["cases"]))}
    out["met"] = all(p["ratio"] is not None and p["ratio"] <= GOAL and p["better"] for p in (out["all"], out["image"]))
    return out


def _add_accuracy(plans: list[dict], anchors: dict[str, dict], versus: list[dict | None], answers) -> None:
    """Each plan's and anchor's task accuracy with its paired drop against fp32, and each plan held
    against its anchor on the same questions (:mod:`vlsens.deploy.accuracy`)."""
    from vlsens.deploy import accuracy

    records = accuracy.read(answers)
    scored = accuracy.table(records)["rows"]
    for p in plans:
        p["accuracy"] = scored.get(PLAN_PREFIX + p["plan"])
    for name, a in anchors.items():
        a["accuracy"] = scored.get(name)
    for v in versus:
        plan = v and v.get("plan") and PLAN_PREFIX + v["plan"]
        if plan in records and v["anchor"] in records:
            v["accuracy"] = accuracy.paired(records[v["anchor"]], records[plan])


def _below_fp32(p: dict) -> bool:
    return bool(p.get("accuracy") and p["accuracy"].get("below_fp32"))


def table(front: dict, measure_files: dict[str, str | Path], kl_budget: float | None = None,
          latency: dict | None = None, answers: dict[str, str | Path] | None = None) -> dict:
    """The record: plans (estimate and measure; with ``latency``, budget/latency.json, their decode
    step too), anchors, the comparisons, the recommendation; with ``answers`` (``{folder: answers
    record}``, fp32's among them) every folder's task accuracy, and the recommendation the smallest
    plan whose accuracy is not resolved below fp32's and whose KL meets the budget."""
    measures = {n: json.loads(Path(f).read_text()) for n, f in measure_files.items()}
    plans = _plans(front, measures, latency)
    anchors = {n: {"bytes": m["bytes"], "kl": m["mean_kl"], "top1": m["top1"],
                   "modalities": {k: v["mean_kl"] for k, v in m["modalities"].items()}}
               for n, m in measures.items() if not n.startswith(PLAN_PREFIX)}
    versus = [_versus(plans, measures, n) for n in anchors]
    if answers:
        _add_accuracy(plans, anchors, versus, answers)
    meeting = [p for p in plans if kl_budget is not None and p["kl"] <= kl_budget and not _below_fp32(p)]
    pick = min(meeting, key=lambda p: p["bytes"]) if meeting else (min(plans, key=lambda p: p["kl"]) if plans else None)
    why = ("the smallest plan " + ("whose accuracy is not resolved below fp32's and " if answers else "")
           + f"whose measured KL meets the KL budget {kl_budget:g}") if meeting else \
        "no plan meets the KL budget" + (" with its accuracy not resolved below fp32's" if answers else "") \
        + ": the plan of lowest KL"
    within = [abs(p["estimate_error"]) <= ESTIMATE_GOAL for p in plans if p["estimate_error"] is not None]
    requested = _requested(front.get("requested") or {}, {p["plan"]: p for p in plans}, bool(answers))
    return {"reference": "the fp32 folder through onnxruntime-genai, teacher-forced on its greedy tokens",
            "plans": plans, "anchors": anchors, "versus": versus,
            "estimate": {"goal": ESTIMATE_GOAL, "within": sum(within), "of": len(within)},
            "recommended": None if pick is None else {
                "folder": PLAN_PREFIX + pick["plan"], "bytes": pick["bytes"], "kl": pick["kl"], "why": why,
                **({"accuracy": pick["accuracy"]["accuracy"]} if pick.get("accuracy") else {})},
            "requested": requested,
            "latency": None if not latency else {
                "context": latency["context"], "uniform_ms": {w: t["ms"] for w, t in latency["uniform"].items()},
                "within": sum(abs(p["decode_error"]) <= ESTIMATE_GOAL for p in plans if "decode_error" in p),
                "of": sum("decode_error" in p for p in plans)},
            "search": {k: front.get(k) for k in ("evaluations", "seconds", "budgets")},
            "volatile_keys": ["decode_error", "decode_q"]}  # measured times (vlsens.core.canonical)


def _within(p: dict, r: dict) -> bool:
    """Whether plan ``p`` as built and measured holds every limit of request ``r`` but accuracy."""
    ask = r["request"]
    return (r["byte_limit"] is None or p["bytes"] <= r["byte_limit"]) and \
        ("kl" not in ask or p["kl"] <= float(ask["kl"])) and \
        ("decode_ms" not in ask or p.get("decode_ms", float("inf")) <= float(ask["decode_ms"]))


def drop_points(p: dict) -> float:
    """A scored plan's accuracy drop against fp32 in points (fp32's accuracy minus the plan's, paired
    on the same questions; negative where the plan answers more right)."""
    return -100 * p["accuracy"]["vs_fp32"]["all"]["difference"]


def _by_accuracy(name: str, r: dict, plans: dict, scored: bool) -> dict:
    """A request with ``accuracy_drop`` (points against fp32, at most): the built plan of fewest bytes
    within its other limits whose measured drop meets it."""
    if not scored:
        log.warning("plan.budgets %r asks for an accuracy drop, but the run does not answer the task "
                    "(deploy.measure.prompts: task)", name)
        return {**r, "met": False, "note": "the run does not answer the task"}
    fits = [p for p in plans.values() if p.get("accuracy") and _within(p, r)
            and drop_points(p) <= float(r["request"]["accuracy_drop"])]
    if not fits:
        log.warning("plan.budgets %r (accuracy drop %s points): no built plan meets it", name,
                    r["request"]["accuracy_drop"])
        return {**r, "met": False, "note": "no built plan meets it"}
    p = min(fits, key=lambda p: (p["bytes"], p["kl"]))
    return {**r, "plan": p["plan"], "bytes": p["bytes"], "kl": p["kl"], "drop": drop_points(p),
            "accuracy": p["accuracy"]["accuracy"]["accuracy"], "met": True}


def _requested(requested: dict, plans: dict, scored: bool = False) -> dict:
    """Each ``plan.budgets`` request against its built folder's measure: met when every limit it
    sets holds on the folder: its bytes within the byte limit, its measured KL within the KL asked
    for, its measured decode step within ``decode_ms``. A request with ``accuracy_drop`` names the
    built plan that meets it (:func:`_by_accuracy`; ``scored``: the plans carry their accuracy)."""
    out = {}
    for name, r in requested.items():
        if "accuracy_drop" in r["request"]:
            out[name] = _by_accuracy(name, r, plans, scored)
            continue
        p = plans.get(r["plan"]) if r["plan"] else None
        if p is None:
            out[name] = {**r, "met": False}
            continue
        ask = r["request"]
        met = _within(p, r)
        out[name] = {**r, "bytes": p["bytes"], "kl": p["kl"], "met": bool(met),
                     **({"decode_ms": p["decode_ms"]} if "decode_ms" in p else {})}
        if not met:  # the estimate met it, the built folder does not: said where the run is watched
            step = f", decode step {p['decode_ms']:.3g} ms" if "decode_ms" in p else ""
            log.warning("plan.budgets %r (%s): the built deploy/plan-%s/ does not meet it (%d bytes, measured KL %.3g%s)",
                        name, ", ".join(f"{k} {v}" for k, v in ask.items()), name, p["bytes"], p["kl"], step)
    return out


def markdown(result: dict) -> str:
    from vlsens.deploy import accuracy

    mods = ("text", "image", "images")
    timed = bool(result.get("latency"))
    scored = any("accuracy" in p for p in result["plans"])
    acc_head, acc_rule = (" | ".join(accuracy.COLUMNS) + " | ", "--- | --- | ") if scored else ("", "")
    lines = [f"| plan | {acc_head}vision | embedding | INT4 / INT8 / float MatMuls | MB | est. KL | KL | est. error | "
             + " | ".join(f"KL {m}" for m in mods) + " | top-1 |" + (" est. ms | ms [q1, q3] |" if timed else ""),
             f"| --- | {acc_rule}--- | --- | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in mods)
             + " | ---: |" + (" ---: | ---: |" if timed else "")]
    for p in result["plans"]:
        err = "noise" if p["estimate_error"] is None else f"{p['estimate_error']:+.0%}"
        step = ""
        if timed:
            step = (f" {p['estimate_decode_ms']:.3g} | {p['decode_ms']:.3g} [{p['decode_q'][0]:.3g}, {p['decode_q'][1]:.3g}] |"
                    if "decode_ms" in p else " - | - |")
        algos = ", ".join(f"{n} {a}" for a, n in sorted(p.get("algorithms", {}).items()))
        acc = (accuracy.columns(p.get("accuracy")) + " | ") if scored else ""
        lines.append(f"| {p['plan']} | {acc}{p['vision']} | {p['embedding']} | {p['int4']} / {p['int8']} / {p['float']}"
                     + (f" ({algos})" if algos else "") + " | "
                     f"{p['bytes'] / 1e6:.3f} | {p['estimate_kl']:.3g} | {p['kl']:.3g} | {err} | "
                     + " | ".join(f"{p['modalities'].get(m, float('nan')):.3g}" for m in mods) + f" | {p['top1']:.3f} |"
                     + step)
    lines += ["", *_anchor_lines(result, scored)]
    e, r = result["estimate"], result["recommended"]
    lines += ["", f"KL per generated step against {result['reference']}; ratios with the 95 % paired bootstrap "
                  "interval over the cases (resampled within each modality); goal: at most "
                  f"{GOAL}x the anchor's KL on all prompts and on image prompts, the interval below 1.",
              "", f"Estimate vs built: {e['within']} of {e['of']} plans within {e['goal']:.0%} of their measured KL "
                  f"(the others' error is printed with its sign); the plans measured below {NOISE_KL:g} per step "
                  "(\"noise\") are at the rounding of two runtimes, where a relative error says nothing."]
    if scored:
        lines += ["", accuracy.NOTE + " Plan - anchor: the same, the plan paired with the anchor."]
    if any(p.get("algorithms") for p in result["plans"]):
        lines += ["", "MatMuls \"(N gptq)\": N of the plan's quantized MatMuls take that algorithm instead of the "
                      "run's nbits algorithm (chosen per op, docs/plan.md)."]
    if timed:
        t = result["latency"]
        lines += ["", f"Decode step: one generated token after {t['context']} cached tokens, ms, the median of the "
                      "quietest round with the quartiles of every step, on the machine and threads of this run; all "
                      "plans and the "
                      "uniform decoders (" + ", ".join(f"{'float' if w == '0' else 'INT' + w} {ms:.3g}"
                                                       for w, ms in t["uniform_ms"].items())
                      + ") timed in the same rounds. The estimate shares the uniform steps by the MatMuls' float "
                      f"bytes: {t['within']} of {t['of']} plans within {ESTIMATE_GOAL:.0%} of their measured step."]
    lines += _requested_lines(result.get("requested", {}))
    if r:
        acc = f", accuracy {100 * r['accuracy']['accuracy']:.1f} %" if "accuracy" in r else ""
        lines += ["", f"Recommended: `{r['folder']}` ({r['bytes'] / 1e6:.3f} MB{acc}, KL {r['kl']:.3g}): {r['why']}."]
    return "\n".join(lines) + "\n"


def figure(result: dict, out: str | Path) -> None:
    """Bytes against mean KL: the plans as measured (a line) and as estimated, the anchors as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlsens.core.fsutil import atomic_file

    plans = sorted(result["plans"], key=lambda p: p["bytes"])  # the line runs along the front
    scored = any(p.get("accuracy") for p in plans)
    if scored:  # accuracy first: the task's answers above, the KL below
        fig, (top, ax) = plt.subplots(2, 1, figsize=(8, 8.5), sharex=True, gridspec_kw={"height_ratios": [1, 1.3]})
        _accuracy_panel(top, plans, result["anchors"])
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
    floor = min([p["kl"] for p in plans if p["kl"] > 0] + [a["kl"] for a in result["anchors"].values() if a["kl"] > 0]
                + [1e-12]) / 10
    ax.plot([p["bytes"] / 1e6 for p in plans], [max(p["kl"], floor) for p in plans], "o-", color="C0",
            label="plans, measured")
    ax.plot([p["estimate_bytes"] / 1e6 for p in plans], [max(p["estimate_kl"], floor) for p in plans], "x",
            color="C0", alpha=0.6, label="plans, estimated")
    for i, p in enumerate(plans):  # labels alternate above and below: neighbours sit close in bytes
        ax.annotate(p["plan"], (p["bytes"] / 1e6, max(p["kl"], floor)), textcoords="offset points",
                    xytext=(4, 6 if i % 2 else -11), fontsize=7)
    colors, markers = plt.get_cmap("tab10").colors, "sD^vP*Xh"
    for i, (name, a) in enumerate(result["anchors"].items()):
        ax.plot(a["bytes"] / 1e6, max(a["kl"], floor), markers[i % len(markers)], color=colors[(i + 1) % 10],
                label=name)
    ax.set_yscale("log")
    ax.set_xlabel("folder weights (MB: graphs and data files)")
    ax.set_ylabel("mean KL per generated step vs fp32")
    (top if scored else ax).set_title("The measured front: plans and anchors on the same cases")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_file(out, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def _requested_lines(requested: dict) -> list[str]:
    """A line per ``plan.budgets`` request: what it asked for, what was built (or chosen), met or not."""
    lines: list[str] = []
    for name, q in requested.items():
        asked = ", ".join(f"{k} {v:g}" for k, v in q["request"].items())
        got = f"{q['bytes'] / 1e6:.3f} MB, KL {q['kl']:.3g}" if "kl" in q else q.get("note", "not built")
        if "decode_ms" in q:
            got += f", decode step {q['decode_ms']:.3g} ms"
        if "drop" in q:
            got = (f"`plan-{q['plan']}`, {got}, accuracy {100 * q['accuracy']:.1f} % (a drop of "
                   f"{round(q['drop'], 1) + 0.0:.1f} points against fp32)")
        what = f"`{name}`" if "accuracy_drop" in q["request"] else f"`plan-{name}`"
        lines += ["", f"Requested {what} ({asked}): {got}: {'met' if q['met'] else 'NOT met'}."]
    return lines


def _anchor_lines(result: dict, scored: bool) -> list[str]:
    """The anchors' table: each anchor beside the best plan within its bytes (with ``scored``, both
    accuracies first and the plan paired with the anchor on the same questions)."""
    from vlsens.deploy import accuracy
    from vlsens.deploy.peers import pair_cell

    acc_head, acc_rule = (" | ".join(accuracy.COLUMNS) + " | ", "--- | --- | ") if scored else ("", "")
    plan_acc = " plan - anchor accuracy, points (paired) |" if scored else ""
    lines = [f"| anchor | {acc_head}MB | KL | best plan within its bytes |{plan_acc} plan / anchor KL, all prompts "
             "| image prompts | goal |",
             f"| --- | {acc_rule}---: | ---: | --- |" + (" --- |" if scored else "") + " --- | --- | --- |"]
    for v in result["versus"]:
        a = result["anchors"][v["anchor"]]
        acc = (accuracy.columns(a.get("accuracy")) + " | ") if scored else ""
        if v["plan"] is None:
            lines.append(f"| {v['anchor']} | {acc}{a['bytes'] / 1e6:.3f} | {a['kl']:.3g} | - |"
                         + (" - |" if scored else "") + f" - | - | {v['note']} |")
            continue
        cells = " | ".join(pair_cell(v[k], wins=False) for k in ("all", "image"))
        against = f" {accuracy.drop_cell(v.get('accuracy'))} |" if scored else ""
        lines.append(f"| {v['anchor']} | {acc}{a['bytes'] / 1e6:.3f} | {a['kl']:.3g} | {v['plan']} "
                     f"({v['bytes_ratio']:.2f}x bytes) |{against} {cells} | {'met' if v['met'] else 'not met'} |")
    return lines


def _accuracy_panel(ax, plans: list[dict], anchors: dict[str, dict]) -> None:
    """Task accuracy against bytes with each 95 % Wilson interval: the plans (a line) and the
    anchors, fp32's accuracy as a dashed line."""
    import matplotlib.pyplot as plt

    def point(row):
        a = row["accuracy"]["accuracy"]
        return 100 * a["accuracy"], [[max(0.0, 100 * (a["accuracy"] - a["low"]))],
                                     [max(0.0, 100 * (a["high"] - a["accuracy"]))]]

    scored = [p for p in plans if p.get("accuracy")]
    ys = [point(p) for p in scored]
    ax.errorbar([p["bytes"] / 1e6 for p in scored], [y for y, _ in ys],
                yerr=np.concatenate([e for _, e in ys], axis=1) if ys else None, fmt="o-", color="C0", capsize=2,
                label="plans")
    colors, markers = plt.get_cmap("tab10").colors, "sD^vP*Xh"
    for i, (name, a) in enumerate(anchors.items()):
        if a.get("accuracy"):
            y, e = point(a)
            ax.errorbar(a["bytes"] / 1e6, y, yerr=e, fmt=markers[i % len(markers)], color=colors[(i + 1) % 10],
                        capsize=2, label=name)
    ref = next((p["accuracy"] for p in scored if p["accuracy"].get("vs_fp32")), None)
    if ref is not None:
        fp32 = 100 * (ref["accuracy"]["accuracy"] - ref["vs_fp32"]["all"]["difference"])
        ax.axhline(fp32, ls="--", color="gray", lw=1, label="fp32")
    ax.set_ylabel("task accuracy, % (95 % Wilson)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def write(front: dict, measure_files: dict[str, str | Path], out_json, out_md, out_png,
          kl_budget: float | None = None, latency: dict | None = None,
          answers: dict[str, str | Path] | None = None) -> dict:
    from vlsens.deploy.compare import write_pair

    result = write_pair(table(front, measure_files, kl_budget, latency, answers), markdown, out_json, out_md)
    figure(result, out_png)
    return result
