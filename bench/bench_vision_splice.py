#!/usr/bin/env python
"""Writing a vision graph to measure, at Qwen2.5-VL-3B widths: quantize_vision + wrap_vision, or a VisionSplice.

``budget_vision`` measures each vision Linear alone at INT4, and the mixed graphs along the curve,
by the part chain on a vision graph written for the purpose. It wrote each with
:func:`vlsens.precision.weight_only.quantize_vision` (the float graph loaded with its weights,
its Gemms rewritten, saved, the changed Linears quantized and the graph saved again) and
:func:`vlsens.deploy.genai.folder.wrap_vision` (the data file copied once more): 2.7 GB written
three times at 3B for one Linear. A :class:`vlsens.precision.weight_only.VisionSplice` writes the
wrapped float graph once; each variant is a graph file beside it whose float weights stay in its
data file and whose quantized nodes and tensors are taken from the run's all-INT4 and
all-INT8-weight-only graphs.

This bench builds the real 3B vision tower (32 blocks, the 3b preset's shapes, random weights; a
one-layer tiny text model beside it), exports its dynamic graph, quantizes every Linear at INT4
(``config/scale-int4.yaml``'s ``deploy.nbits``: RTN, blocks of 128) and at INT8 weight-only, and
writes three one-Linear graphs and one mixed graph (half the Linears INT4, the rest INT8) both
ways, each step in its own process (its seconds and peak memory). Both ways' graphs are checked
equal (every quantized tensor, and the features of one 224x224 image through ONNX Runtime).

    python bench/bench_vision_splice.py [--publish]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

#: The Linears written alone: the first block's qkv, the last block's down_proj, the merger's last.
PICKS = ("blocks.0/attn/qkv/", "blocks.31/mlp/down_proj/", "merger/mlp/mlp.2/")


def hwm_gb() -> float:
    """This process's peak resident memory (VmHWM: a forked child's starts at the parent's size)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _child(q, fn, args):
    t = time.perf_counter()
    out = fn(*args)
    q.put((time.perf_counter() - t, hwm_gb(), out))


def step(fn, *args):
    """``fn(*args)`` in a forked process: (seconds, peak GB, its result)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q, fn, args))
    p.start()
    out = q.get()
    p.join()
    if p.exitcode:
        raise SystemExit(f"{fn.__name__} failed ({p.exitcode})")
    return out


def export(work: Path) -> tuple[str, str]:
    from bench_dynamic import export as export_dynamic
    from bench_dynamic import vision_3b

    model, ckpt = export_dynamic("3b-vision", vision_3b(), work)
    return str(model), str(ckpt)


def quantize_all(fp32, dst, settings, fmt):
    from vlsens.precision.weight_only import FORMATS, quantize_vision

    quantize_vision(fp32, dst, settings, FORMATS[fmt])
    return str(dst)


def old_way(fp32, work, settings, per_op, preamble):
    """budget_vision's former write of one measured graph: quantize_vision, then wrap_vision."""
    from vlsens.core.onnxutil import model_bytes
    from vlsens.deploy.genai import folder as genai
    from vlsens.precision.weight_only import FORMATS, quantize_vision

    staged = Path(work) / "model.onnx"
    quantize_vision(fp32, staged, settings, per_op={op: FORMATS[f] if f else None for op, f in per_op.items()})
    vision = genai.wrap_vision(staged, Path(work) / "folder" / "vision.onnx", None, Path(work) / "pre", preamble)
    return str(vision), model_bytes(vision)


def base_graph(fp32, work, settings, vision_config_from):
    """The wrapped float graph a VisionSplice reads (written once a job)."""
    import shutil

    from transformers import AutoConfig

    from vlsens.deploy.genai import folder as genai
    from vlsens.precision.weight_only import linears, quantize_vision

    staged = Path(work) / "float" / "model.onnx"
    quantize_vision(fp32, staged, settings, per_op={o["name"]: None for o in linears(fp32)})
    vc = AutoConfig.from_pretrained(vision_config_from).vision_config
    out = genai.wrap_vision(staged, Path(work) / "spliced" / "vision.onnx", vc, Path(work) / "pre")
    shutil.rmtree(staged.parent)
    return str(out)


def splice_init(base, sources, settings):
    from vlsens.precision.weight_only import VisionSplice

    VisionSplice(base, sources, settings)


def splice_write(base, sources, settings, name, per_op):
    from vlsens.precision.weight_only import VisionSplice

    t = time.perf_counter()
    sp = VisionSplice(base, sources, settings)
    init = time.perf_counter() - t
    t = time.perf_counter()
    path, shipped = sp.write(name, per_op)
    return str(path), shipped, init, time.perf_counter() - t


