#!/usr/bin/env python
"""Time and peak memory per stage of the spine (checkpoint -> reference -> fp32 export -> fp16 ->
simplified variants), for any graph (tower), printed as a table.

Each stage runs in a fresh child process, so "peak RSS" is that stage's own high-water mark and
"stage s" excludes interpreter start-up and imports (shown separately as "process s").

    python bench/bench_spine.py                      # tiny preset, vision/224x224 and vision/224x336
    python bench/bench_spine.py --graphs vision/224x224 vision/dynamic text
    python bench/bench_spine.py --checkpoint DIR --graphs vision/448x448 --workdir /scratch/bench
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
    from vlsens.model.presets.build import build_tiny_checkpoint
    job = lambda: build_tiny_checkpoint(args["ckpt"], seed=0)
else:
    import yaml
    from vlsens.export import stages, towers
    from vlsens import variants
    from vlsens.config import with_defaults
    from vlsens.data.images import resolve_images
    cfg = yaml.safe_load(open(args["config"]))
    cfg["vision"]["sizes"] = args["sizes"]
    tower = towers.for_graph(with_defaults(cfg), args["graph"])
    if stage == "reference":
        job = lambda: stages.reference(tower, args["ckpt"], resolve_images("builtin")[:2], args["ref"],
                                       tower.reference_settings())
    elif stage == "export":
        job = lambda: stages.export(tower, args["ckpt"], args["ref"], args["out"], args["tol32"],
                                    tower.export_settings())
    elif stage == "fp16":
        job = lambda: variants.fp16(args["src"], args["ref"], args["out"], args["tol16"], 512, 65504)
    else:
        tol = args["tol16"] if stage == "fp16-sim" else args["tol32"]
        job = lambda: variants.simplify(args["src"], args["ref"], args["out"], tol, stage, 2_000_000_000)
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
    ap.add_argument("--graphs", nargs="+", default=["vision/224x224", "vision/224x336"])
    ap.add_argument("--workdir", help="where models go (default: a temporary directory)")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vlsens-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    ckpt = a.checkpoint or str(work / "checkpoint")
    sizes = [g.split("/", 1)[1] for g in a.graphs if g.startswith("vision/") and g != "vision/dynamic"] or ["224x224"]
    common = {"ckpt": ckpt, "tol32": TOL32, "tol16": TOL16, "config": str(REPO / "config" / "config.yaml"),
              "sizes": sizes}
    if not a.checkpoint:
        rows.append(("checkpoint (tiny)", "-", *run_stage({**common, "stage": "checkpoint"})))
    for graph in a.graphs:
        d = work / graph.replace("/", "-")
        d.mkdir(exist_ok=True)
        base = {**common, "graph": graph, "ref": str(d / "reference.npz")}
        plan = [
            ("reference", {}),
            ("export", {"out": str(d / "fp32")}),
            ("fp16", {"src": str(d / "fp32"), "out": str(d / "fp16")}),
            ("fp32-sim", {"src": str(d / "fp32"), "out": str(d / "fp32-sim")}),
            ("fp16-sim", {"src": str(d / "fp16"), "out": str(d / "fp16-sim")}),
        ]
        for stage, extra in plan:
            rows.append((stage, graph, *run_stage({**base, **extra, "stage": stage})))
    head = ("stage", "graph", "stage s", "process s", "peak RSS MiB")
    print(f"{head[0]:<18} {head[1]:<16} {head[2]:>8} {head[3]:>10} {head[4]:>13}")
    print("-" * 69)
    for stage, graph, s, wall, rss in rows:
        print(f"{stage:<18} {graph:<16} {s:>8.2f} {wall:>10.2f} {rss:>13.0f}")
    print(f"\nmodels and parity records: {work}")


if __name__ == "__main__":
    from _publish import published

    with published("spine", "The spine: export to profile on the tiny preset"):
        main()
