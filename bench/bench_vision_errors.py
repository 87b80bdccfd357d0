#!/usr/bin/env python
"""The vision Linears' estimate at real widths: the float pass that takes every Linear's INT4
output error (:class:`vlsens.budget.vision.ErrorHooks`) on the Qwen2.5-VL-3B vision tower (the 3b
preset's random bfloat16 weights, loaded in float32 as the job loads them), its time per image
against the tower's plain forward, and the process's peak memory.

The images are the measure's default sizes in turn (``deploy.measure.sizes``: 224x224, 168x280,
280x168, 112x336; random pixel values: the cost does not depend on them), as many as the default
run's cases show (12 distinct). Each Linear's INT4 weight is symmetric round-to-nearest in blocks
of 128 (``config/scale-int4.yaml``'s ``deploy.nbits``), computed here in torch: the pass's cost
depends on the shapes only.

    python bench/bench_vision_errors.py [--checkpoint DIR] [--images 12] [--repeats 3] [--publish]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

SIZES = ((224, 224), (168, 280), (280, 168), (112, 336))


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def rtn4(w, block: int = 128):
    """Symmetric 4-bit round-to-nearest of ``w`` (N, K) in blocks of ``block`` inputs, as (K, N)."""
    import torch

    n, k = w.shape
    pad = (-k) % block
    x = torch.nn.functional.pad(w, (0, pad)).reshape(n, -1, block)
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7
    q = (x / scale).round().clamp(-8, 7) * scale
    return q.reshape(n, -1)[:, :k].T.contiguous().numpy()


def images(count: int, patch: int, merge: int, channels: int = 3, temporal: int = 2):
    rng = np.random.default_rng(0)
    for i in range(count):
        h, w = SIZES[i % len(SIZES)]
        grid = np.array([[1, h // patch, w // patch]], np.int64)
        pixels = rng.standard_normal((int(grid.prod()), channels * temporal * patch * patch)).astype(np.float32)
        yield f"{h}x{w}", pixels, grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, help="an existing 3b-preset checkpoint (else built, 1 text layer)")
    ap.add_argument("--images", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3, help="passes of each kind per image (the fastest counts)")
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    import torch
    from _publish import published

    from vlsens.budget.vision import ErrorHooks
    from vlsens.model.loading import VISION_PART, load_model

    with tempfile.TemporaryDirectory(prefix="bench-vision-errors-") as work:
        ckpt = args.checkpoint
        if ckpt is None:
            from vlsens.model.presets.build import build_3b_checkpoint

            ckpt = build_3b_checkpoint(Path(work) / "ckpt", seed=0, text_layers=1)
        t = time.perf_counter()
        model = load_model(ckpt, attn_implementation="eager", part=VISION_PART)
        load_s, load_gb = time.perf_counter() - t, peak_gb()
        cfg = model.config.vision_config
        linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".visual." in f".{n}"}
        params = sum(p.numel() for n, p in model.named_parameters() if "visual" in n)
        feeds = list(images(args.images, cfg.patch_size, cfg.spatial_merge_size))
        plain: list[list[float]] = []
        for _, pixels, grid in feeds:  # the tower alone, before any hook is on it
            plain.append([])
            for _ in range(args.repeats):
                t = time.perf_counter()
                with torch.no_grad():
                    model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid), return_dict=True)
                plain[-1].append(time.perf_counter() - t)
        t = time.perf_counter()
        hooks = ErrorHooks(model, ((n, rtn4(m.weight.detach())) for n, m in linears.items()),
                           {n: f"{n}.weight" for n in linears}, "rtn4")
        setup_s = time.perf_counter() - t
        rows = []
        for i, (size, pixels, grid) in enumerate(feeds):
            hooked = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                errs = hooks(pixels, grid)
                hooked.append(time.perf_counter() - t)
            rows.append((size, int(grid.prod()), min(plain[i]), min(hooked), len(errs)))
        hooks.close()
        with published("vision-errors-3b", "The vision Linears' estimate pass at Qwen2.5-VL-3B widths"):
            print(f"The 3b preset's vision tower: {params / 1e6:.0f} M parameters, {len(linears)} Linears; "
                  f"{torch.get_num_threads()} threads. Loaded in float32 in {load_s:.0f} s (peak {load_gb:.1f} GB); "
                  f"the {len(linears)} weight changes made in {setup_s:.0f} s.")
            print()
            print(f"Per image the fastest of {args.repeats} passes of each kind: every plain pass first, then the "
                  "hooks put on the tower and every hooked pass (a hook stays on the tower once there).")
            print()
            print("| image | patches | plain forward s | forward with the error hooks s | ratio | Linears |")
            print("| --- | ---: | ---: | ---: | ---: | ---: |")
            for size, n, plain, hooked, count in rows:
                print(f"| {size} | {n} | {plain:.2f} | {hooked:.2f} | {hooked / plain:.2f}x | {count} |")
            total_plain, total = sum(r[2] for r in rows), sum(r[3] for r in rows)
            print(f"| all {len(rows)} | {sum(r[1] for r in rows)} | {total_plain:.1f} | {total:.1f} | "
                  f"{total / total_plain:.2f}x | |")
            print()
            print(f"Peak memory of the process: {peak_gb():.1f} GB (the float32 tower {params * 4 / 1e9:.1f} GB, "
                  f"its weight changes about as much again).")


if __name__ == "__main__":
    main()