def same(a, b, image):
    """Every MatMulNBits node's inputs, attributes and tensors equal, and the features of ``image``."""
    import numpy as np
    import onnx

    from vlsens.core.onnxutil import make_session, tensor_array

    def nodes(path):
        m = onnx.load(path, load_external_data=False)
        inits = {t.name: t for t in m.graph.initializer}
        return {n.name: (list(n.attribute), [np.asarray(tensor_array(inits[x], Path(path).parent))
                                             for x in n.input[1:] if x in inits])
                for n in m.graph.node if n.op_type == "MatMulNBits"}

    na, nb = nodes(a), nodes(b)
    equal = na.keys() == nb.keys() and all(na[k][0] == nb[k][0] and all(
        np.array_equal(x, y) for x, y in zip(na[k][1], nb[k][1], strict=True)) for k in na)
    feats = [make_session(p, threads=2).run(None, image)[0] for p in (a, b)]
    return equal, len(na), float(np.abs(feats[0] - feats[1]).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--publish", action="store_true")
    ap.parse_args()  # --publish: read by _publish.destination
    import shutil

    import numpy as np
    from _publish import published
    from transformers import AutoConfig

    from vlsens.precision.weight_only import linears
    from vlsens.quantize.nbits import NBitsSettings

    settings = NBitsSettings(algorithm="rtn", block_size=128, symmetric=True, accuracy_level=4)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-vision-splice-") as tmp:
        work = Path(tmp)
        s, gb, (fp32, ckpt) = step(export, work)
        print(f"exported the 3B vision tower's dynamic graph in {s:.0f} s (peak {gb:.1f} GB)", file=sys.stderr)
        sources = {}
        for fmt in ("int4", "int8-wo"):
            s, gb, sources[fmt] = step(quantize_all, fp32, work / fmt / "model.onnx", settings, fmt)
            print(f"{fmt}: every Linear in {s:.0f} s (peak {gb:.1f} GB)", file=sys.stderr)
        ops = [o["name"] for o in linears(fp32)]
        s_base, gb_base, base = step(base_graph, fp32, work / "base", settings, ckpt)
        s_init, gb_init, _ = step(splice_init, base, sources, settings)
        cases = [(p, {op: ("int4" if p in op else None) for op in ops}) for p in PICKS]  # one Linear at INT4
        half = set(ops[::2])
        cases.append((f"mixed: {len(half)} INT4, {len(ops) - len(half)} INT8",
                      {op: "int4" if op in half else "int8-wo" for op in ops}))
        grid = np.array([[1, 16, 16]], np.int64)  # one 224x224 image
        patch = AutoConfig.from_pretrained(ckpt).vision_config.patch_size
        for i, (label, per_op) in enumerate(cases):
            assert sum(f is not None for f in per_op.values()) == (1 if label in PICKS else len(ops)), label
            so, go, (old, old_bytes) = step(old_way, fp32, work / f"old{i}", settings, per_op, base)
            sn, gn, (new, shipped, init, write) = step(splice_write, base, sources, settings, f"v{i}", per_op)
            pixels = np.random.default_rng(i).standard_normal((int(grid.prod()), 3 * 2 * patch ** 2)).astype(np.float32)
            equal, nq, diff = same(old, new, {"pixel_values": pixels, "image_grid_thw": grid})
            rows.append((label, nq, so, go, sn, gn, write, old_bytes, shipped, equal, diff))
            shutil.rmtree(work / f"old{i}")
            Path(new).unlink()
            Path(new + ".data").unlink()
            print(f"{label}: {so:.1f} s / {sn:.2f} s", file=sys.stderr)
    with published("vision-splice-3b", "Writing a vision graph to measure, at Qwen2.5-VL-3B widths"):
        print(f"The 3b preset's vision tower (32 blocks, {len(ops)} Linears), its dynamic graph in FP32; the run's "
              f"INT4 graph: {settings.algorithm.upper()} in blocks of {settings.block_size}, the INT8 one weight-only "
              "per channel. Each way in its own process (seconds and peak resident memory of the process).")
        print()
        print(f"Once a job: the wrapped float graph written in {s_base:.0f} s (peak {gb_base:.1f} GB); a VisionSplice "
              f"opened (three graphs, no weights) in {s_init:.2f} s (peak {gb_init:.2f} GB).")
        print()
        print("| graph | quantized Linears | quantize_vision + wrap_vision s | peak GB | VisionSplice s (write) | "
              "peak GB | bytes as shipped, old | spliced | equal tensors | features max abs diff |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
        for label, nq, so, go, sn, gn, write, ob, sb, eq, diff in rows:
            print(f"| {label} | {nq} | {so:.1f} | {go:.1f} | {sn:.2f} ({write:.2f}) | {gn:.2f} | {ob} | {sb} | "
                  f"{'yes' if eq else 'NO'} | {diff:.3g} |")
        print()
        print("The VisionSplice column counts its process's whole work: opening the three graphs and writing the "
              "variant.")


if __name__ == "__main__":
    main()
