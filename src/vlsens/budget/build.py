"""The jobs of the whole-VLM plan: what each part's formats cost on the folder's measure, and a
plan built into a deploy folder.

**Components** (:func:`measure_components`): the fp32 folder with one part changed -- its vision
graph in one format, or its embedding table in one format -- measured end to end on the same
cases and reference as every folder, by the part chain
(:class:`vlsens.deploy.genai.chain.PartChain`: the fp32 folder's decoder and embedding as plain
ONNX Runtime sessions, opened once; equal to :func:`vlsens.deploy.genai.measure.measure_folder`
on the folder so assembled within the kernels' rounding). With the decoder's KL from the engine
(:mod:`vlsens.budget.front`), these give the additive estimate the front is searched on; each
built point says how far the sum is from the folder it built.

**A plan's folder** (:func:`plan_folder`): the decoder quantized as the plan says
(:func:`vlsens.budget.plan.build_decoder`) and gated like every INT4 decoder (against transformers
run on its own dequantized weights), the plan's vision graph and table, assembled, checked and
evaluated by the deploy job (:func:`vlsens.deploy.build.build_folder`), the plan file inside.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from vlsens.budget.plan import PLAN_FILE

log = logging.getLogger(__name__)


def _in_folder(folder: Path, part: str) -> int:
    """A part's bytes as a deploy folder ships it (the vision graph with its preamble)."""
    from vlsens.core.onnxutil import model_bytes
    from vlsens.deploy.genai import folder as genai

    return model_bytes(folder / genai.GRAPHS[part])


def measure_components(checkpoint, reference, cases, formats: dict, fp32_folder, threads: int = 0) -> dict:
    """``{"vision": {format: {bytes, kl, ...}}, "embedding": {...}}``: each format of a part in the
    fp32 folder (``fp32_folder``), measured end to end by the part chain (:class:`vlsens.deploy.genai.chain.PartChain`:
    the folder so assembled through onnxruntime-genai, within the kernels' rounding,
    ``tests/test_chain.py``), its bytes as the folder ships it (the vision graph with the fp32
    folder's preamble, the table under its folder name); the fp32 formats are the reference
    itself (KL 0)."""
    import shutil

    from vlsens.core.artifacts import verify
    from vlsens.core.onnxutil import copy_model, model_bytes
    from vlsens.deploy.genai import folder as genai
    from vlsens.deploy.genai.chain import PartChain

    fp32_folder = Path(fp32_folder)
    out = {part: {"fp32": {"bytes": _in_folder(fp32_folder, part), "kl": 0.0}} for part in ("vision", "embedding")}
    chain = PartChain(fp32_folder, reference, cases, checkpoint, threads)
    with tempfile.TemporaryDirectory(prefix="vlsens-components-") as work:
        for part in ("vision", "embedding"):
            for fmt, graph in formats[part].items():
                if fmt == "fp32":
                    continue
                name, staged = f"{part}-{fmt}", Path(work) / f"{part}-{fmt}" / genai.GRAPHS[part]
                if part == "vision":
                    genai.wrap_vision(verify(graph), staged, None, Path(work) / f"{name}-preamble",
                                      fp32_folder / genai.GRAPHS["vision"])
                else:
                    copy_model(verify(graph), staged)
                m = chain.measure(name, **{part: staged})
                out[part][fmt] = {"bytes": model_bytes(staged), "kl": m["mean_kl"], "top1": m["top1"],
                                  "modalities": m["modalities"], "cases": m["cases"], "graph": str(graph)}
                log.info("component %s %s: %d bytes, KL %.4g (%.1f s)", part, fmt, out[part][fmt]["bytes"],
                         m["mean_kl"], m["seconds"])
                shutil.rmtree(staged.parent, ignore_errors=True)
    return out


def decoder_other_bytes(fp32_folder, decoder) -> int:
    """The folder decoder's bytes outside its weight MatMuls (norms, the graph itself): the fp32
    folder's file less the float32 bytes of the weight MatMuls of ``decoder`` (the fp32 decoder
    graph; the same MatMuls engine nbits lists in its CSV)."""
    from vlsens.quantize.nbits import float_bytes, weight_matmuls

    return _in_folder(Path(fp32_folder), "decoder") - int(sum(float_bytes(weight_matmuls(decoder)).values()))


