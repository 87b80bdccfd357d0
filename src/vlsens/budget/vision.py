"""The vision graph's Linears, each priced on the answer: a mixed vision format for the plan.

A whole-graph vision format (``int4``, ``int8-wo``, ...) puts every Linear at one width; on a
checkpoint where a few Linears carry the vision tower's sensitivity (an outlier channel, the
blocks that feed the merger), the INT4 graph's error is mostly theirs. Here each Linear's cost is
measured where the folders are judged:

1. **Per Linear** (:func:`measure_ops`): the fp32 vision graph with that one Linear at INT4 (the
   run's ``int4`` format, every other Linear float) in the fp32 folder, measured end to end (KL
   per generated step against the fp32 folder, on the measure's image cases; the text cases do
   not reach the vision graph and count 0, run they measure 1e-14) by the part chain
   (:class:`vlsens.deploy.genai.chain.PartChain`: the folder's fp32 decoder and embedding opened
   once as plain ONNX Runtime sessions, each distinct image through the graph once; equal to
   :func:`vlsens.deploy.genai.measure.measure_folder` on the folder so assembled within the
   kernels' rounding, ``tests/test_chain.py``). Its bytes at INT4 and at INT8
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
Linears each with a 2.7 GB graph written and the measure's image cases run through the whole VLM.
``plan.vision_measured: <m>`` prices only ``m`` of them so, the rest by an **estimate**
(:func:`output_errors`, :func:`fit_scales`): each Linear's INT4 output error on the measure's images,
``e = sum ||X (W4 - W)^T||^2`` (``X`` its input in transformers' float vision tower on the folders'
own preprocessing, ``W4`` the INT4 graph's dequantized weight), all Linears in one float pass. Per
role (``blocks.<i>/mlp/down_proj`` for every ``i``; a Linear outside the blocks its own) the
Linear of largest ``e`` and the one of median ``e`` are measured end to end, then the others of
largest ``e`` up to ``m`` (:func:`choose_measured`), and each role's measured / ``e`` (geometric
mean) turns its other Linears' ``e`` into a KL, with one more factor per relative depth where the
run's measures, each held out, predict better with it (:class:`Fit`, :func:`choose_depth`: at 3B an
error in the first block costs 13x one in the last per unit of ``e``; on the 4-block tiny
checkpoints the term is not taken). The
curve's points stay measured whole, so the estimate only orders the Linears; ``vision.json``
reports every measured Linear's measure against its estimate from the others.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vlsens.sensitivity.estimate import (  # noqa: F401  (Fit, held_out: part of this module's estimate)
    Fit,
    block_count,
    choose_depth,
    choose_measured,
    held_out,
    relative_depth,
    role_of,
)

log = logging.getLogger(__name__)

#: the vision options of the front's search that name a point of the mixed curve
MIXED_PREFIX = "mixed:"
MODALITIES = ("text", "image", "images")
COLUMNS = ("op", "K", "N", "bytes_float", "bytes_int4", "bytes_int8", "kl_int4", "kl_int4_text", "kl_int4_image",
           "kl_int4_images", "measured", "output_error", "kl_estimate")


class _FolderMeasure:
    """The fp32 folder (``base["folder"]``, whose vision preamble each graph measured takes) with
    its vision graph replaced, measured on the image cases by the part chain
    (:class:`vlsens.deploy.genai.chain.PartChain`: its decoder and embedding sessions opened once,
    equal to the measure of the folder so assembled, ``tests/test_chain.py``); each call measures
    one vision graph (``per_op``: every Linear's format, as :func:`vlsens.precision.weight_only.quantize_vision`
    builds it), written as a :class:`~vlsens.precision.weight_only.VisionSplice` of the float graph
    (wrapped once) and the run's ``int4`` and ``int8-wo`` graphs: only the changed Linears' tensors
    are written, not the whole graph."""

    def __init__(self, checkpoint, reference, cases, base: Mapping, graphs: Mapping, settings, work: Path,
                 threads: int = 0):
        import shutil

        from vlsens.deploy.genai import folder as genai
        from vlsens.deploy.genai.chain import PartChain
        from vlsens.precision.weight_only import VisionSplice, linears, quantize_vision

        self.cases = cases
        preamble = Path(base["folder"]) / genai.GRAPHS["vision"]  # the fp32 folder's, reused: no torch here
        staged = work / "float" / "model.onnx"
        quantize_vision(graphs["fp32"], staged, settings, per_op={o["name"]: None for o in linears(graphs["fp32"])})
        wrapped = genai.wrap_vision(staged, work / "spliced" / genai.GRAPHS["vision"], None, work / "preamble", preamble)
        shutil.rmtree(staged.parent, ignore_errors=True)
        self.splice = VisionSplice(wrapped, {f: graphs[f] for f in ("int4", "int8-wo")}, settings)
        self.chain = PartChain(base["folder"], reference, cases, checkpoint, threads,
                               modalities={c["modality"] for c in cases if c["images"]})

    def __call__(self, name: str, per_op: dict) -> tuple[float, dict]:
        """The mean KL over every case (the text cases do not reach the vision graph and are not
        run: 0; run, 1e-14) and the measure; ``bytes_in_folder``: the vision graph's bytes as the
        folder would ship it (with its preamble)."""
        from vlsens.core.onnxutil import model_bytes

        vision, shipped = self.splice.write(name, {op: (f.name if f is not None else None) for op, f in per_op.items()})
        m = self.chain.measure(f"vision-{name}", vision=vision)
        m["bytes"] += shipped - model_bytes(vision)  # the chain counts the variant's own files only
        m["bytes_in_folder"] = shipped
        self.splice.remove(name)
        return sum(float(r["kl"]) for r in m["cases"]) / len(self.cases), m


def _byte_rows(graphs: Mapping) -> list[dict]:
    """One row per Linear of ``graphs["fp32"]``: its name, shape and bytes in float, in the ``int4``
    graph and in the ``int8-wo`` graph (which must quantize every Linear)."""
    from vlsens.core.errors import VlsensError
    from vlsens.precision.weight_only import linears
    from vlsens.quantize.nbits import float_bytes, quantized_nodes

    ops = linears(graphs["fp32"])
    q4, q8, fb = quantized_nodes(graphs["int4"]), quantized_nodes(graphs["int8-wo"]), float_bytes(ops)
    for name, q in (("int4", q4), ("int8-wo", q8)):
        missing = sorted({o["name"] for o in ops} - set(q))
        if missing:
            raise VlsensError(f"{graphs[name]}: Linears not quantized: {missing[:5]} ({len(missing)}); the "
                              f"{name} vision graph quantizes every Linear of {graphs['fp32']}")
    return [{"op": o["name"], "K": o["K"], "N": o["N"], "bytes_float": fb[o["name"]],
             "bytes_int4": q4[o["name"]]["bytes"], "bytes_int8": q8[o["name"]]["bytes"]} for o in ops]


def measure_ops(checkpoint, reference, cases, base: Mapping, graphs: Mapping, settings, work: str | Path,
                measured: int | None = None, threads: int = 0) -> tuple[list[dict], list[dict], dict | None]:
    """``(rows, points, estimate)``: one row per Linear of the fp32 vision graph (``graphs["fp32"]``;
    ``graphs["int4"]`` and ``graphs["int8-wo"]``: the gated weight-only graphs its bytes are read
    from): its INT4 KL in the fp32 folder (``base``, :class:`_FolderMeasure`), per modality; the
    whole mixed graphs along the curve; with ``measured`` below the Linears' number, only the
    ``measured`` Linears :func:`choose_measured` picks are measured and the others estimated
    (:func:`estimate_rows`; ``estimate``: its record), else None."""
    from vlsens.precision.weight_only import FORMATS

    rows = _byte_rows(graphs)
    measure = _FolderMeasure(checkpoint, reference, cases, base, graphs, settings, Path(work), threads)
    errors = None
    if measured is not None and measured < len(rows):
        errors = output_errors(checkpoint, base["folder"], cases, graphs["int4"], graphs["fp32"])
        chosen = set(choose_measured(errors, measured))
    for i, r in enumerate(rows):
        if errors is not None and r["op"] not in chosen:
            continue
        kl, m = measure(f"op{i}", {x["op"]: (FORMATS["int4"] if x["op"] == r["op"] else None) for x in rows})
        mods = {k: v["mean_kl"] for k, v in m["modalities"].items()}
        r.update(kl_int4=kl, measured=1, **{f"kl_int4_{k}": mods.get(k, 0.0) for k in MODALITIES})
        log.info("vision Linear %d/%d %s: INT4 KL %.4g (%.1f s)", i + 1, len(rows), r["op"], kl, m["seconds"])
    estimate = estimate_rows(rows, errors) if errors is not None else None
    points, order = [], order_of(rows)
    for k in point_ks(len(rows)):  # whole mixed graphs along the curve: how the errors add up there
        first = {rows[i]["op"] for i in order[:k]}
        kl, m = measure(f"mixed{k}", {x["op"]: FORMATS["int4"] if x["op"] in first else FORMATS["int8-wo"]
                                      for x in rows})
        points.append({"int4": k, "kl": kl, "bytes": m["bytes_in_folder"]})  # as the folder ships it
        log.info("vision mixed, %d of %d Linears INT4: KL %.4g", k, len(rows), kl)
    return rows, points, estimate


def output_errors(checkpoint, folder, cases, int4_graph, fp32_graph) -> dict[str, dict[str, float]]:
    """Per Linear (MatMul name of ``fp32_graph``) its INT4 output error on the ``cases``' images:
    ``||X (W4 - W)^T||^2`` summed over a case's images, ``X`` the Linear's input in transformers'
    float32 vision tower on ``folder``'s own preprocessing, ``W4`` the weight ``int4_graph``'s node
    multiplies by (:func:`vlsens.core.onnxgraph.dequantize_matmulnbits`); ``{"all": mean over every
    case (text cases 0), <modality>: mean over its cases}``. One forward pass per distinct image,
    every Linear's error taken in it by a forward hook."""
    from collections import Counter

    from vlsens.deploy.genai.evaluate import _image_inputs, _unique_images
    from vlsens.deploy.genai.runtime import Chat

    hooks = ErrorHooks.from_graphs(checkpoint, int4_graph, fp32_graph)
    rt = Chat(folder, prepack=False, provider="cpu")
    try:
        per_image = {f["path"]: hooks(*_image_inputs(rt, f["path"])) for f in _unique_images(cases)}
    finally:
        rt.close()
        hooks.close()
    counts = Counter(c["modality"] for c in cases)
    out = {op: {"all": 0.0, **dict.fromkeys(counts, 0.0)} for op in hooks.names}
    for case in cases:
        for op in hooks.names:
            e = sum(per_image[f["path"]][op] for f in case["images"])
            out[op]["all"] += e / len(cases)
            out[op][case["modality"]] += e / counts[case["modality"]]
    log.info("INT4 output error of %d Linears on %d image(s)", len(out), len(per_image))
    return out


