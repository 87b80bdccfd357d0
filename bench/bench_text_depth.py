#!/usr/bin/env python
"""The text LM at real depth: Qwen2.5-VL-3B's 36 decoder layers (3.09 B parameters, 12.4 GB in
float32) through reference, export, FP16 and both parity gates, one step per process, with each
step's peak memory. Prints a table.

It runs the text tower's own code on its ``model.onnx`` graph (``input_ids`` -> logits; the
tower's ``embeds.onnx`` carries the same weights and costs the same): transformers' logits on the
builtin prompts (left padded, two lengths) are the reference; the export (``--exporter``) is
gated against them in FP32, then converted to FP16 (:func:`vlsens.variants.float16.convert_fp16`, range
analysis on the parity inputs) and gated in FP16.

Peak memory is the process's ``VmHWM`` (``/proc/self/status``): the high-water mark of resident
memory, what the OOM killer weighs.

    python bench/bench_text_depth.py                          # builds the 3b preset, 36 layers
    python bench/bench_text_depth.py --layers 2 --exporter legacy
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

TOL = {"fp32": {"min_cosine": 0.99999, "max_rel_error": 1e-4}, "fp16": {"min_cosine": 0.999, "max_rel_error": 2e-2}}


def vm_hwm_gb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


def step(name: str, work: Path, args: argparse.Namespace) -> dict:
    """One step, in this process (called through ``--step``)."""
    from vlsens.data.cases import Cases
    from vlsens.export import parity

    ckpt = work / "ckpt"
    t0 = time.perf_counter()
    facts: dict = {}
    if name == "checkpoint":
        from vlsens.model.presets.build import build_3b_checkpoint

        build_3b_checkpoint(ckpt, seed=0, text_layers=args.layers)
    elif name == "reference":
        from vlsens.data.prompts import BUILTIN_PROMPTS
        from vlsens.export.towers.text import compute_text_reference

        cases = compute_text_reference(ckpt, [], BUILTIN_PROMPTS, [1, 2])
        cases.save(work / "reference.npz")
    elif name == "export":
        import torch

        from vlsens.core.onnxutil import check_model, resave
        from vlsens.export.towers.text import GRAPHS, _export_one, _wrappers
        from vlsens.model.loading import load_model

        cases = Cases.load(work / "reference.npz")
        model = load_model(ckpt, attn_implementation="eager", part="text")
        module = _wrappers(model)["model.onnx"]
        example = tuple(torch.from_numpy(cases.for_graph("model.onnx")[0].inputs[k]) for k in GRAPHS["model.onnx"])
        raw = work / "raw" / "model.onnx"
        _export_one(module, example, GRAPHS["model.onnx"], raw, args.exporter, 19)
        del model, module
        resave(raw, work / "fp32" / "model.onnx")
        for p in raw.parent.iterdir():
            p.unlink()
        check_model(work / "fp32" / "model.onnx")
    elif name in ("gate-fp32", "gate-fp16"):
        variant = name.split("-")[1]
        cases = Cases.load(work / "reference.npz")
        rec = parity.check({"model.onnx": work / variant / "model.onnx"}, cases, TOL[variant], variant, args.threads,
                           "cpu", artifact=work / variant)
        facts = {"min_cosine": min(p["cosine"] for p in rec["per_input"]),
                 "max_rel_error": max(p["max_rel_error"] for p in rec["per_input"]), "passed": rec["passed"]}
    elif name == "fp16":
        from vlsens.variants.float16 import convert_fp16

        cases = Cases.load(work / "reference.npz")
        out = work / "fp16" / "model.onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        f = convert_fp16(work / "fp32" / "model.onnx", cases.feeds("model.onnx"), out, 512, threads=args.threads)
        facts = {"fp32_islands": f["fp32_islands"]["nodes"], "fp32_fallback": len(f["fp32_fallback"])}
    else:
        raise ValueError(name)
    return {"step": name, "s": time.perf_counter() - t0, "peak_gb": vm_hwm_gb(), **facts}


STEPS = ["checkpoint", "reference", "export", "gate-fp32", "fp16", "gate-fp16"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--exporter", default="dynamo", choices=["dynamo", "legacy"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--checkpoint", help="an existing 3b-preset checkpoint (skips building it)")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vlsens-bench-text-"))
    if a.step:
        print(json.dumps(step(a.step, work, a)))
        return
    work.mkdir(parents=True, exist_ok=True)
    steps = list(STEPS)
    if a.checkpoint:
        (work / "ckpt").unlink(missing_ok=True)
        (work / "ckpt").symlink_to(Path(a.checkpoint).resolve())
        steps.remove("checkpoint")
    rows = []
    for s in steps:
        r = subprocess.run([sys.executable, __file__, "--step", s, "--workdir", str(work), "--layers", str(a.layers),
                            "--exporter", a.exporter, "--threads", str(a.threads)], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            rows.append({"step": s, "failed": f"exit {r.returncode}"})
            break
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(rows[-1], file=sys.stderr)
    fp32 = (work / "fp32" / "model.onnx.data")
    size = fp32.stat().st_size / 1e9 if fp32.is_file() else float("nan")
    print(f"\ntext LM, {a.layers} layers (Qwen2.5-VL-3B widths), exporter {a.exporter}, graph model.onnx "
          f"({size:.2f} GB of float32 weights), {a.threads} threads")
    print("| step | s | peak GB | notes |")
    print("| --- | ---: | ---: | --- |")
    for r in rows:
        notes = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("step", "s", "peak_gb"))
        print(f"| {r['step']} | {r.get('s', float('nan')):.0f} | {r.get('peak_gb', float('nan')):.2f} | {notes} |")
    print(f"work dir: {work}")


if __name__ == "__main__":
    from _publish import published

    with published("text-depth", "The text LM by depth: export memory and time"):
        main()
