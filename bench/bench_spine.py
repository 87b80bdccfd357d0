#!/usr/bin/env python
"""Export time and peak memory per stage of the spine (checkpoint -> reference -> fp32 export ->
fp16 -> simplified variants), printed as a table.

Each stage runs in a fresh child process, so "peak RSS" is that stage's own high-water mark and
"stage s" excludes interpreter start-up and imports (shown separately as "process s").

    python bench/bench_spine.py                      # tiny preset, 224x224 and 224x336
    python bench/bench_spine.py --checkpoint DIR --sizes 448x448 --workdir /scratch/bench
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOL32 = {"min_cosine": 0.99999, "max_rel_error": 1e-4}
TOL16 = {"min_cosine": 0.999, "max_rel_error": 2e-2}

CHILD = r"""
import json, sys, time
sys.path.insert(0, {src!r})
args = json.loads({args!r})
stage = args["stage"]
if stage == "checkpoint":
    from vlsens.checkpoint import build_tiny_checkpoint
    job = lambda: build_tiny_checkpoint(args["ckpt"], seed=0)
elif stage == "reference":
    from vlsens.images import resolve_images
    from vlsens.vision import compute_reference
    job = lambda: compute_reference(args["ckpt"], resolve_images("builtin")[:2], args["h"], args["w"]).save(args["ref"])
elif stage == "export":
    from vlsens.export import export_vision_fixed
    job = lambda: export_vision_fixed(args["ckpt"], args["ref"], args["out"], args["out"] + ".parity.json",
                                      args["h"], args["w"], args["tol32"])
elif stage == "fp16":
    from vlsens.fp16 import convert_vision_fp16
    job = lambda: convert_vision_fp16(args["src"], args["ref"], args["out"], args["out"] + ".parity.json",
                                      args["tol16"], max_activation=512)
else:
    from vlsens.simplify import simplify_vision
    tol = args["tol16"] if stage == "fp16-sim" else args["tol32"]
    job = lambda: simplify_vision(args["src"], args["ref"], args["out"], args["out"] + ".parity.json", tol, stage)
import torch, onnx, onnxruntime, transformers  # imports are not part of a stage's time
t0 = time.perf_counter()
job()
print("STAGE_SECONDS", time.perf_counter() - t0)
"""


def run_stage(args: dict) -> tuple[float, float, float]:
    code = CHILD.format(src=str(REPO / "src"), args=json.dumps(args))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out, err = proc.stdout.read(), proc.stderr.read()
    if status != 0:
        sys.exit(f"stage {args['stage']} failed:\n{err[-3000:]}")
    stage_s = float(next(line.split()[1] for line in out.splitlines() if line.startswith("STAGE_SECONDS")))
    return stage_s, wall, usage.ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="local Qwen2.5-VL directory (default: build the tiny preset)")
    ap.add_argument("--sizes", nargs="+", default=["224x224", "224x336"])
    ap.add_argument("--workdir", help="where models go (default: a temporary directory)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vlsens-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    ckpt = a.checkpoint or str(work / "checkpoint")
    common = {"ckpt": ckpt, "tol32": TOL32, "tol16": TOL16}
    if not a.checkpoint:
        rows.append(("checkpoint (tiny)", "-", *run_stage({**common, "stage": "checkpoint"})))
    for size in a.sizes:
        h, w = map(int, size.split("x"))
        d = work / size
        d.mkdir(exist_ok=True)
        base = {**common, "h": h, "w": w, "ref": str(d / "reference.npz")}
        plan = [
            ("reference", {}),
            ("export", {"out": str(d / "fp32.onnx")}),
            ("fp16", {"src": str(d / "fp32.onnx"), "out": str(d / "fp16.onnx")}),
            ("fp32-sim", {"src": str(d / "fp32.onnx"), "out": str(d / "fp32-sim.onnx")}),
            ("fp16-sim", {"src": str(d / "fp16.onnx"), "out": str(d / "fp16-sim.onnx")}),
        ]
        for stage, extra in plan:
            rows.append((stage, size, *run_stage({**base, **extra, "stage": stage})))
    head = ("stage", "size", "stage s", "process s", "peak RSS MiB")
    print(f"{head[0]:<18} {head[1]:<9} {head[2]:>8} {head[3]:>10} {head[4]:>13}")
    print("-" * 62)
    for stage, size, s, wall, rss in rows:
        print(f"{stage:<18} {size:<9} {s:>8.2f} {wall:>10.2f} {rss:>13.0f}")
    print(f"\nmodels and parity records: {work}")


if __name__ == "__main__":
    main()
