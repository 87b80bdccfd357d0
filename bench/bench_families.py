#!/usr/bin/env python
"""Each family's vision tower at its published widths through the stages that run the model:
reference (transformers), export + parity gate, for the fixed-size graph ``vision/<S>x<S>`` and
the per-temporal-step video graph ``vision/<S>x<S>-t2``. Prints a table: wall time and peak RSS
per stage, the gate's max relative error, the tower's parameters.

Towers (random weights from numpy's seeded generator, float32; the text LM is the tiny one, which
these stages never load):

``qwen2vl``  Qwen2-VL-2B's vision tower: 32 blocks, embed 1280, MLP 5120, 16 heads, merger -> 1536
``qwen25vl`` Qwen2.5-VL-3B's: 32 blocks (windows; full attention in 7, 15, 23, 31), hidden 1280,
             MLP 3420, merger -> 2048
``qwen3vl``  Qwen3-VL-4B's: 24 blocks, hidden 1024, MLP 4096, 16 heads, patch 16, a 48 x 48 position
             table, DeepStack after blocks 5, 11, 17, merger -> 2560

Every stage runs in a fresh process (``python -m`` of this file with ``--stage``) so its peak RSS
(VmHWM) is its own.

    python bench/bench_families.py                       # all three, 448x448
    python bench/bench_families.py --towers qwen3vl --size 448
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

TOWERS = {
    "qwen2vl": ("tiny-qwen2vl", dict(depth=32, embed_dim=1280, hidden_size=1536, mlp_ratio=4, num_heads=16,
                                     initializer_range=0.02)),
    "qwen25vl": ("tiny", dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                              fullatt_block_indexes=[7, 15, 23, 31], initializer_range=0.02)),
    "qwen3vl": ("tiny-qwen3vl", dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                                     out_hidden_size=2560, num_position_embeddings=2304,
                                     deepstack_visual_indexes=[5, 11, 17], initializer_range=0.02)),
}


def peak_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stage(args) -> None:
    """One stage in this process; prints a JSON line."""
    import yaml

    from vlsens.config import with_defaults
    from vlsens.data.images import resolve_images
    from vlsens.export import stages
    from vlsens.export.towers import active

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["model"]["checkpoint"] = args.ckpt
    s = f"{args.size}x{args.size}"
    cfg["vision"].update(sizes=[s], uint8={"sizes": []}, video={"sizes": [s], "frames": 2},
                         dynamic={"enabled": False})
    cfg["text"]["enabled"] = False
    cfg["deploy"]["enabled"] = False
    cfg = with_defaults(cfg)
    tower = active(cfg)[args.graph]
    work = Path(args.work)
    t0 = time.perf_counter()
    out: dict = {}
    if args.stage == "reference":
        stages.reference(tower, args.ckpt, resolve_images("builtin")[:1], work / "reference.npz",
                         tower.reference_settings())
    else:
        rec = stages.export(tower, args.ckpt, work / "reference.npz", work / "fp32", cfg["parity"]["tolerance"]["fp32"],
                            tower.export_settings(), threads=2)
        out["max_rel_error"] = rec["metrics"]["max_rel_error"]
    out.update(seconds=time.perf_counter() - t0, peak_mib=peak_mib())
    print("RESULT " + json.dumps(out))


def run_stage(**kw) -> dict:
    cmd = [sys.executable, __file__] + [f"--{k}={v}" for k, v in kw.items()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not lines:
        raise SystemExit(f"{kw}: failed\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--towers", nargs="+", default=list(TOWERS), choices=list(TOWERS))
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--stage"), ap.add_argument("--ckpt"), ap.add_argument("--graph"), ap.add_argument("--work")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    args = ap.parse_args()
    if args.stage:
        return stage(args)
    from vlsens.model.presets.build import build_tiny_checkpoint

    rows = []
    with tempfile.TemporaryDirectory(prefix="vlsens-families-") as tmp:
        for name in args.towers:
            preset, vision = TOWERS[name]
            ckpt = Path(tmp) / name / "ckpt"
            t0 = time.perf_counter()
            build_tiny_checkpoint(ckpt, seed=0, vision=vision, preset=preset)
            built = time.perf_counter() - t0
            params = _vision_params(ckpt)
            for graph in (f"vision/{args.size}x{args.size}", f"vision/{args.size}x{args.size}-t2"):
                work = Path(tmp) / name / graph.replace("/", "-")
                work.mkdir(parents=True)
                ref = run_stage(stage="reference", ckpt=ckpt, graph=graph, work=work, size=args.size)
                exp = run_stage(stage="export", ckpt=ckpt, graph=graph, work=work, size=args.size)
                rows.append((name, f"{params / 1e6:.0f} M", graph, f"{ref['seconds']:.0f}", f"{ref['peak_mib'] / 1024:.1f}",
                             f"{exp['seconds']:.0f}", f"{exp['peak_mib'] / 1024:.1f}", f"{exp['max_rel_error']:.1e}"))
                print(" | ".join(rows[-1]), flush=True)
            print(f"({name}: checkpoint built in {built:.0f} s)", flush=True)
            shutil.rmtree(Path(tmp) / name)  # a few GB per tower
    head = ("tower", "vision params", "graph", "reference s", "peak GB", "export+gate s", "peak GB", "max rel err")
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


def _vision_params(ckpt: Path) -> int:
    """Vision-tower parameters, from the safetensors headers."""
    from math import prod

    from vlsens.model.checkpoint import safetensors_header

    n = 0
    for f in ckpt.glob("*.safetensors"):
        for k, v in safetensors_header(f).items():
            if k != "__metadata__" and ".visual." in f".{k}":
                n += prod(v["shape"])
    return n


if __name__ == "__main__":
    from _publish import named, published

    with published(named("families"), "Model families at real widths"):
        main()