class ErrorHooks:
    """transformers' vision tower ``model`` (float32, eager) with a forward hook on every Linear of
    ``w4`` (``(MatMul name, W4)`` pairs, ``W4`` (K, N) the weight it is to multiply by; ``weights``:
    MatMul name -> the exported weight's name, :func:`vlsens.precision.weight_only.linears`): a
    call runs one image and returns each Linear's ``||X (W4 - W)^T||^2``. Memory: the tower and one
    weight change per Linear (twice its float32 weights)."""

    def __init__(self, model, w4, weights: Mapping[str, str], source: str = "the INT4 graph"):
        import torch

        from vlsens.precision.weight_only import linear_for

        self.model, self.names, self.current, self.handles = model, [], {}, []
        for name, w in w4:
            linear = linear_for(model, weights[name], name, w, source)
            delta = torch.from_numpy(np.ascontiguousarray(w.T, dtype=np.float32)) - linear.weight.detach()
            self.handles.append(linear.register_forward_hook(self._hook(name, delta)))
            self.names.append(name)

    @classmethod
    def from_graphs(cls, checkpoint, int4_graph, fp32_graph) -> ErrorHooks:
        """The checkpoint's tower with the weights ``int4_graph``'s ``MatMulNBits`` nodes multiply by
        (:func:`vlsens.core.onnxgraph.dequantize_matmulnbits`), named as in ``fp32_graph``."""
        from vlsens.core.onnxgraph import dequantize_matmulnbits
        from vlsens.model.loading import VISION_PART, load_model
        from vlsens.precision.weight_only import linears

        model = load_model(checkpoint, attn_implementation="eager", part=VISION_PART)
        return cls(model, dequantize_matmulnbits(int4_graph), {o["name"]: o["weight"] for o in linears(fp32_graph)},
                   str(int4_graph))

    def _hook(self, name: str, delta):
        def hook(module, args, output):
            x = args[0].reshape(-1, delta.shape[1])
            self.current[name] = self.current.get(name, 0.0) + float((x @ delta.T).double().pow(2).sum())
        return hook

    def __call__(self, pixels, grid) -> dict[str, float]:
        import torch

        self.current = {}
        with torch.no_grad():
            self.model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid), return_dict=True)
        return self.current

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        del self.model


