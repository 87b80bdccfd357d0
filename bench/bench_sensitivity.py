#!/usr/bin/env python
"""Seconds per op of the ``ort`` sensitivity engine -- on the whole graph and as the suffix
engine (each op from its cut on, :mod:`vlsens.sensitivity.suffix`) -- next to the straightforward
method (one quantized model + session per op) and next to the floor (one plain forward pass over
the evaluation set), for the tiny preset, a ViT-B-sized tower (Qwen2.5-VL-3B's vision widths,
fewer blocks) and the real 3B tower (32 blocks). Prints a table.

``--max-ops N`` bounds the ops each engine scores to N ops spread evenly over the graph (every
k-th op in graph order, so early and late ops, cheap and dear suffixes, are both in the sample);
the table says how many were timed. Both engines score the same sample, and the suffix engine's
numbers are checked equal to the whole graph's on it.

The straightforward method is timed on the first ``--straight-ops`` ops and that mean is
reported per op (it costs the same for every op; the table says how many were timed).

Engine ``inc`` (Intel Neural Compressor mse_v2, in its own interpreter ``.venv-inc``) is bounded
the same way: it scores the first ``--inc-ops`` ops (0: all) on the same calibration and
evaluation sets, and the table extrapolates its time to all ops, saying so.

    python bench/bench_sensitivity.py                   # tiny + vitb, 224x224
    python bench/bench_sensitivity.py --towers vitb --vitb-depth 6
    python bench/bench_sensitivity.py --towers 3b --size 448x448 --max-ops 16 --inc-ops 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

INC_NOTE = "3.7.1 mse_v2: per op, re-calibrate + re-quantize + evaluate"
TOL32 = {"min_cosine": 0.99999, "max_rel_error": 1e-3}


def vitb_vision(depth: int) -> dict:
    """Qwen2.5-VL-3B vision widths (hidden 1280, 16 heads, MLP 3420, out 2048), ``depth`` blocks."""
    full = [i for i in range(depth) if i % 4 == 3] or [depth - 1]
    return dict(depth=depth, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                fullatt_block_indexes=full, initializer_range=0.02)


def vision_3b() -> dict:
    """The published Qwen2.5-VL-3B vision tower (32 blocks, full attention in 7, 15, 23, 31)."""
    from vlsens.model.presets.tables import REAL_3B_VISION

    return dict(REAL_3B_VISION, initializer_range=0.02)


def sample_ops(ops: list, max_ops: int) -> list:
    """Every k-th op (graph order) so that at most ``max_ops`` remain (0: all)."""
    if not max_ops or max_ops >= len(ops):
        return list(ops)
    step = len(ops) / max_ops
    return [ops[int(i * step)] for i in range(max_ops)]


def run_inc(python: Path, d: Path, max_ops: int, threads: int) -> dict | None:
    """Engine inc on the tower's fp32 model via the workflow's own script (bounded to max_ops)."""
    import json
    import subprocess

    from vlsens.quantize.qdq import QuantSettings

    if not python.exists():
        print(f"inc: skipped, {python} missing (make inc-env)", file=sys.stderr)
        return None
    out = d / "inc"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(python), str(REPO / "workflow" / "scripts" / "sensitivity_inc.py"),
           "--model", str(d / "fp32" / "model.onnx"), "--calib", str(d / "calib" / "calib.npz"),
           "--eval", str(d / "calib" / "eval.npz"), "--csv", str(out / "inc.csv"), "--summary", str(out / "inc.json"),
           "--log", str(out / "log"), "--settings", json.dumps(QuantSettings().as_dict()),
           "--max-ops", str(max_ops), "--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:  # reported in the table, with INC's own last words
        last = [line for line in r.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        return {"failed": last[0][:200]}
    return json.loads((out / "inc.json").read_text())


def run_tower(name: str, vision: dict | None, work: Path, size: tuple[int, int], straight_ops: int,
              threads: int, n_calib: int, n_eval: int, inc_python: Path, inc_ops: int, max_ops: int) -> dict:
    import yaml

    from vlsens.config import with_defaults
    from vlsens.data.images import resolve_images
    from vlsens.data.inputs import write_manifests
    from vlsens.export import stages, towers
    from vlsens.model.presets.build import build_tiny_checkpoint
    from vlsens.quantize.qdq import QuantSettings
    from vlsens.sensitivity.baseline import straightforward_sensitivity
    from vlsens.sensitivity.engine import Engine, engine_sensitivity
    from vlsens.sensitivity.stages import prepare

    h, w = size
    d = work / name
    if (d / "engine" / "engine.json").is_file():  # --workdir of an earlier run: its engine is reused
        import json

        meta = json.loads((d / "engine" / "engine.json").read_text())
        prepare_s = meta["seconds"]["total"]
    else:
        ckpt = build_tiny_checkpoint(d / "ckpt", seed=0, vision=vision)
        refs = resolve_images("builtin")
        cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
        cfg["vision"]["sizes"] = [f"{h}x{w}"]
        cfg["calibration"].update(num_calib=n_calib, num_eval=n_eval)
        tower = towers.for_graph(with_defaults(cfg), f"vision/{h}x{w}")
        stages.reference(tower, ckpt, refs[:1], d / "ref.npz", {})
        stages.export(tower, ckpt, d / "ref.npz", d / "fp32", TOL32, tower.export_settings(), threads=threads)
        images = write_manifests(d / "inputs", None, refs[:1], refs, None)["calibration_images"]
        stages.calibration(tower, ckpt, {"images": images}, d / "calib", tower.calibration_settings())
        t0 = time.perf_counter()
        meta = prepare(d / "fp32" / "model.onnx", d / "calib" / "calib.npz", d / "calib" / "eval.npz", d / "engine",
                       QuantSettings(), threads, logits=tower.logits)
        prepare_s = time.perf_counter() - t0
    eng = Engine(d / "engine")
    evals = eng.samples(d / "calib" / "eval.npz")
    ref = list(eng.reference())
    ops = sample_ops(eng.ops, max_ops)
    rows_full, per_engine = engine_sensitivity(eng.session(evals, threads), ops, ref)
    t0 = time.perf_counter()
    suffix_session = eng.session(evals, threads, cache_dir=d / "suffix-cache")
    cache_s = time.perf_counter() - t0
    rows_suffix, per_suffix = engine_sensitivity(suffix_session, ops, ref)
    del suffix_session
    for a, b in zip(rows_full, rows_suffix, strict=True):
        if a != b:
            raise AssertionError(f"suffix engine differs from the whole graph on {a['op']}: {a} vs {b}")
    k = min(straight_ops, len(eng.ops))
    _, per_straight, _ = straightforward_sensitivity(eng.float_model, eng.ops[:k], eng.settings, eng.cache, evals,
                                                     ref, d / "scratch", threads, logits=eng.logits)
    params = sum(o.weight_params for o in eng.ops)
    inc = run_inc(inc_python, d, inc_ops, threads) if inc_ops >= 0 else {"failed": "not run (--inc-ops -1)"}
    return {"tower": name, "ops": len(eng.ops), "timed": len(ops), "params_m": params / 1e6, "eval": evals.count,
            "floor": meta["floor_seconds"], "engine": per_engine, "suffix": per_suffix, "cache": cache_s,
            "cuts": len(eng.suffix_plan.cuts) if eng.suffix_plan else 0,
            "straight": per_straight, "straight_n": k, "prepare": prepare_s, "inc": inc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--towers", nargs="+", default=["tiny", "vitb"], choices=["tiny", "vitb", "3b"])
    ap.add_argument("--vitb-depth", type=int, default=4)
    ap.add_argument("--size", default="224x224")
    ap.add_argument("--straight-ops", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calib", type=int, default=4)
    ap.add_argument("--eval", type=int, default=3)
    ap.add_argument("--inc-ops", type=int, default=4, help="ops engine inc scores (0: all, -1: none)")
    ap.add_argument("--max-ops", type=int, default=0, help="ops the ort engines score, spread evenly (0: all)")
    ap.add_argument("--inc-python", type=Path, default=REPO / ".venv-inc" / "bin" / "python")
    ap.add_argument("--workdir")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vlsens-bench-sens-"))
    size = tuple(int(x) for x in a.size.split("x"))
    rows = []
    for t in a.towers:
        vision = {"tiny": None, "vitb": vitb_vision(a.vitb_depth), "3b": vision_3b()}[t]
        rows.append(run_tower(t, vision, work, size, a.straight_ops, a.threads, a.calib, a.eval, a.inc_python,
                              a.inc_ops, a.max_ops))
    print(f"\nsize {a.size}, {a.threads} threads, ONNX Runtime CPU, basic graph optimizations (fake-quant Q/DQ)")
    head = f"{'tower':<6} {'ops':>4} {'timed':>5} {'weights M':>9} {'eval imgs':>9} {'floor s':>8} " \
           f"{'whole s/op':>10} {'x floor':>7} {'suffix s/op':>11} {'x floor':>7} {'cuts':>4} {'cache s':>7} " \
           f"{'straight s/op':>13} {'(timed ops)':>11} {'prepare s':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['tower']:<6} {r['ops']:>4} {r['timed']:>5} {r['params_m']:>9.1f} {r['eval']:>9} {r['floor']:>8.3f} "
              f"{r['engine']:>10.3f} {r['engine'] / r['floor']:>7.2f} {r['suffix']:>11.3f} "
              f"{r['suffix'] / r['floor']:>7.2f} {r['cuts']:>4} {r['cache']:>7.1f} "
              f"{r['straight']:>13.3f} {r['straight_n']:>11} {r['prepare']:>9.1f}")
    print(f"\nengine inc (INC {INC_NOTE}) on the same calibration/evaluation sets:")
    head = f"{'tower':<6} {'ops':>4} {'inc s/op':>9} {'(timed ops)':>11} {'inc all ops s':>13} {'':>13} " \
           f"{'inc / suffix':>12}"
    print(head)
    print("-" * len(head))
    for r in rows:
        inc = r["inc"]
        if inc is None:
            print(f"{r['tower']:<6} {r['ops']:>4} {'n/a (no .venv-inc)':>24}")
            continue
        if "failed" in inc:
            print(f"{r['tower']:<6} {r['ops']:>4}  failed: {inc['failed']}")
            continue
        note = "extrapolated" if inc["bounded"] else "measured"
        print(f"{r['tower']:<6} {r['ops']:>4} {inc['seconds_per_op']:>9.3f} {inc['ops']:>11} "
              f"{inc['extrapolated_seconds_all_ops']:>13.1f} {note:>13} {inc['seconds_per_op'] / r['suffix']:>12.1f}")
    print(f"\nfloor: one plain forward pass of the float model over the evaluation set. whole: the switch "
          f"model on the whole graph per op; suffix: from the op's cut on (cache s: the one float pass that "
          f"fills its cache, paid once per job, not in s/op). prepare: calibration + all-op quantization + "
          f"switch model, paid once per model. timed < ops: an even sample of the ops, per-op means "
          f"extrapolate.\nwork dir: {work}")


if __name__ == "__main__":
    from _publish import named, published

    with published(named("sensitivity"), "Sensitivity engines: seconds per op"):
        main()
