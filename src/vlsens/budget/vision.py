"""The vision graph's Linears, each priced on the answer: a mixed vision format for the plan.

A whole-graph vision format (``int4``, ``int8-wo``, ...) puts every Linear at one width; on a
checkpoint where a few Linears carry the vision tower's sensitivity (an outlier channel, the
blocks that feed the merger), the INT4 graph's error is mostly theirs. Here each Linear's cost is
measured where the folders are judged:

1. **Per Linear** (:func:`measure_ops`): the fp32 vision graph with that one Linear at INT4 (the
   run's ``int4`` format, every other Linear float) assembled into the fp32 folder and measured end
   to end (:func:`vlsens.deploy.genai.measure.measure_folder`: KL per generated step against the
   fp32 folder through onnxruntime-genai, on the measure's image cases; the text cases do not
   reach the vision graph and count 0, run they measure 1e-14). Its bytes at INT4 and at INT8
   weight-only are read from the gated ``int4`` and ``int8-wo`` graphs. The table is
   ``budget/vision.csv`` (one row a Linear, like the decoder's ``nbits.csv``).
2. **The curve** (:func:`mixed_curve`): from every Linear at INT8 weight-only (``int8-wo``, its KL
   measured as a component) Linears move to INT4 in increasing KL per byte saved; point ``k`` holds
   the first ``k``. The mixed graphs at nine k (eighths of the Linears, all but two, all but one)
   are measured whole, and these are the vision options of the front: their KL is measured, not
   estimated (summed one by one the Linears' INT4 KLs miss it by up to a quarter: together they
   cost 1.0-1.26x as much on the tiny preset, :func:`calibration`); their bytes are the INT8
   graph's in the folder minus the bytes the moved Linears save.
   The points become vision options ``mixed:<k>`` of the front's search; a plan that picks one
   names every Linear's format (:class:`vlsens.budget.plan.Plan` ``vision_ops``) and its folder
   builds and gates that graph (:func:`vlsens.precision.weight_only.vision_folder`).

Cost: one folder measure per Linear (on the tiny preset 22 Linears, about 1 s each); at 3B, 162
Linears each with a 2.7 GB graph written and the measure's 24 cases run through the whole VLM: the
affordable form there is the estimate through the decoder's sensitivity to its image features,
which this module does not do yet.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

#: the vision options of the front's search that name a point of the mixed curve
MIXED_PREFIX = "mixed:"
COLUMNS = ("op", "K", "N", "bytes_float", "bytes_int4", "bytes_int8", "kl_int4", "kl_int4_text", "kl_int4_image",
           "kl_int4_images")


def measure_ops(checkpoint, reference, cases, base: Mapping, graphs: Mapping, settings, work: str | Path) -> list[dict]:
    """One row per Linear of the fp32 vision graph (``graphs["fp32"]``; ``graphs["int4"]`` and
    ``graphs["int8-wo"]``: the gated weight-only graphs its bytes are read from): its INT4 KL in
    the fp32 folder (``base``: the folder's decoder, embedding and vision graphs and the ``folder``
    itself, whose vision preamble is reused), per modality."""
    import shutil

    from vlsens.core.errors import VlsensError
    from vlsens.core.onnxutil import model_bytes
    from vlsens.deploy.genai import folder as genai
    from vlsens.deploy.genai.assemble import assemble
    from vlsens.deploy.genai.measure import measure_folder
    from vlsens.precision.weight_only import FORMATS, linears, quantize_vision
    from vlsens.quantize.nbits import float_bytes, quantized_nodes

    ops = linears(graphs["fp32"])
    q4, q8, fb = quantized_nodes(graphs["int4"]), quantized_nodes(graphs["int8-wo"]), float_bytes(ops)
    for name, q in (("int4", q4), ("int8-wo", q8)):
        missing = sorted({o["name"] for o in ops} - set(q))
        if missing:
            raise VlsensError(f"{graphs[name]}: Linears not quantized: {missing[:5]} ({len(missing)}); the "
                              f"{name} vision graph quantizes every Linear of {graphs['fp32']}")
    image_modalities = {c["modality"] for c in cases if c["images"]}
    work = Path(work)
    folder = work / "folder"  # the fp32 folder, its vision graph replaced by each one measured
    preamble = Path(base["folder"]) / genai.GRAPHS["vision"]  # the fp32 folder's, reused: no torch here
    assemble(folder, checkpoint, base["decoder"], base["embedding"], base["vision"], work / "preamble",
             preamble_from=preamble)

    def measured(name: str, per_op: dict) -> tuple[float, dict]:
        """The fp32 folder with the vision graph of ``per_op``: the mean KL over every case (the
        text cases do not reach the vision graph and are not run: 0; run, 1e-14) and the measure."""
        staged = work / name / "model.onnx"
        quantize_vision(graphs["fp32"], staged, settings, per_op=per_op)
        genai.wrap_vision(staged, folder / genai.GRAPHS["vision"], None, work / f"{name}-preamble", preamble)
        m = measure_folder(folder, reference, cases, f"vision-{name}", modalities=image_modalities)
        m["bytes_in_folder"] = model_bytes(folder / genai.GRAPHS["vision"])  # with its preamble, as shipped
        shutil.rmtree(staged.parent, ignore_errors=True)
        return sum(float(r["kl"]) for r in m["cases"]) / len(cases), m

    rows = []
    for i, o in enumerate(ops):
        kl, m = measured(f"op{i}", {p["name"]: (FORMATS["int4"] if p["name"] == o["name"] else None) for p in ops})
        mods = {k: v["mean_kl"] for k, v in m["modalities"].items()}
        rows.append({"op": o["name"], "K": o["K"], "N": o["N"], "bytes_float": fb[o["name"]],
                     "bytes_int4": q4[o["name"]]["bytes"], "bytes_int8": q8[o["name"]]["bytes"],
                     "kl_int4": kl, **{f"kl_int4_{k}": mods.get(k, 0.0) for k in ("text", "image", "images")}})
        log.info("vision Linear %d/%d %s: INT4 KL %.4g (%.1f s)", i + 1, len(ops), o["name"], kl, m["seconds"])
    points, order = [], order_of(rows)
    for k in point_ks(len(rows)):  # whole mixed graphs along the curve: how the errors add up there
        first = {rows[i]["op"] for i in order[:k]}
        kl, m = measured(f"mixed{k}", {o["name"]: FORMATS["int4"] if o["name"] in first else FORMATS["int8-wo"]
                                       for o in ops})
        points.append({"int4": k, "kl": kl, "bytes": m["bytes_in_folder"]})  # as the folder ships it
        log.info("vision mixed, %d of %d Linears INT4: KL %.4g", k, len(rows), kl)
    return rows, points


def write_ops(checkpoint, reference, cases, base: Mapping, graphs: Mapping, settings, out_csv, out_json) -> dict:
    """The job: :func:`measure_ops` as ``vision.csv`` and a summary (``vision.json``: the Linears'
    INT4 KLs summed, how concentrated they are)."""
    from vlsens.core.fsutil import write_csv, write_json

    with tempfile.TemporaryDirectory(prefix="vlsens-vision-ops-") as work:
        rows, points = measure_ops(checkpoint, reference, cases, base, graphs, settings, work)
    write_csv(out_csv, rows, list(COLUMNS))
    kls = sorted((r["kl_int4"] for r in rows), reverse=True)
    total = sum(kls)
    record = {"linears": len(rows), "sum_kl_int4": total,
              "top": [{"op": r["op"], "kl_int4": r["kl_int4"]} for r in sorted(rows, key=lambda r: -r["kl_int4"])[:5]],
              "top1_share": kls[0] / total if total > 0 else None, "points": points,
              "note": "each Linear alone at INT4 (the run's int4 format), every other Linear float, in the fp32 folder, "
                      "measured end to end through onnxruntime-genai on the measure's image cases (its text cases "
                      "do not reach the vision graph and count 0)"}
    write_json(out_json, record)
    return record


def read_points(csv) -> list[dict]:
    """The whole mixed graphs measured along the curve, from the summary beside ``csv``
    (:data:`vlsens.core.paths.BUDGET_VISION`)."""
    from vlsens.core import paths

    summary = Path(csv).with_name(Path(paths.BUDGET_VISION["summary"]).name)
    return list(json.loads(summary.read_text()).get("points") or []) if summary.is_file() else []


def order_of(rows: Sequence[Mapping]) -> list[int]:
    """The rows in the order the mixed curve moves them to INT4: increasing ``kl_int4`` per byte
    saved (ties: graph order)."""
    return sorted(range(len(rows)), key=lambda i: (float(rows[i]["kl_int4"]) /
                                                   max(int(rows[i]["bytes_int8"]) - int(rows[i]["bytes_int4"]), 1), i))


def point_ks(n: int) -> list[int]:
    """The curve's inner points measured as whole graphs: eighths of the Linears, and all but one
    or two (where the few costliest Linears decide; on the tiny preset 3, 6, 8, 11, 14, 16, 19, 20, 21)."""
    return sorted({k for k in (*(round(n * j / 8) for j in range(1, 8)), n - 2, n - 1) if 1 <= k <= n - 1})


def additive(rows: Sequence[Mapping], int8: Mapping) -> list[float]:
    """For k = 0 .. n: the INT8 graph's KL plus the first ``k`` Linears' own INT4 KLs
    (:func:`order_of`)."""
    out = [float(int8["kl"])]
    for i in order_of(rows):
        out.append(out[-1] + max(float(rows[i]["kl_int4"]), 0.0))
    return out


def calibration(rows: Sequence[Mapping], int8: Mapping, int4: Mapping | None = None,
                points: Sequence[Mapping] = ()) -> list[tuple[int, float]]:
    """``[(k, measured / additive)]``: how the Linears' INT4 errors add up where the curve was
    measured whole: k = 0 (the INT8 graph itself: 1), the ``points`` (``{"int4": k, "kl"}``) and
    the INT4 graph at its end. On the tiny preset together the Linears cost 1.26x what they cost
    one by one at the end, more in the middle."""
    n, out, sums = len(rows), [(0, 1.0)], additive(rows, int8)
    for p in [*points, *([{"int4": n, "kl": int4["kl"]}] if int4 is not None else [])]:
        base = sums[int(p["int4"])]
        if base > 0:
            out.append((int(p["int4"]), float(p["kl"]) / base))
    return sorted(dict(out).items())


def _ratio(cal: Sequence[tuple[int, float]], k: int) -> float:
    """``cal`` interpolated linearly at ``k`` (held at its last value beyond it)."""
    for (k0, r0), (k1, r1) in zip(cal, cal[1:]):
        if k0 <= k <= k1:
            return r0 + (r1 - r0) * (k - k0) / (k1 - k0)
    return cal[-1][1]


def mixed_curve(rows: Sequence[Mapping], int8: Mapping, int4: Mapping | None = None,
                points: Sequence[Mapping] = ()) -> list[dict]:
    """``[{"name": "mixed:<k>", "bytes", "kl", "ops": {Linear: 4 | 8}, "int4": k, "ratio"}]`` for
    k = 1 .. n - 1 (k = 0 is ``int8-wo`` itself, k = n the ``int4`` graph, both measured as
    components): ``int8`` / ``int4``: the ``int8-wo`` and ``int4`` components (bytes in the folder,
    KL); ``points``: whole mixed graphs measured along the curve (``{"int4": k, "kl", "bytes"?}``:
    their bytes as the folder shipped them, where recorded; else the INT8 graph's less the Linears'
    savings, which misses the graph's own bytes per node). Linears move to INT4 in
    :func:`order_of`. With ``points``, the curve is those points alone, each with its measured KL
    (the estimate of the vision part is then a measurement); without, every k, its KL
    :func:`additive` times the ratio measured whole (:func:`calibration`) interpolated at k."""
    cal, sums = calibration(rows, int8, int4, points), additive(rows, int8)
    measured = {int(p["int4"]): float(p["kl"]) for p in points}
    built = {int(p["int4"]): int(p["bytes"]) for p in points if "bytes" in p}  # the mixed graph as it shipped
    order = order_of(rows)
    out, nbytes, moved = [], int(int8["bytes"]), set()
    for k, i in enumerate(order[:-1], 1):
        r = rows[i]
        nbytes -= int(r["bytes_int8"]) - int(r["bytes_int4"])
        moved.add(r["op"])
        if measured and k not in measured:
            continue
        ratio = measured[k] / sums[k] if k in measured else _ratio(cal, k)
        out.append({"name": f"{MIXED_PREFIX}{k}", "bytes": built.get(k, nbytes), "kl": sums[k] * ratio, "int4": k,
                    "ratio": ratio, "ops": {x["op"]: (4 if x["op"] in moved else 8) for x in rows}})
    return out