def write_components(checkpoint, reference, cases, base: dict, formats: dict, out_json, threads: int = 0) -> dict:
    """The job: :func:`measure_components` and the decoder's other bytes, as ``components.json``
    (``base`` holds the fp32 folder as ``folder``)."""
    from vlsens.core.fsutil import write_json

    record = measure_components(checkpoint, reference, cases, formats, base["folder"], threads)
    record["decoder_other_bytes"] = decoder_other_bytes(base["folder"], base["decoder"])
    record["note"] = ("each format's KL: the fp32 folder with that part alone changed, teacher-forced on the fp32 "
                      "folder's tokens (the folders' measure, run as the part chain: the fp32 folder's decoder and "
                      "embedding as plain ONNX Runtime sessions, equal to it through onnxruntime-genai)")
    write_json(out_json, record)
    return record


def _gated_decoder(plan, decoder_dir: Path, reference, out_dir: Path, gate, calibration=None, engine=None) -> Path:
    """The plan's decoder as a gated variant folder of ``decoder_dir`` (the fp32 decoder);
    ``calibration``: the decoder's calibration samples, for a plan that names them; ``engine``: the
    run's engine nbits folder, whose quantized MatMuls the decoder takes where they are the plan's
    (:func:`vlsens.sensitivity.nbits.reuse_of`)."""
    from vlsens.budget.plan import build_decoder
    from vlsens.core import paths
    from vlsens.core.onnxutil import copy_model
    from vlsens.sensitivity.nbits import reuse_of
    from vlsens.variants import variant_folder

    def transform(src: Path, feeds, staged: Path) -> dict:
        if src.name != paths.MAIN:
            copy_model(src, staged)
            return {}
        reuse = reuse_of(engine, src) if engine else None
        return {"plan": plan.name, **build_decoder(plan, src, staged, calibration, gate.threads, reuse)}

    variant_folder(decoder_dir, reference, out_dir, f"plan-{plan.name}", transform, gate)
    return out_dir / paths.MAIN


def _mixed_vision(plan, build: Mapping, checkpoint, out_dir: Path) -> Path:
    """The plan's mixed vision graph (every Linear at its ``vision_ops`` width: INT4 in the run's
    ``int4`` format, INT8 as ``int8-wo``, 0 float) as a variant folder of the fp32 dynamic vision
    graph, gated against transformers on its own weights like every weight-only vision graph.
    ``build``: ``fp32`` (the graph), ``reference`` (its reference cases), ``tolerance``,
    ``exact_tolerance``, ``threads``."""
    from vlsens.core import paths
    from vlsens.precision.weight_only import FORMATS, INT8_WO, vision_folder
    from vlsens.quantize.nbits import NBitsSettings

    per_op = {n: {4: FORMATS["int4"], 8: INT8_WO}.get(b) for n, b in plan.vision_ops.items()}
    vision_folder(checkpoint, Path(build["fp32"]).parent, build["reference"], out_dir,
                  NBitsSettings.from_config(plan.settings), build["tolerance"], build["exact_tolerance"],
                  build.get("threads", 0), fmt=per_op)
    return out_dir / paths.MAIN


