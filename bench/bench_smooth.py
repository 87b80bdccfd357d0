#!/usr/bin/env python
"""What fp32-smooth buys, per tower: the vision tower with every op W8A8 (and every op W8A16), its
error against the float graph on the evaluation images, FP32 next to fp32-smooth, and which blocks
the per-block measurement migrated.

Towers: the held-out planted one (depth 5, width 80, three MLP channels of block 1 scaled 500x,
252x196; ``tests/test_npu_precision.py``) and the same architecture with no planted outlier under
other seeds (random weights: the case where migration has little to win). Each is built from
scratch (checkpoint, reference, gated export, calibration: 6 calibration and 3 evaluation images),
then ``variants.smooth`` with the ``npu`` target's settings. The all-op models are ONNX Runtime's
QDQ calibrated on the calibration images, as the sensitivity engine's all-INT8 model.

    python bench/bench_smooth.py [--seeds 11 5 3 7] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))


def tower(root: Path, seed: int, planted: bool) -> dict:
    from conftest import TOL_FP32, build_graph, run_settings
    from test_npu_precision import PLANT, SIZE, VISION, all_ops_mse

    from vlsens import variants
    from vlsens.data.images import resolve_images
    from vlsens.model.presets.build import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(root / "ckpt", seed=seed, outlier=PLANT if planted else None, vision=VISION)
    build_graph(f"vision/{SIZE}", ckpt, root, resolve_images("builtin")[:2], **{"vision.sizes": [SIZE]})
    t = time.perf_counter()
    variants.smooth(root / "fp32", root / "reference.npz", root / "calib" / "calib.npz", root / "fp32-smooth",
                    TOL_FP32, run_settings(**{"quant.target": "npu"}).as_dict())
    seconds = time.perf_counter() - t
    rec = json.loads((root / "fp32-smooth" / "parity.json").read_text())["extra"]["graphs"]["model.onnx"]
    out = {"seed": seed, "planted": planted, "seconds": seconds, "blocks": rec["blocks"]}
    for wide in (False, True):
        a, b = all_ops_mse(root, "fp32", wide), all_ops_mse(root, "fp32-smooth", wide)
        out["a16" if wide else "a8"] = {"fp32": float(np.mean(a)), "smooth": float(np.mean(b)),
                                        "ratios": [y / x for x, y in zip(a, b)]}
    return out


def print_table(rows: list[dict]) -> None:
    print("| tower | blocks migrated (alpha) | all W8A8: fp32 | fp32-smooth | ratio (per image) | "
          "all W8A16: fp32 | fp32-smooth | ratio (per image) | smooth job s |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | --- | ---: |")
    for r in rows:
        name = f"planted, seed {r['seed']}" if r["planted"] else f"no outlier, seed {r['seed']}"
        moved = [f"{b['block']} ({b['alpha']})" for b in r["blocks"] if b["alpha"] is not None]
        cells = [name, f"{len(moved)} of {len(r['blocks'])}: " + (", ".join(moved) or "none")]
        for w in ("a8", "a16"):
            m = r[w]
            ratio = m["smooth"] / m["fp32"]
            cells += [f"{m['fp32']:.4g}", f"{m['smooth']:.4g}",
                      f"{ratio:.3f}x ({min(m['ratios']):.3f} .. {max(m['ratios']):.3f})"]
        cells.append(f"{r['seconds']:.1f}")
        print("| " + " | ".join(cells) + " |")
    print()
    print("MSE of the tower's output against the float graph, mean over the evaluation images; ratio: "
          "fp32-smooth / fp32 (below 1: migration helped).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[11, 5, 3, 7], help="towers with no planted outlier")
    ap.add_argument("--publish", action="store_true", help="write the table to docs/benchmarks/smooth-tiny.md")
    a = ap.parse_args()
    from _publish import published

    with published("smooth-tiny", "fp32-smooth: what per-block migration buys"), \
            tempfile.TemporaryDirectory(prefix="vlsens-smooth-") as d:
        rows = [tower(Path(d) / "planted", 11, True)]
        rows += [tower(Path(d) / f"seed{s}", s, False) for s in a.seeds]
        print_table(rows)


if __name__ == "__main__":
    main()
