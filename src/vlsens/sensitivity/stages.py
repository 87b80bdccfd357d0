"""The ``ort`` engine's stages, as the workflow runs them (any graph, any tower).

``prepare``  float model (untied) -> calibration (once, ORT cache) -> all-op QDQ model ->
             switch model; also the float outputs on the evaluation set and the floor timing.
``shard``    rows for one contiguous slice of the op list (a cluster spreads shards over jobs), by
             the suffix engine (:mod:`vlsens.sensitivity.suffix`) when the engine has cuts.
``gather``   shards -> ranked ``ort.csv`` + ``ort.json`` (all-INT8 metrics, timing, settings).

Engine folder (``engine/``, file names in :data:`vlsens.core.paths.ENGINE_FILES`): ``float.onnx``
(+ data), ``switch.onnx`` (its data file holds what quantize_static added; the float weights are
read from ``float.onnx.data``), ``probe.onnx`` (the suffix engine's cache filler, reading the
same weight files; empty with ``suffix_cuts: 0``), ``calibration.json`` (ORT's calibration
cache), ``engine.json`` (ops, switch map, suffix cuts, settings, floor timing) and
``float_outputs.npz`` (the reference on the evaluation set, one array per feed, read lazily).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from vlsens.core.artifacts import file_entries, verify
from vlsens.core.fsutil import file_sha256, savez_stream, staging_dir, write_json
from vlsens.core.paths import ENGINE_FILES
from vlsens.data.samples import FeedReader, Samples
from vlsens.quantize import rounding
from vlsens.quantize.qdq import QuantSettings, calibrate, prepare_float_model, quantize, raise_opset, select_ops
from vlsens.quantize.target import arithmetic_note, cpu_features
from vlsens.sensitivity.engine import Engine, SwitchEngine, engine_sensitivity, float_pass
from vlsens.sensitivity.ranking import rank_rows, read_csv, shard, write_csv
from vlsens.sensitivity.suffix import build as build_suffix
from vlsens.sensitivity.switch import build_switch_model

log = logging.getLogger(__name__)


def prepare(base_model: str | Path, calib_npz: str | Path, eval_npz: str | Path, engine_dir: str | Path,
            settings: QuantSettings, threads: int = 0, suffix_cuts: int = 32, weights_only: bool = False, *,
            logits: bool) -> dict:
    """Build the engine folder (staged, ``engine.json`` written last); ``logits``: the graph's output
    is logits (the tower says, :attr:`vlsens.export.towers.base.Tower.logits`): KL and top-1 are measured
    too, over real tokens. ``suffix_cuts`` > 0 makes the switch model segmented for the suffix engine
    (:mod:`vlsens.sensitivity.suffix`), 0 leaves it whole (every op evaluated on the full graph).
    ``weights_only`` leaves activation x activation MatMuls out of the op list (they stay float)."""
    engine_dir = Path(engine_dir)
    engine_dir.mkdir(parents=True, exist_ok=True)
    f = {k: engine_dir / v for k, v in ENGINE_FILES.items()}
    t0 = time.perf_counter()
    fl = prepare_float_model(verify(base_model), f["float_model"])
    calib, evals = Samples.load(calib_npz, fl), Samples.load(eval_npz, fl)
    ops = select_ops(fl, settings, weights_only)
    settings, wide_off = _wide_settings(fl, ops, settings)
    if settings.activation_wide:  # 16-bit Q/DQ need opset 21: the float graph converted once, weights untouched
        raise_opset(fl)
    if not ops:
        raise ValueError(f"no ops of types {list(settings.op_types)} in {base_model}")
    for stale in (f["cache"], rounding.codes_path(f["cache"])):
        stale.unlink(missing_ok=True)
    t_cal = time.perf_counter()
    with staging_dir(f["switch"]) as scratch:
        calibrate(fl, f["cache"], settings, FeedReader(calib), scratch)
        wide, rounded = _all_op_models(fl, scratch, [o.name for o in ops], settings, f["cache"], calib_npz, threads)
        t_q = time.perf_counter()
        switches = build_switch_model(fl, scratch / "model.onnx", f["switch"], [o.name for o in ops], wide)
    suffix = build_suffix(f["switch"], f["probe"], switches, suffix_cuts) if suffix_cuts > 0 else None
    if suffix is None:
        f["probe"].write_bytes(b"")  # a declared output: empty when the engine has no suffixes
    # The probe reads the switch model's weight files; its own data file stays empty.
    f["probe_data"].write_bytes(b"")
    t_sw = time.perf_counter()
    # The reference is the switch model with every switch off (identical to the float model in
    # FP32; in FP16 it keeps the engine's own float path, see README).
    eng = SwitchEngine(f["switch"], switches, evals, logits, threads)
    savez_stream(f["reference"], eng.outputs(()))
    del eng  # one session at a time
    _, floor = float_pass(fl, evals, threads)
    meta = {
        "base_model": str(base_model),
        "ops": [o.__dict__ for o in ops],
        "switches": switches.to_json(),
        "suffix": suffix.to_json() if suffix is not None else None,
        "settings": settings.as_dict(),
        "logits": bool(logits),
        "wide": bool(settings.activation_wide),
        **({"wide_off": wide_off} if wide_off else {}),
        "cpu": cpu_features(),
        "eval_images": evals.count,
        "calib_images": calib.count,
        "seconds": {"calibrate_and_quantize": t_q - t_cal, "switch_model": t_sw - t_q,
                    "total": time.perf_counter() - t0},
        "floor_seconds": floor,
        **({"rounding": rounded} if rounded else {}),
        "files": _files(f, rounded),
    }
    write_json(f["meta"], meta)
    return meta


def _files(f: dict[str, Path], rounded: dict | None) -> dict:
    """engine.json's ``files``: the graphs, and the GPTQ codes where there are (what every model
    built from this calibration takes: checked like the graphs)."""
    files = file_entries([f["float_model"], f["switch"], f["probe"]])
    if rounded:
        codes = rounding.codes_path(f["cache"])
        files[codes.name] = {"bytes": codes.stat().st_size, "sha256": file_sha256(codes)}
    return files


def _all_op_models(fl: Path, scratch: Path, names: list[str], settings: QuantSettings, cache: Path,
                   calib_npz: str | Path, threads: int) -> tuple[Path | None, dict | None]:
    """ORT's all-op QDQ model (``scratch/model.onnx``) and, with 16-bit activations, the same with
    every activation wide (returned; None without): the same calibration, the same ranges. With
    ``weight_rounding: gptq`` the GPTQ codes are fitted on the first one's grid, kept beside
    ``cache`` and written into both (and the rounding record returned)."""
    rtn = dataclasses.replace(settings, weight_rounding="rtn")
    model = quantize(fl, scratch / "model.onnx", names, rtn, cache)
    wide = quantize(fl, scratch / "wide" / "model.onnx", names, rtn, cache, all_wide=True) if settings.activation_wide else None
    if settings.weight_rounding != "gptq":
        return wide, None
    with staging_dir(scratch / "gptq") as rows:
        record = rounding.fit(fl, calib_npz, model, rounding.codes_path(cache), settings, rows, threads)
    for m in (model, wide):
        if m is not None:
            rounding.apply(m, rounding.codes_path(cache))
    return wide, record


def _wide_settings(float_model: Path, ops, settings: QuantSettings) -> tuple[QuantSettings, str]:
    """16-bit activations need float32 arithmetic around the Q/DQ pairs: float16 holds integers
    exactly up to 2048 only and overflows above 65504, so a 16-bit grid cannot be represented in an
    FP16 graph (measured on the tiny preset: the patch embedding at W8A16 in FP16, cosine 0.66).
    An FP16 graph's engine is W8A8 / float only, and says why."""
    import dataclasses

    import onnx
    from onnx import TensorProto

    from vlsens.core.onnxgraph import element_types

    if not settings.activation_wide:
        return settings, ""
    types = element_types(float_model)
    model = onnx.load(str(float_model), load_external_data=False)
    names = {o.name for o in ops}
    fp16 = [n.name for n in model.graph.node if n.name in names and types.get(n.input[0]) == TensorProto.FLOAT16]
    if not fp16:
        return settings, ""
    why = (f"{len(fp16)} of {len(ops)} ops compute in float16, which cannot hold a 16-bit grid (integers exact to "
           "2048, overflow above 65504): W8A8 or float only")
    log.warning("engine %s: %s", float_model, why)
    return dataclasses.replace(settings, activation_wide=""), why