def plan_folder(plan_file, out_dir, checkpoint, sources: dict, images, checks, gate) -> dict:
    """The deploy folder of ``plan_file``: ``sources`` names the fp32 decoder folder
    (``decoder_dir``), its reference cases (``reference``) and every vision and embedding format's
    graph (``vision``, ``embedding``: format -> graph), and for a mixed vision graph what it is
    built and gated from (``vision_mixed``, :func:`_mixed_vision`); ``checks``: the deploy job's
    (:class:`vlsens.deploy.genai.evaluate.Checks`), ``calibration`` the decoder's calibration
    samples where the plan names them; ``gate``: the decoder's
    (:class:`vlsens.variants.Gate`, with its own-weights reference)."""
    from vlsens.budget.plan import MIXED, Plan
    from vlsens.core import paths
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.build import build_folder

    plan = Plan.load(plan_file)
    have = {"vision": [*sources["vision"], *([MIXED] if sources.get("vision_mixed") else [])],
            "embedding": list(sources["embedding"])}
    for part in ("vision", "embedding"):
        if getattr(plan, part) not in have[part]:
            raise VlsensError(f"{plan_file}: {part} format {getattr(plan, part)!r} is not built by this run "
                              f"(built: {sorted(have[part])})")
    with tempfile.TemporaryDirectory(prefix="vlsens-plan-") as work:
        decoder = _gated_decoder(plan, Path(sources["decoder_dir"]), sources["reference"], Path(work) / "decoder",
                                 gate, sources.get("calibration"), sources.get("engine"))
        vision = (_mixed_vision(plan, sources["vision_mixed"], checkpoint, Path(work) / "vision"),
                  sources["vision_mixed"]["fp32"]) if plan.vision == MIXED else sources["vision"][plan.vision]
        # the record names the run's graphs the scratch ones were built from (the plan file says how)
        record = build_folder(f"plan-{plan.name}", out_dir, checkpoint,
                              (decoder, Path(sources["decoder_dir"]) / paths.MAIN),
                              sources["embedding"][plan.embedding], vision, images, checks,
                              extra={PLAN_FILE: Path(plan_file)})
    log.info("plan %s: decoder %s, vision %s, embedding %s", plan.name, json.dumps(plan.bits_summary()),
             plan.vision_label(), plan.embedding)
    return record


def _csv_rows(csv) -> list[dict]:
    import pandas as pd

    return pd.read_csv(csv).to_dict("records")


def named(inputs: Mapping, prefix: str) -> dict[str, Path]:
    """``{name: path}`` of a job's inputs named ``<prefix><name>`` (rules/common.smk's
    ``budget_formats`` and ``anchor_folders``)."""
    return {k.removeprefix(prefix): Path(v) for k, v in inputs.items() if k.startswith(prefix) and k != prefix}


def formats_of(inputs: Mapping) -> dict:
    """``{"vision": {format: graph}, "embedding": {format: graph}}`` from a job's named inputs
    (``vision_<format>``, ``embedding_<format>``; other inputs of those prefixes, such as
    ``vision_features``, are not formats)."""
    from vlsens.budget.plan import EMBEDDING_FORMATS, VISION_FORMATS

    known = {"vision": VISION_FORMATS, "embedding": EMBEDDING_FORMATS}
    return {part: {f: p for f, p in named(inputs, f"{part}_").items() if f in known[part]}
            for part in ("vision", "embedding")}


def fp32_parts(inputs: Mapping) -> dict[str, Path]:
    """The fp32 folder's graphs from a job's named inputs: ``decoder`` (``decoder_model``), the
    ``embedding`` graph beside it, ``vision`` (``vision_fp32``), and the ``folder`` itself."""
    decoder = Path(inputs["decoder_model"])
    return {"decoder": decoder, "embedding": decoder.with_name("embedding.onnx"), "vision": Path(inputs["vision_fp32"]),
            "folder": Path(inputs["fp32_folder"])}


def gptq_calibration(samples, decoder, store, writable: bool):
    """The decoder's calibration split ``samples`` with the run's store of GPTQ codes for the fp32
    ``decoder`` in ``store``: ``budget_nbits`` fills it (``writable``), the plans read it. None
    where ``samples`` is None (no data-aware algorithm configured)."""
    from vlsens.quantize.gptq import Calibration, Store

    if samples is None:
        return None
    return Calibration(Path(samples), Store(store, decoder, samples, writable) if store else None)