def fit_scales(rows: Sequence[Mapping], errors: Mapping[str, Mapping[str, float]],
               roles: Sequence[str] | None = None) -> dict[str, float]:
    """KL per unit of output error per role (:func:`role_of`; ``roles``, default the ``rows'``):
    the geometric mean of measured KL / output error over the role's measured ``rows``; a role with
    none measured takes the geometric mean over every measured row (1.0 where there is none). A role's output error reaches the
    answer through its own path (an attention output projection adds to the residual stream, the
    merger's last Linear writes the features): on the tiny preset one scale for all ranks the 22
    Linears at Spearman's rho 0.38 against their measure, one per role at 0.84."""
    fit = Fit.of(_log_ratios(rows, errors), depth=False)
    return {role: fit.scale(role, None) for role in (roles if roles is not None else [role_of(r["op"]) for r in rows])}


def _log_ratios(rows: Sequence[Mapping], errors: Mapping[str, Mapping[str, float]],
                blocks: int | None = None) -> list[tuple[str, float | None, float]]:
    """``(role, relative depth, log(measured KL / output error))`` of every measured row with both above 0
    (``blocks``: the tower's, default the rows' :func:`block_count`)."""
    return list(_points(rows, errors, blocks).values())


def _points(rows: Sequence[Mapping], errors: Mapping[str, Mapping[str, float]],
            blocks: int | None = None) -> dict[int, tuple[str, float | None, float]]:
    """:func:`_log_ratios`' points by the index of the row each comes from."""
    import math

    blocks = block_count(r["op"] for r in rows) if blocks is None else blocks
    return {i: (role_of(r["op"]), relative_depth(r["op"], blocks), math.log(float(r["kl_int4"]) / errors[r["op"]]["all"]))
            for i, r in enumerate(rows) if r.get("measured") and float(r["kl_int4"]) > 0 and errors[r["op"]]["all"] > 0}


