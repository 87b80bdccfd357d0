#!/usr/bin/env python
"""The NPU profiles of a run side by side: per fixed-size graph and variant (fp32, fp32-smooth),
how many ops are W8A8, W8A16 and float, the share of the weights that stays 8-bit, the measured
value against the target and the engine's estimate, the per-case spread of the W8A16 pass, and
what the W8A16 pass of the sensitivity engine cost next to the W8A8 one.

Reads the records only (``profile/<graph>/<variant>/eval.json``, ``sensitivity/.../ort.json``,
``toolchain/<graph>/<variant>/toolchain.json``); run after ``goal: npu`` (``make scale-npu``
for the 3B tower at 448x448).

    python bench/npu_table.py results/3b [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def rows(model_dir: Path) -> list[dict]:
    out = []
    for ev_path in sorted(model_dir.glob("profile/*/*/*/eval.json")):
        rel = ev_path.parent.relative_to(model_dir / "profile")
        graph, variant = str(rel.parent), rel.name
        ev = json.loads(ev_path.read_text())
        if ev["settings"].get("target") not in ("npu", "qnn"):
            continue
        ort = _json(model_dir / "sensitivity" / graph / variant / "ort.json") or {}
        tool = _json(model_dir / "toolchain" / graph / variant / "toolchain.json") or {}
        metric = ev["target"]["metric"]
        out.append({
            "graph": graph, "variant": variant, "ops": ev["quantizable_ops"],
            "a8": ev.get("a8_ops", ev["int8_ops"]), "a16": ev.get("a16_ops", 0),
            "float": ev.get("float_ops", ev["quantizable_ops"] - ev["int8_ops"]),
            "w8": ev["int8_weight_share"], "metric": metric, "target": ev["target"]["value"],
            "measured": ev["measured"][metric], "estimate": (ev.get("estimate") or {}).get(metric),
            "status": ev["status"], "eval": ev["eval_images"],
            "cases": (ev.get("measured_per_case") or {}).get(metric) or [],
            "per_op_a8": ort.get("seconds_per_op"), "per_op_a16": (ort.get("wide") or {}).get("seconds_per_op"),
            "cost": (ort.get("wide") or {}).get("cost_vs_a8"),
            "all_a8": (ort.get("all_int8") or {}).get(metric),
            "all_a16": ((ort.get("wide") or {}).get("all_a16") or {}).get(metric),
            "rounding": ev["settings"].get("weight_rounding", "rtn"),
            # a toolchain folder made from an earlier profile of this graph says nothing about this one
            "stale": bool(tool) and (tool.get("ops") or {}).get("int8-a16") != ev.get("a16_ops", 0),
            "smooth": tool.get("smooth"), "pulsar2": len(tool.get("pulsar2") or []),
            "a16_tensors": (tool.get("qnn") or {}).get("a16_tensors"),
        })
    return out


def _g(x, p=6) -> str:
    return "-" if x is None else f"{x:.{p}g}"


def main(model_dir: Path) -> None:
    rs = rows(model_dir)
    if not rs:
        sys.exit(f"{model_dir}: no profile for quant.target npu / qnn (run goal npu)")
    print(f"NPU profiles of {model_dir} (target "
          f"{rs[0]['metric']} >= {rs[0]['target']:g} on {rs[0]['eval']} evaluation image(s))\n")
    print("| graph | variant | weight rounding | ops | W8A8 | W8A16 | float | weights 8-bit | measured | "
          "per case (min .. max) | estimate | all W8A8 | all W8A16 | status |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for r in rs:
        spread = f"{min(r['cases']):.6g} .. {max(r['cases']):.6g}" if r["cases"] else "-"
        print(f"| {r['graph']} | {r['variant']} | {r['rounding']} | {r['ops']} | {r['a8']} | "
              f"{r['a16']} ({r['a16'] / r['ops']:.1%}) | {r['float']} | {r['w8']:.1%} | {_g(r['measured'])} | {spread} | "
              f"{_g(r['estimate'])} | "
              f"{_g(r['all_a8'])} | {_g(r['all_a16'])} | {r['status']} |")
    print("\nThe sensitivity engine's two passes (the same session; seconds per op over the evaluation set):\n")
    print("| graph | variant | W8A8 s/op | W8A16 s/op | W8A16 / W8A8 |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rs:
        print(f"| {r['graph']} | {r['variant']} | {_g(r['per_op_a8'], 3)} | {_g(r['per_op_a16'], 3)} | "
              f"{_g(r['cost'], 3) + 'x' if r['cost'] is not None else '- (no 16-bit activations)'} |")
    for r in rs:
        if r["stale"]:
            print(f"\n{r['graph']} {r['variant']}: its toolchain folder was made from an earlier profile (another W8A16 "
                  "count); run its toolchain job again.")
    smooth = [r for r in rs if r["smooth"] and not r["stale"]]
    if smooth:
        print("\nWhat fp32-smooth bought against fp32 (toolchain.json: smooth):\n")
        print("| graph | W8A16 ops fp32 -> smooth | float ops fp32 -> smooth | W8A8 weight share gained |")
        print("| --- | --- | --- | ---: |")
        for r in smooth:
            s = r["smooth"]
            print(f"| {r['graph']} | {s['fp32']['a16_ops']} -> {s['fp32-smooth']['a16_ops']} | "
                  f"{s['fp32']['float_ops']} -> {s['fp32-smooth']['float_ops']} | {s['a8_weight_share_gained']:+.1%} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, help="results/<model>")
    ap.add_argument("--name", default=None, help="docs/benchmarks/<name>.md (default npu-<model>)")
    ap.add_argument("--publish", action="store_true", help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _publish import published

    with published(a.name or f"npu-{a.model_dir.resolve().name}", "NPU profiles: W8A8 / W8A16 / float per op"):
        main(a.model_dir)