def nbits_job(inputs: Mapping, outputs: Mapping, params: Mapping, threads: int = 0) -> dict:
    """The ``budget_nbits`` job: the measure's cases as the decoder's evaluation set
    (:func:`vlsens.deploy.genai.chain.decoder_feeds`), engine nbits on it and every MatMul's INT4 /
    INT8 error there. With ``params["algorithms"]`` naming algorithms beside the settings' one,
    each MatMul first gets, per width, the one under which it alone costs least
    (:func:`vlsens.sensitivity.nbits.choose_algorithms`; a data-aware one reads
    ``inputs["calibration"]``, the decoder's calibration split); the engine is built with those, and
    ``nbits.json`` records the choice. ``params["measured"]`` (``plan.decoder_measured``): that
    many MatMuls measured, the rest estimated from their output errors
    (:func:`vlsens.sensitivity.nbits.sensitivity`). The engine takes its data-free MatMuls from
    the choice's engine of the settings' algorithm instead of quantizing them a third time (the same
    MatMuls, ``tests/test_budget.py``), and its estimate the output errors the choice scored the
    MatMuls by (:func:`vlsens.sensitivity.nbits.chosen_errors`: the same CSV, ``tests/test_estimate.py``)."""
    from vlsens.core.fsutil import write_json
    from vlsens.data.inputs import checkpoint_dir
    from vlsens.deploy.cases import load_cases
    from vlsens.deploy.genai.chain import decoder_feeds
    from vlsens.quantize.nbits import NBitsSettings
    from vlsens.sensitivity import nbits

    decoder_feeds(inputs["folder"], inputs["reference"], load_cases(inputs["cases"]), checkpoint_dir(inputs["checkpoint"]),
                  outputs["feeds"])
    settings = NBitsSettings.from_config(params["settings"])
    calibration = gptq_calibration(inputs.get("calibration"), inputs["model"], outputs.get("gptq"), writable=True)
    choice, engine = None, Path(outputs["engine"])
    engine.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vlsens-algorithms-", dir=engine.parent) as work:
        reuse = None
        if set(params.get("algorithms") or ()) - {settings.algorithm}:
            choice = nbits.choose_algorithms(inputs["model"], outputs["feeds"], settings, params["algorithms"], work,
                                             threads, logits=True, calibration=calibration,
                                             scoring=nbits.Scoring(params["suffix_cuts"], params.get("measured")))
            reuse = nbits.reuse_of(Path(work) / settings.algorithm, inputs["model"])  # the default's MatMuls
        chosen = {int(w): a for w, a in choice["chosen"].items()} if choice else None
        nbits.prepare(inputs["model"], outputs["feeds"], engine, settings, threads, logits=True,
                      suffix_cuts=params["suffix_cuts"], how=nbits.Quantizing(chosen, calibration, reuse))
    errors = nbits.chosen_errors(choice, engine) if choice else None  # not computed a second time
    summary = nbits.sensitivity(outputs["engine"], outputs["feeds"], outputs["csv"], outputs["summary"], threads,
                                measured=params.get("measured"), errors=errors)
    if choice:
        summary["algorithms"] = choice
        write_json(outputs["summary"], summary)
    return summary


def components_job(inputs: Mapping, outputs: Mapping, threads: int = 0) -> dict:
    """The ``budget_components`` job on its named inputs: each vision and table format measured in
    the fp32 folder (:func:`write_components`)."""
    from vlsens.data.inputs import checkpoint_dir
    from vlsens.deploy.cases import load_cases

    base = fp32_parts(inputs)
    return write_components(checkpoint_dir(inputs["checkpoint"]), inputs["reference"], load_cases(inputs["cases"]),
                            base, formats_of(inputs), outputs["components"], threads)


def vision_job(inputs: Mapping, outputs: Mapping, settings: Mapping, measured: int | str = "all",
               threads: int = 0) -> dict:
    """The ``budget_vision`` job on its named inputs and outputs: each vision Linear alone at INT4
    (``measured``: ``all``, or how many are measured, the rest estimated), and whole mixed graphs
    along the curve (:func:`vlsens.budget.vision.write_ops`)."""
    from vlsens.budget.vision import write_ops
    from vlsens.data.inputs import checkpoint_dir
    from vlsens.deploy.cases import load_cases
    from vlsens.quantize.nbits import NBitsSettings

    graphs = {"fp32": inputs["vision_fp32"], "int4": inputs["vision_int4"], "int8-wo": inputs["vision_int8-wo"]}
    return write_ops(checkpoint_dir(inputs["checkpoint"]), inputs["reference"], load_cases(inputs["cases"]),
                     fp32_parts(inputs), graphs, NBitsSettings.from_config(settings), outputs,
                     None if measured == "all" else int(measured), threads)


def front_job(inputs: Mapping, outputs: Mapping, search_settings: dict, threads: int = 0) -> dict:
    """The ``budget_front`` job on its named inputs and outputs: :func:`write_front` on the
    components' record (``components``) with the anchors' folders (``anchor_<name>``) and, with
    ``fp32_folder``, the decode steps timed at ``search_settings["decode_context"]`` tokens."""
    components = json.loads(Path(inputs["components"]).read_text())
    latency = {"folder": inputs["fp32_folder"], "context": search_settings["decode_context"]} \
        if "fp32_folder" in inputs else None
    return write_front(inputs["engine"], inputs["eval"], inputs["csv"], components, outputs["front"],
                       outputs["plans"], search_settings,
                       {"anchors": named(inputs, "anchor_"), "vision_csv": inputs.get("vision_ops"), "latency": latency},
                       threads)