def estimate_rows(rows: list[dict], errors: Mapping[str, Mapping[str, float]]) -> dict:
    """Every row gets its ``output_error`` and ``kl_estimate`` (:class:`Fit`: its role's scale, with
    the depth term where :func:`choose_depth` takes it, x its output error); the rows not measured
    take the estimate as their KLs (per modality by their own output error, ``measured`` 0). A
    measured row's estimate leaves it out (the fit on the other measured rows): the record's
    measured / estimate spread and Spearman's rho over the measured rows are held out, not fitted
    (the choice of the depth term is made on the same held-out misses)."""
    blocks = block_count(r["op"] for r in rows)
    points = _points(rows, errors, blocks)
    depth = choose_depth(list(points.values()))
    fit = Fit.of(list(points.values()), depth["used"])
    for i, r in enumerate(rows):
        e, role, d = errors[r["op"]], role_of(r["op"]), relative_depth(r["op"], blocks)
        if r.get("measured"):
            others = Fit.of([p for j, p in points.items() if j != i], depth["used"]) if i in points else fit
            r.update(output_error=e["all"], kl_estimate=others.scale(role, d) * e["all"])
            continue
        scale = fit.scale(role, d)
        r.update(output_error=e["all"], kl_estimate=scale * e["all"], kl_int4=scale * e["all"], measured=0,
                 **{f"kl_int4_{k}": scale * e.get(k, 0.0) for k in MODALITIES})
    done = [r for r in rows if r["measured"]]
    ratios = [float(r["kl_int4"]) / r["kl_estimate"] for r in done if r["kl_estimate"] > 0]
    rank = None
    if len(done) >= 3:
        a, b = (np.argsort(np.argsort([float(r[k]) for r in done])) for k in ("kl_int4", "kl_estimate"))
        rank = float(np.corrcoef(a, b)[0, 1])
    return {"measured": len(done), "estimated": len(rows) - len(done),
            "scales": {role: fit.scale(role, 0.0) for role in sorted({role_of(r["op"]) for r in rows})},
            "depth": depth, "measured_over_estimate": {"min": min(ratios), "median": float(np.median(ratios)),
                                                       "max": max(ratios)} if ratios else None,
            "rank_correlation": rank,
            "method": "INT4 output error ||X (W4 - W)^T||^2 of each Linear on the measure's images (transformers' float "
                      "vision tower, one pass), times its role's KL per unit of output error: the geometric mean of "
                      "measured / output error over the role's measured Linears (per role the one of largest output "
                      "error first), with a shared factor per relative depth where it predicts the measured Linears "
                      "held out better (depth); scales are at the first block; a measured Linear's estimate leaves it out"}


