#!/usr/bin/env python
"""A plan's decoder built from the engine's quantized MatMuls, at real widths.

``budget_nbits``' engine quantizes every decoder MatMul to INT4 and to INT8 once (its all-INT4 and
all-INT8 models); each plan folder then builds its decoder, every MatMul at the plan's width. With
the engine's models as a :class:`vlsens.quantize.nbits.Reuse`, the build takes a data-free
MatMul's node and tensors from them instead of quantizing it again. This bench quantizes a
finished run's fp32 decoder (default: ``make scale``'s 2-layer Qwen2.5-VL-3B, ``results/3b``) to
all-INT4 and all-INT8 as the engine does, then builds one mixed plan (a third of the MatMuls
INT4, a third INT8, a third float, lm_head INT8) afresh and from those models, each build in its
own process (its own peak memory), per algorithm, and prints the times, the peaks and whether the
two builds' files are equal byte for byte.

    python bench/bench_plan_build.py [--results results/3b] [--algorithms k_quant rtn] [--publish]
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
sys.path.insert(0, str(REPO / "bench"))

from bench_decoder_errors import peak_gb, timed  # noqa: E402

STEPS = ("engine", "fresh", "taken")


def settings_of(algorithm: str, block_size: int):
    from vlsens.quantize.nbits import NBitsSettings

    return NBitsSettings(algorithm=algorithm, block_size=block_size, symmetric=True, accuracy_level=4)


def plan_of(model: Path, settings):
    """A third of the MatMuls INT4, a third INT8, a third float (by position), lm_head INT8."""
    from vlsens.budget.plan import Plan
    from vlsens.quantize.nbits import weight_matmuls

    ops = [o["name"] for o in weight_matmuls(model)]
    decoder = {n: (4, 8, 0)[i % 3] for i, n in enumerate(ops)}
    decoder[ops[-1]] = 8
    return Plan("bench", "fp16", "fp32", decoder, settings.as_dict())


def one_step(model: Path, work: Path, step: str, algorithm: str, block_size: int, threads: int) -> dict:
    """One step in a process of its own: the engine's two models, or the plan built afresh or taken."""
    from vlsens.budget.plan import build_decoder
    from vlsens.quantize.nbits import BITS, Reuse, quantize, weight_matmuls

    s = settings_of(algorithm, block_size)
    engine = work / "engine"
    if step == "engine":
        engine.mkdir(parents=True, exist_ok=True)
        names = [o["name"] for o in weight_matmuls(model)]
        _, t = timed(lambda: [quantize(model, engine / f"q{b}.onnx", dict.fromkeys(names, b), s, threads=threads)
                              for b in BITS])
        return {"seconds": t, "peak_gb": peak_gb()}
    reuse = None
    if step == "taken":
        weights = {o["name"]: o["weight"] for o in weight_matmuls(model)}
        reuse = Reuse({b: engine / f"q{b}.onnx" for b in BITS}, s, {}, weights)
    (work / step).mkdir(parents=True, exist_ok=True)
    facts, t = timed(lambda: build_decoder(plan_of(model, s), model, work / step / "model.onnx", threads=threads,
                                           reuse=reuse))
    return {"seconds": t, "peak_gb": peak_gb(), "bits": facts["bits"], "weight_bytes": facts["weight_bytes"]}


def same_files(a: Path, b: Path) -> bool:
    """Whether the two builds' graphs and data files are equal byte for byte."""
    import filecmp

    from vlsens.core.onnxutil import data_path

    return all(filecmp.cmp(a / f, b / f, shallow=False) for f in ("model.onnx", data_path(Path("model.onnx")).name))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/3b"))
    ap.add_argument("--algorithms", nargs="+", default=["k_quant", "rtn"])
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    ap.add_argument("--algorithm", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    model = args.results / "decoder" / "fp32" / "model.onnx"
    if args.step:
        print(json.dumps(one_step(model, args.work, args.step, args.algorithm, args.block_size, args.threads)))
        return
    from _publish import published

    from vlsens.quantize.nbits import weight_matmuls

    ops = weight_matmuls(model)
    weights = sum(o["K"] * o["N"] for o in ops)
    plan = plan_of(model, settings_of(args.algorithms[0], args.block_size))
    counts = {b: sum(1 for v in plan.decoder.values() if v == b) for b in (4, 8, 0)}
    rows = []
    for algo in args.algorithms:
        with tempfile.TemporaryDirectory(prefix="vlsens-plan-build-", dir=args.results) as work:
            got = {}
            for step in STEPS:
                cmd = [sys.executable, __file__, "--results", str(args.results), "--step", step, "--algorithm", algo,
                       "--work", work, "--block-size", str(args.block_size), "--threads", str(args.threads)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                got[step] = json.loads(out.strip().splitlines()[-1])
            same = same_files(Path(work) / "fresh", Path(work) / "taken")
        rows.append((algo, got, same))
    with published("plan-build-" + args.results.name, f"A plan's decoder from the engine's quantized MatMuls, {args.results}",
                   results=args.results):
        print(f"{model}: {len(ops)} weight MatMuls, {weights / 1e9:.3f} G weights; the plan: {counts[4]} INT4, "
              f"{counts[8]} INT8 (lm_head among them), {counts[0]} float; blocks of {args.block_size}, symmetric, "
              f"accuracy level 4; each step in a process of its own, {args.threads} threads.\n")
        print("| algorithm | engine: all-INT4 + all-INT8 s (once per run) | plan afresh s | peak GB | plan from the "
              "engine's s | peak GB | afresh / taken | files equal |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for algo, got, same in rows:
            e, f, t = got["engine"], got["fresh"], got["taken"]
            print(f"| {algo} | {e['seconds']:.1f} | {f['seconds']:.1f} | {f['peak_gb']:.2f} | {t['seconds']:.1f} | "
                  f"{t['peak_gb']:.2f} | {f['seconds'] / t['seconds']:.1f}x | {'yes' if same else 'NO'} |")
        print("\nAfresh, a build quantizes every quantized MatMul of the plan again; from the engine's models it reads "
              "their nodes and tensors and writes the graph and its data file. Both scale with the weights: at 36 "
              f"layers (3.09 G weights) about {3.09e9 / weights:.1f}x these times.")


if __name__ == "__main__":
    main()