def plan_job(inputs: Mapping, outputs: Mapping, params: Mapping, threads: int = 0) -> dict:
    """The ``plan_folder`` job: the plan's folder (:func:`plan_folder`; its decoder gated like every
    INT4 decoder, its vision graph measured, not gated, in the folder: each format passed its gate
    on its own weights; its evaluation through onnxruntime-genai) and its measure, written in the
    same process by the part chain on the folder's own graphs
    (:class:`~vlsens.deploy.genai.chain.PartChain`: equal to onnxruntime-genai's measure of the
    folder within 1e-4 of each case's KL, ``tests/test_chain.py``; at 36 layers the runtime's
    measure is a folder's costliest step)."""
    from vlsens.core.fsutil import write_json
    from vlsens.data.inputs import checkpoint_dir, image_refs
    from vlsens.deploy.cases import load_cases
    from vlsens.deploy.genai.chain import PartChain
    from vlsens.deploy.genai.evaluate import Checks
    from vlsens.export.towers.decoder import weight_reference_for
    from vlsens.variants import Gate

    ckpt, decoder = checkpoint_dir(inputs["checkpoint"]), Path(inputs["decoder_model"])
    formats = formats_of(inputs)
    formats["embedding"]["fp32"] = decoder.with_name("embedding.onnx")
    sources = {"decoder_dir": decoder.parent, "reference": inputs["decoder_reference"], **formats,
               "calibration": gptq_calibration(inputs.get("calibration"), decoder, inputs.get("gptq"), writable=False),
               "engine": inputs.get("engine")}
    if "vision_reference" in inputs:  # a mixed vision graph can be built (plan.vision has mixed)
        sources["vision_mixed"] = {"fp32": inputs["vision_fp32"], "reference": inputs["vision_reference"],
                                   "tolerance": params["tolerance"], "exact_tolerance": params["exact_tolerance"],
                                   "threads": threads}
    gate = Gate(params["tolerance"], threads, reference_for=weight_reference_for(ckpt),
                exact_tolerance=params["exact_tolerance"])
    checks = Checks(params["max_new_tokens"], None, fp32_folder=inputs["fp32_folder"],
                    vision_features=inputs["vision_features"], provider=params.get("provider", "cpu"),
                    fp32_logits=inputs.get("fp32_logits"), questions=inputs.get("questions"))
    plan_folder(inputs["plan"], outputs["folder"], ckpt, sources, image_refs(inputs["images"]), checks, gate)
    chain = PartChain(outputs["folder"], inputs["reference"], load_cases(inputs["cases"]), ckpt, threads)
    record = chain.measure(f"plan-{Path(inputs['plan']).stem}")
    del chain
    write_json(outputs["measure"], record)
    return record


def _anchor_plans(plans: list, record: dict, anchors: dict[str, int], ops, settings: dict, mixed=None,
                  algorithms=None, calibration: str = "") -> dict:
    """Per anchor (name -> its folder's bytes), the plan of lowest estimated KL within its bytes:
    one of ``plans`` where the same (by digest), else a new plan ``at-<anchor>`` (appended)."""
    from vlsens.budget.front import _plans, at_bytes

    out = {}
    for name, nbytes in anchors.items():
        point = at_bytes(record["front"], nbytes)
        if point is None:
            out[name] = {"bytes": nbytes, "plan": None, "note": "no front point at or below the anchor's bytes"}
            continue
        plan = _plans(record["curve"], [point], ops, settings, mixed, algorithms, calibration)[0]
        same = [p for p in plans if p.digest() == plan.digest()]
        if not same:
            plan = replace(plan, name=f"at-{name}")
            plans.append(plan)
        out[name] = {"bytes": nbytes, "plan": (same[0] if same else plan).name}
    return out