def write_ops(checkpoint, reference, cases, base: Mapping, graphs: Mapping, settings, outputs: Mapping,
              measured: int | None = None, threads: int = 0) -> dict:
    """The job: :func:`measure_ops` as ``vision.csv`` (``outputs["csv"]``) and a summary
    (``outputs["summary"]``, ``vision.json``: the Linears' INT4 KLs summed, how concentrated they
    are, the estimate where one was used)."""
    out_csv, out_json = outputs["csv"], outputs["summary"]
    from vlsens.core.fsutil import write_csv, write_json

    with tempfile.TemporaryDirectory(prefix="vlsens-vision-ops-") as work:
        rows, points, estimate = measure_ops(checkpoint, reference, cases, base, graphs, settings, work, measured,
                                             threads)
    write_csv(out_csv, rows, list(COLUMNS))
    kls = sorted((r["kl_int4"] for r in rows), reverse=True)
    total = sum(kls)
    record = {"linears": len(rows), "sum_kl_int4": total,
              "top": [{"op": r["op"], "kl_int4": r["kl_int4"]} for r in sorted(rows, key=lambda r: -r["kl_int4"])[:5]],
              "top1_share": kls[0] / total if total > 0 else None, "points": points, "estimate": estimate,
              "note": "each Linear alone at INT4 (the run's int4 format), every other Linear float, in the fp32 folder, "
                      "measured end to end on the measure's image cases by the part chain (the fp32 folder's "
                      "decoder and embedding as plain ONNX Runtime sessions, equal to onnxruntime-genai's measure; "
                      "its text cases do not reach the vision graph and count 0)" + ("" if estimate is None else
                      f"; {estimate['estimated']} of them estimated from their INT4 output error (estimate)")}
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
