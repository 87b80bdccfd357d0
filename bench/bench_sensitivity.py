#!/usr/bin/env python
"""Seconds per op of the ``ort`` sensitivity engine next to the straightforward method (one
quantized model + session per op) and next to the floor (one plain forward pass over the
evaluation set), for the tiny preset and a ViT-B-sized tower (Qwen2.5-VL-3B's vision widths,
fewer blocks). Prints a table.

The straightforward method is timed on the first ``--straight-ops`` ops and that mean is
reported per op (it costs the same for every op; the table says how many were timed).

Engine ``inc`` (Intel Neural Compressor mse_v2, in its own interpreter ``.venv-inc``) is bounded
the same way: it scores the first ``--inc-ops`` ops (0: all) on the same calibration and
evaluation sets, and the table extrapolates its time to all ops, saying so.

    python bench/bench_sensitivity.py                   # tiny + vitb, 224x224
    python bench/bench_sensitivity.py --towers vitb --vitb-depth 6
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


def run_inc(python: Path, d: Path, max_ops: int, threads: int) -> dict | None:
    """Engine inc on the tower's fp32 model via the workflow's own script (bounded to max_ops)."""
    import json
    import subprocess

    from vlsens.quant import QuantSettings

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
    if r.returncode != 0:
        raise RuntimeError(f"inc failed: {r.stderr[-2000:]}")
    return json.loads((out / "inc.json").read_text())


def run_tower(name: str, vision: dict | None, work: Path, size: tuple[int, int], straight_ops: int,
              threads: int, n_calib: int, n_eval: int, inc_python: Path, inc_ops: int) -> dict:
    import yaml

    from vlsens import stages, towers
    from vlsens.calibration import load_split
    from vlsens.checkpoint import build_tiny_checkpoint
    from vlsens.config import with_defaults
    from vlsens.images import resolve_images
    from vlsens.inputs import write_manifests
    from vlsens.quant import QuantSettings
    from vlsens.sensitivity.baseline import straightforward_sensitivity
    from vlsens.sensitivity.engine import Engine, engine_sensitivity
    from vlsens.sensitivity.stages import prepare

    h, w = size
    d = work / name
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
                   QuantSettings(), threads)
    prepare_s = time.perf_counter() - t0
    eng = Engine(d / "engine")
    evals = load_split(d / "calib" / "eval.npz")
    ref = list(eng.reference())
    _, per_engine = engine_sensitivity(eng.session(evals, threads), eng.ops, ref)
    k = min(straight_ops, len(eng.ops))
    _, per_straight, _ = straightforward_sensitivity(eng.float_model, eng.ops[:k], eng.settings, eng.cache, evals,
                                                     ref, d / "scratch", threads)
    params = sum(o.weight_params for o in eng.ops)
    inc = run_inc(inc_python, d, inc_ops, threads)
    return {"tower": name, "ops": len(eng.ops), "params_m": params / 1e6, "eval": len(evals),
            "floor": meta["floor_seconds"], "engine": per_engine, "straight": per_straight, "straight_n": k,
            "prepare": prepare_s, "inc": inc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--towers", nargs="+", default=["tiny", "vitb"], choices=["tiny", "vitb"])
    ap.add_argument("--vitb-depth", type=int, default=4)
    ap.add_argument("--size", default="224x224")
    ap.add_argument("--straight-ops", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calib", type=int, default=4)
    ap.add_argument("--eval", type=int, default=3)
    ap.add_argument("--inc-ops", type=int, default=4, help="ops engine inc scores (0: all)")
    ap.add_argument("--inc-python", type=Path, default=REPO / ".venv-inc" / "bin" / "python")
    ap.add_argument("--workdir")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vlsens-bench-sens-"))
    size = tuple(int(x) for x in a.size.split("x"))
    rows = []
    for t in a.towers:
        vision = None if t == "tiny" else vitb_vision(a.vitb_depth)
        rows.append(run_tower(t, vision, work, size, a.straight_ops, a.threads, a.calib, a.eval, a.inc_python,
                              a.inc_ops))
    print(f"\nsize {a.size}, {a.threads} threads, ONNX Runtime CPU, basic graph optimizations (fake-quant Q/DQ)")
    head = f"{'tower':<6} {'ops':>4} {'weights M':>9} {'eval imgs':>9} {'floor s':>8} {'engine s/op':>11} " \
           f"{'x floor':>7} {'straight s/op':>13} {'(timed ops)':>11} {'speed-up':>8} {'prepare s':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['tower']:<6} {r['ops']:>4} {r['params_m']:>9.1f} {r['eval']:>9} {r['floor']:>8.3f} "
              f"{r['engine']:>11.3f} {r['engine'] / r['floor']:>7.2f} {r['straight']:>13.3f} {r['straight_n']:>11} "
              f"{r['straight'] / r['engine']:>8.1f} {r['prepare']:>9.1f}")
    print(f"\nengine inc (INC {INC_NOTE}) on the same calibration/evaluation sets:")
    head = f"{'tower':<6} {'ops':>4} {'inc s/op':>9} {'(timed ops)':>11} {'inc all ops s':>13} {'':>13} " \
           f"{'inc / ort':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        inc = r["inc"]
        if inc is None:
            print(f"{r['tower']:<6} {r['ops']:>4} {'n/a (no .venv-inc)':>24}")
            continue
        note = "extrapolated" if inc["bounded"] else "measured"
        print(f"{r['tower']:<6} {r['ops']:>4} {inc['seconds_per_op']:>9.3f} {inc['ops']:>11} "
              f"{inc['extrapolated_seconds_all_ops']:>13.1f} {note:>13} {inc['seconds_per_op'] / r['engine']:>9.1f}")
    print(f"\nfloor: one plain forward pass of the float model over the evaluation set. prepare: calibration "
          f"+ all-op quantization + switch model, paid once per model.\nwork dir: {work}")


if __name__ == "__main__":
    main()