def _mixed_options(vision: dict, vision_csv) -> tuple[dict[str, dict], float]:
    """The mixed vision curve's points (:func:`vlsens.budget.vision.mixed_curve`) added to the
    vision options ``vision`` (bytes, KL) under ``mixed:<k>``; returns each one's Linears' bits
    and the curve's calibration (:func:`vlsens.budget.vision.calibration`)."""
    from vlsens.budget.vision import calibration, mixed_curve, read_points
    from vlsens.core.errors import VlsensError

    if "int8-wo" not in vision:
        raise VlsensError(f"{vision_csv}: the mixed vision curve starts from the int8-wo graph, which the components "
                          "do not hold (plan.vision needs int8-wo and int4 beside mixed)")
    rows, points = _csv_rows(vision_csv), read_points(vision_csv)
    out, scale = {}, calibration(rows, vision["int8-wo"], vision.get("int4"), points)
    for p in mixed_curve(rows, vision["int8-wo"], vision.get("int4"), points):
        vision[p["name"]] = {"bytes": p["bytes"], "kl": p["kl"]}
        out[p["name"]] = p["ops"]
    return out, scale


def byte_limit(request: dict, fp32_bytes: int) -> int | None:
    """A ``plan.budgets`` entry's byte limit: ``bytes``, or ``bits_per_weight`` over the fp32
    folder's parameters (``fp32_bytes / 4``), or None."""
    if "bytes" in request:
        return int(request["bytes"])
    return int(float(request["bits_per_weight"]) * fp32_bytes / 32) if "bits_per_weight" in request else None


def budget_point(points: list, request: dict, fp32_bytes: int) -> tuple[dict | None, int | None]:
    """``(point, byte limit)`` for a ``plan.budgets`` entry among ``points`` (the search's
    combinations, :func:`vlsens.budget.front.combinations`). Limits: ``bytes`` (the folder's graphs
    and data files) or ``bits_per_weight`` (bits per parameter of the fp32 folder, whose graphs hold
    ``fp32_bytes / 4`` float32 values: the byte limit ``bits x fp32_bytes / 32``), and
    ``decode_ms`` (the estimated decode step, :mod:`vlsens.budget.latency`). Within them: with
    ``kl`` (mean KL per generated step) the point of fewest bytes whose estimated KL meets it, else
    the point of lowest estimated KL. None where no point does."""
    limit = byte_limit(request, fp32_bytes)
    fits = [p for p in points if (limit is None or p["bytes"] <= limit)
            and ("decode_ms" not in request or p.get("decode_ms", math.inf) <= float(request["decode_ms"]))]
    if "kl" in request:
        fits = [p for p in fits if p["kl"] <= float(request["kl"])]
        return (dict(min(fits, key=lambda p: (p["bytes"], p["kl"]))) if fits else None), limit
    return (dict(min(fits, key=lambda p: (p["kl"], p["bytes"]))) if fits else None), limit


def _nearest(points: list, request: dict, limit: int | None) -> str:
    """What the points come nearest to a request none meets, in words."""
    said = []
    if limit is not None:
        smallest = min(points, key=lambda q: q["bytes"])
        said.append(f"the smallest plan takes {smallest['bytes']} bytes (estimated KL {smallest['kl']:.3g})")
    if "decode_ms" in request:
        timed = [q["decode_ms"] for q in points if "decode_ms" in q]
        said.append(f"the fastest estimated decode step is {min(timed):.3g} ms" if timed else
                    "no decode step was measured")
    if "kl" in request:
        said.append(f"the lowest estimated KL is {min(q['kl'] for q in points):.3g}")
    return "; ".join(said)


def _budget_plans(plans: list, record: dict, points: list, budgets: list[dict], fp32_bytes: int, eng,
                  mixed=None) -> dict:
    """Each requested budget as a plan of its own name (appended to ``plans``), and its record.
    ``points``: the search's combinations (:func:`budget_point`)."""
    from vlsens.budget.front import _plans, calibration_of

    out = {}
    for request in budgets:
        if "accuracy_drop" in request:  # answered by the built plans (vlsens.budget.report: _requested)
            out[request["name"]] = {"request": {k: v for k, v in request.items() if k != "name"},
                                    "byte_limit": byte_limit(request, fp32_bytes), "plan": None,
                                    "note": "chosen among the built plans once they have answered the task"}
            continue
        point, limit = budget_point(points, request, fp32_bytes)
        entry = {"request": {k: v for k, v in request.items() if k != "name"}, "byte_limit": limit,
                 "plan": None if point is None else request["name"]}
        if point is None:
            entry["note"] = "no front point meets the request"
            log.warning("plan.budgets %r (%s%s): no plan meets it, so deploy/plan-%s/ is not built; %s",
                        request["name"], ", ".join(f"{k} {v}" for k, v in entry["request"].items()),
                        f" = {limit} bytes" if limit is not None and "bytes" not in request else "",
                        request["name"], _nearest(points, request, limit) if points else "")
        else:
            plans.append(replace(_plans(record["curve"], [point], eng.ops, eng.settings.as_dict(), mixed,
                                        eng.meta.get("algorithms"), calibration_of(eng.meta))[0], name=request["name"]))
        out[request["name"]] = entry
    return out


