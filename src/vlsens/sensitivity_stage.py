"""Stages of the ``ort`` sensitivity engine, as the workflow runs them.

``prepare``  float model (untied) -> calibration (once, ORT cache) -> all-op QDQ model ->
             switch model; also the float outputs on the evaluation set and the floor timing.
``shard``    rows for one contiguous slice of the op list (a cluster spreads shards over jobs).
``gather``   shards -> ranked ``ort.csv`` + ``ort.json`` (all-INT8 metrics, timing, settings).

Engine folder (``engine/``): ``float.onnx``, ``switch.onnx`` (+ data), ``calibration.json``
(ORT's calibration cache), ``engine.json`` (ops, switch map, settings, floor timing) and
``float_outputs.npz`` (the reference on the evaluation set, one array per feed, read lazily).

The base model is a fixed-size vision graph (``pixel_values``) or the text ``embeds.onnx``
graph (one sequence per feed; metrics over real tokens, plus KL and top-1 on the logits).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from vlsens.artifacts import file_entries
from vlsens.fsutil import file_sha256, staging_dir, write_json
from vlsens.quant import Op, QuantSettings, prepare_float_model, quantize
from vlsens.samples import FeedReader, ReferenceStore, Samples
from vlsens.sensitivity import (
    SwitchEngine,
    SwitchMap,
    build_switch_model,
    engine_sensitivity,
    float_pass,
    rank_rows,
    read_csv,
    select_ops,
    shard,
    write_csv,
)

log = logging.getLogger(__name__)


class Engine:
    """Paths and metadata of a prepared engine folder."""

    def __init__(self, folder: str | Path):
        self.dir = Path(folder)
        self.meta = json.loads((self.dir / "engine.json").read_text())
        self.ops = [Op(**o) for o in self.meta["ops"]]
        self.switches = SwitchMap.from_json(self.meta["switches"])
        self.settings = QuantSettings.from_config(self.meta["settings"])

    @property
    def float_model(self) -> Path:
        return self.dir / "float.onnx"

    @property
    def switch_model(self) -> Path:
        return self.dir / "switch.onnx"

    @property
    def cache(self) -> Path:
        return self.dir / "calibration.json"

    def reference(self) -> ReferenceStore:
        return ReferenceStore(self.dir / "float_outputs.npz")

    def float_outputs(self) -> np.ndarray:
        """The reference, concatenated (vision; text logits stay per feed: :meth:`reference`)."""
        return self.reference().concatenated()

    def samples(self, split_npz: str | Path) -> Samples:
        return Samples.load(split_npz, self.float_model)

    def session(self, eval_inputs, threads: int = 0) -> SwitchEngine:
        if isinstance(eval_inputs, (str, Path)):
            eval_inputs = self.samples(eval_inputs)
        return SwitchEngine(self.switch_model, self.switches, eval_inputs, threads)


def prepare(base_model: str | Path, calib_npz: str | Path, eval_npz: str | Path, engine_dir: str | Path,
            settings: QuantSettings, threads: int = 0) -> dict:
    """Build the engine folder (staged, ``engine.json`` written last)."""
    engine_dir = Path(engine_dir)
    engine_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    fl = prepare_float_model(base_model, engine_dir / "float.onnx")
    calib, evals = Samples.load(calib_npz, fl), Samples.load(eval_npz, fl)
    ops = select_ops(fl, settings)
    if not ops:
        raise ValueError(f"no ops of types {list(settings.op_types)} in {base_model}")
    cache = engine_dir / "calibration.json"
    if cache.exists():
        cache.unlink()
    t_cal = time.perf_counter()
    with staging_dir(engine_dir / "switch.onnx") as scratch:
        quantize(fl, scratch / "model.onnx", [o.name for o in ops], settings, cache, FeedReader(calib))
        t_q = time.perf_counter()
        switches = build_switch_model(fl, scratch / "model.onnx", engine_dir / "switch.onnx", [o.name for o in ops])
    t_sw = time.perf_counter()
    # The reference is the switch model with every switch off (identical to the float model in
    # FP32; in FP16 it keeps the engine's own float path, see README).
    eng = SwitchEngine(engine_dir / "switch.onnx", switches, evals, threads)
    ReferenceStore.write(engine_dir / "float_outputs.npz", eng.outputs(()))
    _, floor = float_pass(fl, evals, threads)
    meta = {
        "base_model": str(base_model),
        "ops": [o.__dict__ for o in ops],
        "switches": switches.to_json(),
        "settings": settings.as_dict(),
        "eval_images": evals.count,
        "calib_images": calib.count,
        "seconds": {"calibrate_and_quantize": t_q - t_cal, "switch_model": t_sw - t_q,
                    "total": time.perf_counter() - t0},
        "floor_seconds": floor,
        "files": file_entries([fl, engine_dir / "switch.onnx"]),
    }
    write_json(engine_dir / "engine.json", meta)
    return meta


def run_shard(engine_dir: str | Path, eval_npz: str | Path, index: int, count: int, out_csv: str | Path,
              threads: int = 0) -> dict:
    """Sensitivity rows of shard ``index`` of ``count`` (unranked) + a timing sidecar JSON."""
    eng_dir = Engine(engine_dir)
    ops = shard(eng_dir.ops, index, count)
    engine = eng_dir.session(eval_npz, threads)
    rows, per_op = engine_sensitivity(engine, ops, eng_dir.reference())
    write_csv(rows, out_csv)
    info = {"shard": index, "of": count, "ops": len(ops), "seconds_per_op": per_op}
    write_json(Path(out_csv).with_suffix(".json"), info)
    return info


def gather(engine_dir: str | Path, eval_npz: str | Path, shard_csvs: Sequence[str | Path],
           out_csv: str | Path, out_json: str | Path, threads: int = 0) -> dict:
    """Join shards into the ranked CSV; measure the all-INT8 model; write the sidecar JSON."""
    eng_dir = Engine(engine_dir)
    rows = [r for p in shard_csvs for r in read_csv(p)]
    names = [r["op"] for r in rows]
    expected = [o.name for o in eng_dir.ops]
    if sorted(names) != sorted(expected):
        missing = sorted(set(expected) - set(names))
        raise ValueError(f"shards do not cover the op list exactly (missing: {missing[:5]})")
    order = {n: i for i, n in enumerate(expected)}
    rows.sort(key=lambda r: order[r["op"]])
    ranked = rank_rows(rows)
    write_csv(ranked, out_csv)
    engine = eng_dir.session(eval_npz, threads)
    all_int8 = engine.evaluate(expected, eng_dir.reference())
    timings = [json.loads(Path(p).with_suffix(".json").read_text()) for p in shard_csvs]
    n = sum(t["ops"] for t in timings)
    per_op = sum(t["seconds_per_op"] * t["ops"] for t in timings) / max(n, 1)
    summary = {
        "engine": "ort",
        "ops": len(ranked),
        "all_int8": all_int8,
        "settings": eng_dir.meta["settings"],
        "eval_images": eng_dir.meta["eval_images"],
        "eval_sha256": file_sha256(eval_npz),
        "calib_images": eng_dir.meta["calib_images"],
        "seconds_per_op": per_op,
        "floor_seconds": eng_dir.meta["floor_seconds"],
        "per_op_over_floor": per_op / eng_dir.meta["floor_seconds"] if eng_dir.meta["floor_seconds"] else None,
        "shards": len(shard_csvs),
        "most_sensitive": [r["op"] for r in ranked[:5]],
    }
    write_json(out_json, summary)
    return summary
