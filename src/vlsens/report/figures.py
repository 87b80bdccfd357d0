"""The report's figures, one function per family, each writing one PNG (matplotlib, Agg: no
display, no browser, no network) atomically.

Metrics follow the records: a sensitivity row's error is its ``kl`` when the graph has logits
(text, decoder) and its ``mse`` otherwise; ``ort`` scores an op alone in INT8 (high = sensitive),
``inc`` scores it alone back in FP32 with everything else INT8 (low = sensitive).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from vlsens.core.fsutil import atomic_file
from vlsens.model.family import NODE_NAMES

#: Column order of the heatmap (roles as the ranking names them, grouped by :func:`role_column`).
ROLE_ORDER = list(NODE_NAMES.role_order)
OUTSIDE = "outside blocks"
KEPT_COLOUR, INT8_COLOUR, PLANTED_COLOUR, MASK_COLOUR = "#d95f02", "#1b9e77", "#e7298a", "#999999"
FP16_MAX = 65504.0
DPI = 110


def role_column(role: str) -> str:
    """The heatmap column of a ranking row's ``role``: the attention MatMuls by what they compute
    (``attn Q·Kᵀ``, ``attn A·V``; one per window in the fixed-size vision graphs, the cell shows
    the worst), ``attn MatMul`` where a ranking of an older run has only their exported names;
    module prefixes are dropped."""
    r = str(role)
    for prefix in ("self_attn", "attn"):
        if r == prefix + ".qk":
            return "attn Q·Kᵀ"
        if r == prefix + ".av":
            return "attn A·V"
        if r == prefix or r.startswith(prefix + ".MatMul"):
            return "attn MatMul"
        r = r.removeprefix(prefix + ".")
    r = r.removeprefix("mlp.")
    if r.startswith("merger."):
        return "merger." + r.rsplit(".", 1)[-1]
    if r.startswith("patch_embed"):
        return "patch_embed"
    return r


def error_metric(rows: list[dict]) -> str:
    """``kl`` for graphs with logits, else ``mse``."""
    return "kl" if rows and "kl" in rows[0] else "mse"


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _save(fig, out: str | Path) -> Path:
    with atomic_file(out, ".png") as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    return Path(out)


def _short(op: str) -> str:
    """An op name without the tower prefix and the op type suffix (labels)."""
    parts = [p for p in op.split("/") if p]
    if parts and parts[0] in NODE_NAMES.prefixes:
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] in ("MatMul", "Gemm", "Conv"):  # the op type alone says nothing
        parts = parts[:-1]
    return "/".join(parts)


def heatmap(rows: list[dict], out: str | Path, title: str, kept: Iterable[str] = (),
            planted: Iterable[str] = (), block: str = "block", wide: Iterable[str] = ()) -> dict:
    """Blocks (``block``: their name, "layer" for a text model) x roles, colour = log10 of the
    largest error of the ops in the cell. Cells with an op
    the profile keeps in float are outlined; cells with an op it gives 16-bit activations (W8A16,
    ``wide``) carry a dashed outline and "A16"; a planted op's cell carries a star. Returns the
    grid (``rows``, ``columns``, ``values``: log10 errors, NaN where no op sits)."""
    metric = error_metric(rows)
    kept, planted, wide = set(kept), set(planted), set(wide)
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        cells[(r["block"] if r["block"] != "" else OUTSIDE, role_column(r["role"]))].append(r)
    blocks = sorted({b for b, _ in cells if b != OUTSIDE}) + ([OUTSIDE] if any(b == OUTSIDE for b, _ in cells) else [])
    present = {c for _, c in cells}
    columns = [c for c in ROLE_ORDER if c in present] + sorted(present - set(ROLE_ORDER))
    values = np.full((len(blocks), len(columns)), np.nan)
    for (b, c), ops in cells.items():
        worst = max(float(o[metric]) for o in ops)
        values[blocks.index(b), columns.index(c)] = math.log10(worst) if worst > 0 else np.nan
    fig = _figure(1.6 + 0.75 * len(columns), 1.8 + 0.32 * len(blocks))
    ax = fig.add_subplot()
    from matplotlib import colormaps

    im = ax.imshow(np.ma.masked_invalid(values), cmap=colormaps["magma"].with_extremes(bad="#eeeeee"), aspect="auto")
    fig.colorbar(im, ax=ax, label=f"log10 {metric.upper()} (op alone INT8)", shrink=0.9)
    ax.set_xticks(range(len(columns)), columns, rotation=40, ha="right")
    ax.set_yticks(range(len(blocks)), [f"{block} {b}" if b != OUTSIDE else b for b in blocks])
    from matplotlib.patches import Rectangle

    marked_kept = marked_planted = marked_wide = 0
    for (b, c), ops in cells.items():
        y, x = blocks.index(b), columns.index(c)
        if any(o["op"] in kept for o in ops):
            ax.add_patch(Rectangle((x - 0.47, y - 0.47), 0.94, 0.94, fill=False, edgecolor="#00e5ff", linewidth=2.2))
            marked_kept += 1
        if any(o["op"] in wide for o in ops):
            ax.add_patch(Rectangle((x - 0.40, y - 0.40), 0.80, 0.80, fill=False, edgecolor="#1f5cff", linewidth=2.0,
                                   linestyle="--"))
            ax.text(x, y, "A16", ha="center", va="center", fontsize=8, color="#1f5cff", fontweight="bold",
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.9})
            marked_wide += 1
        if any(o["op"] in planted for o in ops):
            ax.scatter([x], [y], marker="*", s=260, c=PLANTED_COLOUR, edgecolors="white", linewidths=1.0, zorder=3)
            marked_planted += 1
    notes = []
    if marked_kept:
        notes.append("cyan outline: the profile keeps an op of the cell in float")
    if marked_wide:
        notes.append("blue dashed, A16: an op of the cell takes 16-bit activations (W8A16)")
    if marked_planted:
        notes.append("pink star: planted outlier op")
    ax.set_title(title + ("\n" + "; ".join(notes) if notes else ""), fontsize=10)
    _save(fig, out)
    return {"rows": blocks, "columns": columns, "values": values, "kept_cells": marked_kept,
            "planted_cells": marked_planted, "wide_cells": marked_wide}


def ranked(rows: list[dict], out: str | Path, title: str, engine: str = "ort", top: int = 20,
           kept: Iterable[str] = (), planted: Iterable[str] = ()) -> list[str]:
    """The ``top`` most sensitive ops (by the CSV's rank) as bars of their error, log scale.
    Returns the ops shown, most sensitive first."""
    metric = error_metric(rows) if engine == "ort" else "mse"
    kept, planted = set(kept), set(planted)
    shown = sorted(rows, key=lambda r: int(r["rank"]))[:top]
    vals = [max(float(r[metric]), 1e-30) for r in shown]
    fig = _figure(8.5, 1.4 + 0.3 * len(shown))
    ax = fig.add_subplot()
    y = np.arange(len(shown))
    colours = [KEPT_COLOUR if r["op"] in kept else INT8_COLOUR for r in shown]
    bars = ax.barh(y, vals, color=colours)
    for bar, r in zip(bars, shown):
        if r["op"] in planted:
            bar.set_hatch("//")
            bar.set_edgecolor(PLANTED_COLOUR)
    ax.set_yticks(y, [_short(r["op"]) + ("  (planted)" if r["op"] in planted else "") for r in shown], fontsize=8)
    ax.invert_yaxis()
    if max(vals) / min(vals) > 20:
        ax.set_xscale("log")
    what = {"ort": f"{metric.upper()} with the op alone in INT8 (higher = more sensitive)",
            "inc": "MSE with the op alone back in FP32, the rest INT8 (lower = more sensitive)"}[engine]
    ax.set_xlabel(what)
    from matplotlib.patches import Patch

    handles = [Patch(color=INT8_COLOUR, label="INT8 in the profile"), Patch(color=KEPT_COLOUR, label="kept in float")]
    if kept:
        ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    _save(fig, out)
    return [r["op"] for r in shown]


#: How a profile metric is drawn: (transform, axis label, log scale, lower is better after the transform)
_AXIS = {
    "cosine": (lambda v: 1.0 - v, "1 − cosine", True, True),
    "mse": (lambda v: v, "MSE", True, True),
    "kl": (lambda v: v, "mean KL per token", True, True),
    "sqnr_db": (lambda v: v, "SQNR (dB)", False, False),
    "top1": (lambda v: v, "top-1 agreement", False, False),
}


def _pareto_points(record: dict) -> dict:
    """What :func:`pareto` plots, with the metric drawn (:data:`_AXIS`): the search's evaluations
    (``points``), its chosen point, the shipped model (``built``), every build, the target."""
    metric, target = record["target"]["metric"], float(record["target"]["value"])
    f, _, log, _ = _AXIS[metric]
    n = int(record["quantizable_ops"])
    trace = record["search"]["trace"]
    pts = [{"ops": t["int8_ops"] / n if n else 0.0, "weights": t.get("int8_weight_share"),
            "y": f(float(t[metric])), "meets": bool(t["meets"])} for t in trace]
    floor = 1e-12 if log else -math.inf  # a perfect point still has a place on a log axis
    for p in pts:
        p["y"] = max(p["y"], floor)
    meeting = [(t, p) for t, p in zip(trace, pts) if p["meets"]]
    chosen = max(meeting, key=lambda tp: tp[0]["int8_ops"])[1] if meeting else {"ops": 0.0, "weights": 0.0, "y": None}
    built = {"ops": float(record["int8_op_share"]), "weights": float(record["int8_weight_share"]),
             "y": max(f(float(record["measured"][metric])), floor),
             "latency": (record.get("latency_ms") or {}).get("int8_mixed")}
    builds = [{"ops": b["int8_ops"] / n if n else 0.0, "weights": b["int8_weight_share"],
               "y": max(f(float(b[metric])), floor), "meets": bool(b["meets"]), "latency": b.get("latency_ms")}
              for b in record.get("builds", [])]
    return {"points": pts, "chosen": chosen, "built": built, "builds": builds, "target": f(target)}


def _pareto_y_axis(ax, metric: str) -> None:
    _, label, log, lower_better = _AXIS[metric]
    if log:
        ax.set_yscale("log")
    if lower_better:
        ax.invert_yaxis()  # better is up
    ax.set_ylabel(f"{label}{' (log)' if log else ''}, better ↑")
    ax.grid(alpha=0.3)


def _pareto_share_panel(ax, key: str, xlabel: str, plotted: dict, record: dict) -> None:
    """One share panel of :func:`pareto`: the search's evaluations and their frontier, the target,
    the chosen point, the other builds and the shipped one against the INT8 share ``key``."""
    metric, target = record["target"]["metric"], float(record["target"]["value"])
    lower_better = _AXIS[metric][3]
    pts, chosen, built, builds = plotted["points"], plotted["chosen"], plotted["built"], plotted["builds"]
    xs = np.array([p[key] for p in pts])
    ys = np.array([p["y"] for p in pts])
    ok = np.array([p["meets"] for p in pts])
    # the frontier: points no other point beats on both share and metric
    order = np.argsort(-xs, kind="stable")
    front, best = [], None
    for i in order:
        y = ys[i]
        if best is None or (y < best if lower_better else y > best):
            front.append(i)
            best = y
    front = sorted(front, key=lambda i: xs[i])
    ax.plot(xs[front], ys[front], "-", color="#999999", lw=1.2, label="frontier of the evaluations", zorder=1)
    ax.scatter(xs[ok], ys[ok], c=INT8_COLOUR, s=28, label="estimated: meets the target", zorder=2)
    ax.scatter(xs[~ok], ys[~ok], c="#d62728", marker="x", s=34, label="estimated: misses it", zorder=2)
    ax.axhline(plotted["target"], color="#333333", ls="--", lw=1.2,
               label=f"target {metric} {record['target']['direction']} {target:g}")
    if chosen["y"] is not None:
        ax.scatter([chosen[key]], [chosen["y"]], s=160, facecolors="none", edgecolors="#1f77b4", linewidths=2,
                   label="chosen by the search", zorder=3)
    others = [b for b in builds if (b[key], b["y"]) != (built[key], built["y"])]
    if others:
        ax.scatter([b[key] for b in others], [b["y"] for b in others], marker="D", s=30, facecolors="none",
                   edgecolors="#555555", label="other built models (measured)", zorder=3)
    ax.scatter([built[key]], [built["y"]], marker="*", s=240, c="#ffbf00", edgecolors="black", linewidths=0.8,
               label="shipped model (measured)", zorder=4)
    _pareto_y_axis(ax, metric)
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel(xlabel)


def _pareto_latency_panel(ax, plotted: dict, record: dict) -> None:
    """The latency panel of :func:`pareto`: every timed build against the metric, FP32 and FP16
    as vertical lines, the target."""
    built = plotted["built"]
    lat = record.get("latency_ms") or {}
    labelled = set()
    for b in plotted["builds"]:
        if b["latency"] is None:
            continue
        kind = "built, meets the target" if b["meets"] else "built, misses it"
        ax.scatter([b["latency"]], [b["y"]], marker="D" if b["meets"] else "x", s=34,
                   c=INT8_COLOUR if b["meets"] else "#d62728", zorder=2,
                   label=None if kind in labelled else kind)
        labelled.add(kind)
    if built["latency"] is not None:
        ax.scatter([built["latency"]], [built["y"]], marker="*", s=240, c="#ffbf00", edgecolors="black",
                   linewidths=0.8, label=f"shipped: {built['latency']:.3g} ms", zorder=4)
    for base, colour in (("fp32", "#7570b3"), ("fp16", "#66a61e")):
        if lat.get(base):
            ax.axvline(float(lat[base]), color=colour, lw=1.4, ls="-.", label=f"{base}: {float(lat[base]):.3g} ms")
    ax.axhline(plotted["target"], color="#333333", ls="--", lw=1.2)
    _pareto_y_axis(ax, record["target"]["metric"])
    sp = (record.get("speedup") or {}).get("vs_fp32")
    ax.set_xlabel(f"latency (ms, {record.get('quant_target', {}).get('measured_on', ['?'])[0]})"
                  + (f"; {sp:.2f}x vs fp32" if sp else ""))
    ax.legend(fontsize=7, loc="lower left")


def pareto(record: dict, out: str | Path, title: str) -> dict:
    """The profile search's evaluations: INT8 share of the ops (left) and of the weights (middle)
    against the metric (drawn so that better is up), the target line, the search's chosen point,
    every model built on the way and the shipped one (measured in the target's arithmetic); and
    the latency panel (right): every timed build against the metric, FP32 and FP16 as vertical
    lines, so whether the shipped model is worth deploying is read off one axis. Returns the
    plotted points."""
    plotted = _pareto_points(record)
    panels = [("ops", "INT8 share of the quantizable ops")]
    if all(p["weights"] is not None for p in plotted["points"]):
        panels.append(("weights", "INT8 share of the weights"))
    with_latency = bool(any(b["latency"] is not None for b in plotted["builds"]) or plotted["built"]["latency"])
    fig = _figure(4.6 * (len(panels) + with_latency), 4.6)
    axes = fig.subplots(1, len(panels) + with_latency, squeeze=False)[0]
    for ax, (key, xlabel) in zip(axes, panels):
        _pareto_share_panel(ax, key, xlabel, plotted, record)
    axes[0].legend(fontsize=7, loc="lower left")
    if with_latency:
        _pareto_latency_panel(axes[-1], plotted, record)
    fig.suptitle(title, fontsize=10)
    _save(fig, out)
    return plotted


def engines(ort_rows: list[dict], inc_rows: list[dict], record: dict, out: str | Path, title: str) -> int:
    """``ort`` vs ``inc`` on the ops both engines scored: their scores log-log (left) and their
    ranks (right, the diagonal is full agreement), with Spearman's rho and the top-k overlaps of
    ``compare.json``. Returns the number of points."""
    inc = {r["op"]: r for r in inc_rows}
    common = [(r, inc[r["op"]]) for r in ort_rows if r["op"] in inc]
    xs = np.array([max(float(o["mse"]), 1e-30) for o, _ in common])
    ys = np.array([max(float(i["mse"]), 1e-30) for _, i in common])
    fig = _figure(11.0, 5.0)
    left, right = fig.subplots(1, 2)
    top = sorted(common, key=lambda oi: int(oi[0]["rank"]))[:3]
    left.scatter(xs, ys, s=22, c=INT8_COLOUR, alpha=0.8)
    for o, i in top[:1]:  # the most sensitive op by ort (the others crowd in one corner)
        left.annotate(_short(o["op"]), (max(float(o["mse"]), 1e-30), max(float(i["mse"]), 1e-30)), fontsize=7,
                      xytext=(4, -10), textcoords="offset points")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("ort: MSE with the op alone INT8 (right = more sensitive)")
    left.set_ylabel("inc: MSE with the op alone back in FP32 (down = more sensitive)")
    left.grid(alpha=0.3, which="both")
    # ranks among the common ops (1 = most sensitive for both engines)
    ro = {o["op"]: k for k, (o, _) in enumerate(sorted(common, key=lambda oi: int(oi[0]["rank"])), 1)}
    ri = {i["op"]: k for k, (_, i) in enumerate(sorted(common, key=lambda oi: int(oi[1]["rank"])), 1)}
    n = len(common)
    right.plot([1, n], [1, n], color="#999999", lw=1, ls="--", label="same rank")
    right.scatter([ro[o["op"]] for o, _ in common], [ri[o["op"]] for o, _ in common], s=22, c=INT8_COLOUR, alpha=0.8)
    for o, _ in top:
        right.annotate(_short(o["op"]), (ro[o["op"]], ri[o["op"]]), fontsize=7, xytext=(4, 2),
                       textcoords="offset points")
    right.set_xlabel("rank by ort (1 = most sensitive)")
    right.set_ylabel("rank by inc")
    right.invert_xaxis()
    right.invert_yaxis()
    right.legend(fontsize=8, loc="lower right")
    right.grid(alpha=0.3)
    rho = record.get("spearman")
    overlaps = ", ".join(f"top-{v['k']} {v['overlap']:.0%}"
                         for _, v in sorted(record.get("top_k", {}).items(), key=lambda kv: int(kv[0])))
    rho_s = f"{rho:.3f}" if isinstance(rho, (int, float)) else "n/a"
    fig.suptitle(f"{title}: {n} ops scored by both\nSpearman ρ (sensitivity scores) = {rho_s}; overlap: {overlaps}",
                 fontsize=10)
    _save(fig, out)
    return n


def mask_valued(observed: float) -> bool:
    """A value that is a mask or a sentinel constant, not an activation: FP16's own limit (the
    exporter's ``finfo(float16).min`` attention masks, and sums with them: 65504 to within 0.1 %) or
    an enormous constant (``-1e30``, ``finfo(float32).min``). A real activation over FP16's range
    (Qwen2.5-VL-3B's last vision MLP, ~1e5) is neither and counts as a finding."""
    return abs(observed / FP16_MAX - 1.0) < 1e-3 or observed >= 1e29


def fp16_fallback(graphs: dict[str, dict], out: str | Path, title: str, top: int = 30) -> list[str]:
    """Per graph file of an FP16 folder: the nodes kept in FP32 because a tensor they touch exceeds
    the bound (observed |value| vs bound, log scale), and how many nodes stay FP32 as the model's
    own float32 islands. The findings (activations and weights over the bound) come first, the
    nodes that only touch masks and sentinel constants (:func:`mask_valued`) after them, in grey.
    Returns the nodes shown, in their order."""
    items = []
    for name, facts in graphs.items():
        for f in facts.get("fp32_fallback", []):
            items.append((name, f))
    items.sort(key=lambda it: (mask_valued(float(it[1].get("observed", 0.0))), -float(it[1].get("observed", 0.0))))
    shown = items[:top]
    islands = {name: facts.get("fp32_islands", {}).get("nodes", 0) for name, facts in graphs.items()}

    def counts(n):
        mine = [f for g, f in items if g == n]
        masks = sum(mask_valued(float(f.get("observed", 0.0))) for f in mine)
        return (f"{n}: {len(mine) - masks} finding(s), {masks} on masks / constants, "
                f"{islands[n]} in float32 islands")

    subtitle = "\n".join(counts(n) for n in graphs)
    fig = _figure(8.5, 2.2 + 0.18 * len(graphs) + 0.3 * max(len(shown), 2))
    ax = fig.add_subplot()
    if shown:
        y = np.arange(len(shown))
        masks = [mask_valued(float(f["observed"])) for _, f in shown]
        ax.barh(y, [float(f["observed"]) for _, f in shown], color=[MASK_COLOUR if m else KEPT_COLOUR for m in masks])
        from matplotlib.patches import Patch

        handles = ([Patch(color=KEPT_COLOUR, label="finding: largest |value| seen, over the bound")]
                   if not all(masks) else [])
        handles += ([Patch(color=MASK_COLOUR, label="mask / constant (at FP16's limit, or ≥ 1e29)")]
                    if any(masks) else [])
        ax.add_artist(ax.legend(handles=handles, fontsize=8, loc="lower right"))
        for i, (_, f) in enumerate(shown):
            ax.plot([f["bound"], f["bound"]], [i - 0.45, i + 0.45], color="black", lw=2)
        ax.plot([], [], color="black", lw=2, label="bound (fp16.max_activation / max_initializer)")
        multi = len(graphs) > 1
        ax.set_yticks(y, [(f"{name}: " if multi else "") + _short(f["node"]) + f"  [{f['kind']}]"
                          for name, f in shown], fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        fig.legend(fontsize=8, loc="outside lower center", ncols=2)
        more = f" (largest {len(shown)} of {len(items)})" if len(items) > len(shown) else ""
        ax.set_title(f"{title}: FP32 fallback{more}\n{subtitle}", fontsize=9)
    else:  # nothing fell back: show the largest activation seen against the bound
        names = list(graphs)
        obs = [float(graphs[n].get("observed_max_activation", 0.0)) for n in names]
        bound = [float(graphs[n].get("max_activation", 0.0)) for n in names]
        y = np.arange(len(names))
        ax.barh(y, obs, color=INT8_COLOUR, label="largest activation observed")
        ax.scatter(bound, y, marker="|", s=400, c="black", label="fp16.max_activation")
        ax.set_yticks(y, names)
        ax.set_xscale("log")
        fig.legend(fontsize=8, loc="outside lower center", ncols=2)
        ax.set_title(f"{title}: no node over the bound, nothing fell back\n{subtitle}", fontsize=9)
    ax.set_xlabel("|value| (log)")
    _save(fig, out)
    return [f["node"] for _, f in shown]


def latency_size(entries: list[dict], out: str | Path, title: str, deploy: list[dict] = ()) -> int:
    """Grouped bars per graph: latency (ms, ONNX Runtime) and size (MB) of the fp32, fp16 and
    INT8-mixed models; with ``deploy`` ({precision, bytes, tokens_per_second?}), the deploy
    folders' sizes (and decode speed where measured) beside them. Returns the bars drawn."""
    kinds = ["fp32", "fp16", "int8_mixed"]
    colours = {"fp32": "#7570b3", "fp16": "#66a61e", "int8_mixed": "#e6ab02", "int8-mixed": "#e6ab02"}
    panels = [("latency_ms", "latency (ms, median)"), ("bytes", "size (MB)")]
    speed = [d for d in deploy if d.get("tokens_per_second")]
    # two panels per row (a laptop window shows the figure about 1000 px wide: four in a row made
    # their labels 7 px); the graphs' panels on top, the deploy folders' below
    top_h = 1.2 + 0.42 * max(len(entries), 2)
    if deploy:
        bottom_h = 1.2 + 0.42 * max(len(deploy), 2)
        fig = _figure(11.0, top_h + bottom_h + 0.6)
        grid = fig.add_gridspec(2, 2, height_ratios=[top_h, bottom_h])
        axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 0])]
        if speed:
            axes.append(fig.add_subplot(grid[1, 1]))
    else:
        fig = _figure(11.0, top_h + 0.6)
        axes = list(fig.subplots(1, 2, squeeze=False)[0])
    drawn = 0
    y = np.arange(len(entries))
    h = 0.8 / len(kinds)
    for ax, (key, label) in zip(axes, panels):
        for k, kind in enumerate(kinds):
            vals = [float(e[key].get(kind) or 0.0) / (1e6 if key == "bytes" else 1.0) for e in entries]
            ax.barh(y + (k - 1) * h, vals, h, color=colours[kind], label=kind.replace("_", "-"))
            drawn += sum(v > 0 for v in vals)
        ax.set_yticks(y, [e["graph"] for e in entries])
        ax.invert_yaxis()
        positive = [float(e[key].get(k) or 0.0) for e in entries for k in kinds if (e[key].get(k) or 0) > 0]
        if positive and max(positive) / min(positive) > 50:  # graphs of very different cost side by side
            ax.set_xscale("log")
            label += ", log"
        ax.set_xlabel(label)
        ax.grid(alpha=0.3, axis="x")
    axes[0].legend(fontsize=8)
    if deploy:
        ax = axes[len(panels)]
        yd = np.arange(len(deploy))
        ax.barh(yd, [d["bytes"] / 1e6 for d in deploy], color=[colours.get(d["precision"], "#999") for d in deploy])
        ax.set_yticks(yd, [f"deploy/{d['precision']}" for d in deploy])
        ax.invert_yaxis()
        ax.set_xlabel("deploy folder size (MB)")
        drawn += len(deploy)
    if speed:
        ax = axes[-1]
        ys = np.arange(len(speed))
        ax.barh(ys, [d["tokens_per_second"] for d in speed], color=[colours.get(d["precision"], "#999") for d in speed])
        ax.set_yticks(ys, [f"deploy/{d['precision']}" for d in speed])
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s (onnxruntime-genai)")
        drawn += len(speed)
    fig.suptitle(title, fontsize=10)
    _save(fig, out)
    return drawn


def nbits_heatmap(rows: list[dict], bits: dict[str, int], out: str | Path, title: str) -> dict:
    """Weight-only sensitivity of the decoder: layers (rows) x MatMul roles (columns), coloured by
    the error with that MatMul alone in INT4 (engine nbits), each cell labelled with the width the
    int4-mixed profile chose (4, 8 or FP); a row with ``tied`` (lm_head with its tied table,
    measured by the profile) is named so."""
    import numpy as np
    from matplotlib.colors import LogNorm

    layers = sorted({int(r["block"]) for r in rows if str(r["block"]).strip() != ""})
    roles = list(dict.fromkeys(str(r["role"]) for r in rows if str(r["block"]).strip() != ""))
    outside = [r for r in rows if str(r["block"]).strip() == ""]  # lm_head
    grid = np.full((len(layers) + len(outside), len(roles) or 1), np.nan)
    labels = [[""] * grid.shape[1] for _ in range(grid.shape[0])]
    names = {0: "FP", 4: "4", 8: "8"}
    for r in rows:
        e = max(float(r["error_int4"]), 1e-12)
        if str(r["block"]).strip() != "":
            i, j = layers.index(int(r["block"])), roles.index(str(r["role"]))
        else:
            i, j = len(layers) + outside.index(r), 0
        grid[i, j] = e
        labels[i][j] = names.get(bits.get(r["op"], 4), "?")
    fig = _figure(1.6 + 1.1 * grid.shape[1], 1.4 + 0.42 * grid.shape[0])
    ax = fig.add_subplot()
    finite = grid[np.isfinite(grid)]
    im = ax.imshow(grid, aspect="auto", cmap="viridis",
                   norm=LogNorm(vmin=max(finite.min(), 1e-12), vmax=max(finite.max(), 1e-11)))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if labels[i][j]:
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=10,
                        color="white" if labels[i][j] == "4" else "#ff4040", fontweight="bold")
    ax.set_xticks(range(len(roles)), roles, rotation=30, ha="right", fontsize=10)
    ax.set_yticks(range(grid.shape[0]), [f"layer {n}" for n in layers] +
                  [_short(r["op"]) + (" + tied table" if r.get("tied") else "") for r in outside],
                  fontsize=10)
    ax.set_title(title, fontsize=11)
    fig.colorbar(im, ax=ax, label="KL per token (alone INT4)" if "kl_int4" in rows[0] else "1 - cosine (alone INT4)")
    _save(fig, out)
    return {"cells": int(np.isfinite(grid).sum()), "not_int4": sum(1 for r in rows if bits.get(r["op"], 4) != 4)}


def int4_pareto(result: dict, out: str | Path, title: str) -> int:
    """Decoder bytes against the mean KL with the fp32 folder through onnxruntime-genai, one point
    per int4 deploy folder (vlsens.deploy.compare)."""
    fig = _figure(7.5, 4.8)
    ax = fig.add_subplot()
    styles = {"int4-mixed": ("*", "#d62728", 16)}
    for p, r in result["rows"].items():
        if r["mean_kl"] is None:
            continue
        marker, color, size = styles.get(p, ("o", "#1f77b4", 9))
        ax.plot(r["decoder_bytes"] / 1e6, max(r["mean_kl"], 1e-12), marker, color=color, markersize=size)
        ax.annotate(p, (r["decoder_bytes"] / 1e6, max(r["mean_kl"], 1e-12)), textcoords="offset points",
                    xytext=(6, 6), fontsize=10)
    ax.set_yscale("log")
    ax.margins(x=0.25, y=0.15)  # room for the labels
    ax.set_xlabel("decoder size, MB (graph + weights)", fontsize=10)
    ax.set_ylabel("mean KL vs fp32 folder per step", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=11)
    _save(fig, out)
    return len(result["rows"])