def write_front(engine_dir, eval_npz, csv, components: dict, out_front, plans_dir, search_settings: dict,
                extra: Mapping | None = None, threads: int = 0) -> dict:
    """The job: :func:`vlsens.budget.front.search` for at least ``search_settings["points"]`` plans
    along the front (``p1`` .. in increasing bytes; at most ``search_settings["max_evals"]``
    assignments per budget), among them per anchor folder (name -> folder) the plan of lowest
    estimated KL within its bytes (``at-<anchor>`` only should it not be picked), and each of
    ``search_settings["budgets"]`` (:func:`budget_point`) under its own name; each plan saved as
    ``plans_dir/<name>.yaml``, the search's record as ``front.json``. ``extra``: ``anchors`` (name
    -> folder), ``vision_csv`` (the vision Linears' table, :mod:`vlsens.budget.vision`, whose mixed
    curve joins the vision formats; ``int4`` and ``int8-wo`` among ``components``) and ``latency``
    (``folder``: the fp32 deploy folder, ``context``: :func:`vlsens.budget.latency.uniform_latency`)."""
    from vlsens.budget.front import Extras, calibration_of, combinations, is_reference, search
    from vlsens.budget.latency import uniform_latency
    from vlsens.core.fsutil import atomic_dir, write_json
    from vlsens.deploy.genai.measure import folder_weight_bytes
    from vlsens.sensitivity import nbits as nb

    parts = {p: {f: {k: v[k] for k in ("bytes", "kl")} for f, v in components[p].items()}
             for p in ("vision", "embedding")}
    extra = extra or {}
    anchors, vision_csv = extra.get("anchors") or {}, extra.get("vision_csv")
    mixed, scale = _mixed_options(parts["vision"], vision_csv) if vision_csv else ({}, None)
    sizes = {n: folder_weight_bytes(f) for n, f in anchors.items()}
    latency = uniform_latency(engine_dir, extra["latency"], threads) if extra.get("latency") else None
    uniform = {int(w): t["ms"] for w, t in latency["uniform"].items()} if latency else None
    plans, record = search(engine_dir, eval_npz, csv, parts, int(components["decoder_other_bytes"]),
                           int(search_settings["points"]), int(search_settings["max_evals"]), threads,
                           Extras(mixed, tuple(sizes.values()), uniform))
    if latency:
        record["latency"] = latency
    record["mixed_vision"] = mixed
    record["mixed_vision_calibration"] = [{"int4": k, "ratio": r} for k, r in scale] if scale else None
    eng = nb.Prepared(engine_dir)
    record["anchors"] = _anchor_plans(plans, record, sizes, eng.ops, eng.settings.as_dict(), mixed,
                                      eng.meta.get("algorithms"), calibration_of(eng.meta))
    fp32_bytes = sum(int(components[p]["fp32"]["bytes"]) for p in ("vision", "embedding")) + \
        int(components["decoder_other_bytes"]) + sum(c["bytes_float"] for c in _csv_rows(csv))
    points = [p for p in combinations(record["curve"], parts, int(components["decoder_other_bytes"]))
              if not is_reference(record["curve"], p)]
    record["requested"] = _budget_plans(plans, record, points, list(search_settings.get("budgets") or []),
                                        fp32_bytes, eng, mixed)
    record["fp32_bytes"] = fp32_bytes
    with atomic_dir(plans_dir) as tmp:
        for plan in plans:
            plan.save(Path(tmp) / f"{plan.name}.yaml")
    record["plans"] = [p.entry() for p in plans]
    write_json(out_front, record)
    return record
