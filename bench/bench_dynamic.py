#!/usr/bin/env python
"""Memory and time of the dynamic vision graph per image size, up to 1344x1344, for the tiny
preset, a tower with Qwen2.5-VL-3B's vision widths (hidden 1280, 16 heads, MLP 3420; fewer
blocks, the last one full-attention) and the whole 3B tower (``--towers 3b``: 32 blocks, 669 M
parameters). Prints a table.

Each size runs in a fresh process that imports only numpy and ONNX Runtime (CPU, one image,
random pixels; the index inputs are computed beforehand): "RSS before run" is after session
creation, "peak RSS" the process's peak over the run. The analytic columns are what attention holds per block, fp32:
``full scores`` = N x N (one head of one full-attention block: the graph computes the heads one
after the other; transformers' eager attention holds all heads' heads x N x N at once) and the
additive block-diagonal mask N x N; ``window scores`` =
windows x heads x 64 x 64 (window blocks: linear in N, no N x N tensor).

    python bench/bench_dynamic.py                      # tiny + real widths, 224..1344
    python bench/bench_dynamic.py --towers tiny --sizes 224 1344
    python bench/bench_dynamic.py --towers 3b --sizes 448 1344
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
def status_mib(key):  # VmHWM, not ru_maxrss: ru_maxrss carries the parent's peak across exec
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
feeds = dict(np.load(sys.argv[2]))
so = ort.SessionOptions()
so.intra_op_num_threads = int(sys.argv[3])
t0 = time.perf_counter()
sess = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
before = status_mib("VmRSS")
out = sess.run(None, feeds)[0]
t2 = time.perf_counter()
print(json.dumps({"tokens": int(out.shape[0]), "session_s": t1 - t0, "run_s": t2 - t1, "rss_before_run_mib": before,
                  "peak_rss_mib": status_mib("VmHWM")}))
"""


def vision_3b() -> dict:
    """The whole Qwen2.5-VL-3B vision tower: 32 blocks, full attention in 7, 15, 23, 31."""
    from vlsens.model.presets.tables import REAL_3B_VISION

    return dict(REAL_3B_VISION, initializer_range=0.02)


def real_vision(depth: int) -> dict:
    return dict(depth=depth, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                fullatt_block_indexes=[depth - 1], initializer_range=0.02)


def export(tower: str, vision: dict | None, work: Path) -> tuple[Path, Path]:
    import torch

    from vlsens.core.onnxutil import resave
    from vlsens.export.towers.vision_dynamic import INPUTS, OUTPUT, dynamic_module, graph_inputs
    from vlsens.model.loading import load_model
    from vlsens.model.presets.build import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(work / tower / "ckpt", seed=0, vision=vision)
    model = load_model(ckpt, attn_implementation="eager")
    vc = model.config.vision_config
    grid = [[1, 16, 16], [1, 18, 22]]  # two images, partial windows: nothing specialises
    n = sum(t * h * w for t, h, w in grid)
    feeds = graph_inputs(torch.randn(n, 3 * 2 * vc.patch_size ** 2).numpy(), grid, vc)
    raw = work / tower / "raw" / "model.onnx"
    raw.parent.mkdir(parents=True)
    dyn = {"patches": {0: "p"}, "position_ids": {0: "p"}, "window_index": {0: "t"}, "cu_seqlens": {0: "i"},
           "cu_window_seqlens": {0: "w"}, OUTPUT: {0: "t"}}
    with torch.no_grad():
        torch.onnx.export(dynamic_module(model.model.visual), tuple(torch.from_numpy(feeds[k]) for k in INPUTS),
                          str(raw), dynamo=False, opset_version=19, input_names=list(INPUTS), output_names=[OUTPUT],
                          dynamic_axes=dyn)
    return resave(raw, work / tower / "model.onnx"), ckpt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--towers", nargs="+", default=["tiny", "real"], choices=["tiny", "real", "3b"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[224, 448, 672, 896, 1120, 1344])
    ap.add_argument("--real-depth", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vlsens-bench-dyn-"))
    rows = []
    for tower in a.towers:
        vision = {"tiny": None, "real": real_vision(a.real_depth), "3b": vision_3b()}[tower]
        model, ckpt = export(tower, vision, work)
        from transformers import AutoConfig

        vc = AutoConfig.from_pretrained(str(ckpt)).vision_config
        import numpy as np

        from vlsens.export.towers.vision_dynamic import graph_inputs

        for size in a.sizes:
            g = size // vc.patch_size
            patches = np.random.default_rng(0).normal(size=(g * g, 3 * 2 * vc.patch_size ** 2)).astype(np.float32)
            feeds = graph_inputs(patches, np.array([[1, g, g]]), vc)
            np.savez(work / "feeds.npz", **feeds)
            r = subprocess.run([sys.executable, "-c", CHILD, str(model), str(work / "feeds.npz"), str(a.threads)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                rows.append({"tower": tower, "size": size, "error": r.stderr.strip().splitlines()[-1][:80]})
                continue
            m = json.loads(r.stdout.strip().splitlines()[-1])
            m.update(patches=g * g, windows=len(feeds["cu_window_seqlens"]) - 1)
            n, heads = m["patches"], vc.num_heads
            m.update(tower=tower, size=size, hidden=vc.hidden_size, heads=heads, depth=vc.depth,
                     full_scores_mib=n * n * 4 / 2**20, mask_mib=n * n * 4 / 2**20,
                     window_scores_mib=m["windows"] * heads * 64 * 64 * 4 / 2**20)
            rows.append(m)
            print(json.dumps(m), file=sys.stderr)
    print(f"\ndynamic vision graph, one image, ONNX Runtime CPU, {a.threads} threads, fp32 (full attention one head at a time)")
    head = (f"{'tower':<5} {'size':>9} {'patches':>7} {'windows':>7} {'1-head scores MiB':>17} {'mask MiB':>8} "
            f"{'window scores MiB':>17} {'RSS before run':>14} {'peak RSS MiB':>12} {'run s':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['tower']:<5} {r['size']:>4}x{r['size']:<4} failed: {r['error']}")
            continue
        print(f"{r['tower']:<5} {r['size']:>4}x{r['size']:<4} {r['patches']:>7} {r['windows']:>7} "
              f"{r['full_scores_mib']:>17.0f} {r['mask_mib']:>8.0f} {r['window_scores_mib']:>17.1f} "
              f"{r['rss_before_run_mib']:>14.0f} {r['peak_rss_mib']:>12.0f} {r['run_s']:>7.2f}")
    print(f"\ntowers: tiny = the preset (hidden 64, 4 heads, 4 blocks); real = hidden 1280, 16 heads, MLP 3420, "
          f"{a.real_depth} blocks (last full-attention), random weights.\nwork dir: {work}")


if __name__ == "__main__":
    from _publish import named, published

    with published(named("dynamic"), "The dynamic vision graph: time and memory by size"):
        main()