def run_shard(engine_dir: str | Path, eval_npz: str | Path, index: int, count: int, out_csv: str | Path,
              threads: int = 0) -> dict:
    """Sensitivity rows of shard ``index`` of ``count`` (unranked) + a timing sidecar JSON."""
    eng = Engine(engine_dir)
    ops = shard(eng.ops, index, count)
    with staging_dir(out_csv) as scratch:  # the suffix cache: private to this job, removed after
        t0 = time.perf_counter()
        session = eng.session(eval_npz, threads, cache_dir=scratch)
        t_cache = time.perf_counter() - t0
        scored = engine_sensitivity(session, ops, eng.reference())
        del session
    rows, per_op, per_op_wide = scored
    write_csv(rows, out_csv)
    info = {"shard": index, "of": count, "ops": len(ops), "seconds_per_op": per_op,
            "seconds_per_op_a16": per_op_wide,
            "suffix": eng.suffix_plan is not None and bool(eng.suffix_plan.segments),
            "setup_seconds": t_cache}
    write_json(Path(out_csv).with_suffix(".json"), info)
    return info


def gather(engine_dir: str | Path, eval_npz: str | Path, shard_csvs: Sequence[str | Path],
           out_csv: str | Path, out_json: str | Path, threads: int = 0) -> dict:
    """Join shards into the ranked CSV; measure the all-INT8 model; write the sidecar JSON."""
    eng = Engine(engine_dir)
    rows = [r for p in shard_csvs for r in read_csv(p)]
    names = [r["op"] for r in rows]
    expected = [o.name for o in eng.ops]
    if sorted(names) != sorted(expected):
        missing = sorted(set(expected) - set(names))
        raise ValueError(f"shards do not cover the op list exactly (missing: {missing[:5]})")
    order = {n: i for i, n in enumerate(expected)}
    rows.sort(key=lambda r: order[r["op"]])
    ranked = rank_rows(rows)
    write_csv(ranked, out_csv)
    all_int8 = eng.session(eval_npz, threads).evaluate(expected, eng.reference())
    timings = [json.loads(Path(p).with_suffix(".json").read_text()) for p in shard_csvs]
    n = sum(t["ops"] for t in timings)
    per_op = sum(t["seconds_per_op"] * t["ops"] for t in timings) / max(n, 1)
    floor = eng.meta["floor_seconds"]
    wide = None
    if eng.wide:
        session = eng.session(eval_npz, threads)
        per_op_wide = sum((t.get("seconds_per_op_a16") or 0.0) * t["ops"] for t in timings) / max(n, 1)
        wide = {"all_a16": session.evaluate(expected, eng.reference(), expected),
                "seconds_per_op": per_op_wide,
                "cost_vs_a8": per_op_wide / per_op if per_op else None,
                "type": eng.settings.activation_wide}
        del session
    summary = {
        "engine": "ort",
        "ops": len(ranked),
        "all_int8": all_int8,
        "settings": eng.meta["settings"],
        "arithmetic": arithmetic_note(eng.meta["settings"]),
        "cpu": eng.meta.get("cpu") or cpu_features(),
        "eval_images": eng.meta["eval_images"],
        "eval_sha256": file_sha256(eval_npz),
        "calib_images": eng.meta["calib_images"],
        "seconds_per_op": per_op,
        "floor_seconds": floor,
        "per_op_over_floor": per_op / floor if floor else None,
        "shards": len(shard_csvs),
        **({"wide": wide} if wide is not None else {}),
        "most_sensitive": [r["op"] for r in ranked[:5]],
    }
    write_json(out_json, summary)
    return summary
