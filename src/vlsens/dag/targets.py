"""The default target: what ``snakemake`` (rule ``all``) builds for a plan, graph by graph.

For every graph: each variant's ``model.onnx`` and ``parity.json`` (and, fixed-size graphs, the
parts of ``vision.parts.variants`` with their calibration archives); where the tower analyses
variants, its calibration set (and NPU archive), each engine's ranking for each analysed variant
(``inc``: FP32 graphs of towers that support it), ``compare.json`` where both engines ran,
INC's own fallback run when asked for, and the profile.
"""

from __future__ import annotations

from vlsens.core import paths
from vlsens.dag.plan import Plan

ENGINES = ("ort", "inc")


def engine_variants(tower, engine: str) -> list[str]:
    """Variants an engine analyses: ``inc`` takes FP32 graphs only (INC's ONNX adaptor fails on
    FP16 ones), and only towers that declare it."""
    if engine not in tower.engines:
        return []
    vs = tower.analysed_variants()
    return [v for v in vs if v == "fp32"] if engine == "inc" else vs


def graph_targets(plan: Plan, tower, analysis: bool = True, npu: bool = True) -> list[str]:
    """A graph's targets: ``analysis``: its variants, calibration set, sensitivity tables and
    profiles; ``npu``: its NPU parts, their calibration and the NPU archives (and, without
    ``analysis``, the profiles of a graph that has NPU archives: what its INT8 ops are)."""
    g = {"model": plan.model, "graph": tower.graph}
    out = []
    analysed = tower.analysed_variants()
    calib = paths.fill(paths.CALIB, **g)
    if analysis:
        for v in tower.variants():
            folder = paths.fill(paths.VARIANT, variant=v, **g)
            out += [f"{folder}/{paths.MAIN}", f"{folder}/{paths.RECORD}"]
        if analysed or tower.npu_archive:
            out.append(f"{calib}/{paths.CALIB_FILES['manifest']}")
    if npu:
        if tower.npu_archive:
            out += [f"{calib}/{f}" for f in paths.NPU_FILES.values()]
        for v in tower.parts_variants():
            out.append(paths.fill(paths.PARTS, variant=v, **g))
            if tower.parts_calibration():
                out.append(paths.fill(paths.PARTS_CALIB, variant=v, **g))
    engines = [e for e in ENGINES if e in plan.engines]
    for v in analysed:
        if analysis:
            sens = paths.fill(paths.SENSITIVITY, variant=v, **g)
            ran = [e for e in engines if v in engine_variants(tower, e)]
            out += [f"{sens}/{e}.{ext}" for e in ran for ext in ("csv", "json")]
            if len(ran) == 2:
                out.append(f"{sens}/compare.json")
            if "inc" in ran and plan.inc_tune:
                out.append(f"{paths.fill(paths.INC_TUNE, variant=v, **g)}/eval.json")
        if analysis or (npu and tower.npu_archive):
            prof = paths.fill(paths.PROFILE, variant=v, **g)
            out += [f"{prof}/{paths.PROFILE_FILES[k]}" for k in ("eval", "profile", "model")]
        if npu and toolchain_files(tower):
            out.append(paths.fill(paths.TOOLCHAIN, variant=v, **g))
    return out


def toolchain_files(tower) -> bool:
    """Does a graph's profile get NPU toolchain files (:mod:`vlsens.npu.toolchain`)? Fixed-size
    graphs (those with NPU archives), when the run's ``quant.target`` is an NPU one."""
    from vlsens.quantize.target import WIDE_TARGETS

    return bool(tower.npu_archive) and tower.config["quant"]["target"] in WIDE_TARGETS


def report_targets(plan: Plan, towers) -> list[str]:
    """The report's figures and tables (rules/report.smk): per analysed variant a heatmap (engine
    ort), a ranked chart per engine, the profile's Pareto plot and, where both engines ran, their
    agreement; per graph with an fp16 variant its FP32 fallback; per model the parity table, the
    profile table and (where a graph is profiled) latency and size."""
    engines = [e for e in ENGINES if e in plan.engines]
    out, profiled = [], False
    for tower in towers:
        g = {"model": plan.model, "graph": tower.graph}
        for v in tower.analysed_variants():
            fig = paths.files(paths.fill(paths.REPORT_FIGURES, variant=v, **g), paths.FIGURE_FILES)
            ran = [e for e in engines if v in engine_variants(tower, e)]
            out += [fig["heatmap"]] if "ort" in ran else []
            out += [paths.fill(fig["ranked"], engine=e) for e in ran] + [fig["pareto"]]
            out += [fig["engines"]] if len(ran) == 2 else []
            profiled = True
        if "fp16" in tower.variants():
            out.append(paths.fill(paths.REPORT_FP16, **g))
    report = paths.fill(paths.REPORT, model=plan.model)
    keys = ["parity", "profiles", "verdict"] + (["latency"] if profiled else [])
    return out + [f"{report}/{paths.REPORT_FILES[k]}" for k in keys]


def all_targets(plan: Plan, towers, report: bool = False, embeddings: bool = False, analysis: bool = True,
                npu: bool = True) -> list[str]:
    """The graphs' targets (:func:`graph_targets`), the token table's binaries (``embeddings``,
    with ``npu``) and the report (``report``, with ``analysis``)."""
    towers = list(towers)
    out = [t for tower in towers for t in graph_targets(plan, tower, analysis, npu)]
    out += [paths.fill(paths.EMBEDDINGS, model=plan.model)] if embeddings and npu else []
    return out + (report_targets(plan, towers) if report and analysis else [])
