#!/usr/bin/env python
"""The per-stage table of a real-size run (``make scale``): seconds, peak RSS and model bytes of
every job, from Snakemake's ``benchmark:`` files, each checked against its memory budget.

Budget of a job: ``2 x W + A``, where

* ``W`` is the float32 size of the weights the job handles: the graph's ``fp32/model.onnx.data``
  (the vision tower: 4 bytes x 669 M parameters = 2.67 GB for Qwen2.5-VL-3B at any image size;
  the text LM: 4 bytes x its parameters; the decoder: its two graph files, the builder's decoder
  and the embedding table), and for the jobs that run transformers' multimodal forward (text and
  decoder reference and calibration) the vision tower's weights on top; a deploy folder's job
  runs the whole model twice over (transformers' ``generate`` and onnxruntime-genai on the
  folder), so its ``W`` is the vision tower + the decoder;
* ``A`` is the activations of one forward plus the interpreter: ``--activations`` GB (default 1.5;
  bench/bench_dynamic.py measures one 448x448 forward of the whole 3B vision tower below that).

A ``parts-<variant>`` job (vision.parts) may peak at ``4 x P + A`` where that is more, ``P`` its
largest part: onnxsim's Python API holds the part, its simplified copy and its own session
(measured at 3B 448x448: a 1.98 GB part, 9.4 GB peak).

Exits 1 when a job is over its budget, so ``make scale`` fails loudly.

    python bench/scale_table.py results/3b
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

GB = 1e9


def read_tsv(path: Path) -> dict:
    rows = list(csv.DictReader(path.open(), delimiter="\t"))
    last = rows[-1]
    return {"s": float(last["s"]), "rss_mb": float(last["max_rss"])}


def weights(results: Path, graph: str) -> float:
    """Float32 bytes of the graph's weights (its fp32 model's data file; the decoder: both files)."""
    files = ("model.onnx.data", "embedding.onnx.data") if graph == "decoder" else ("model.onnx.data",)
    return sum((results / graph / "fp32" / f).stat().st_size for f in files
               if (results / graph / "fp32" / f).is_file())


def largest_part(results: Path, graph: str, stage: str) -> float:
    """Bytes of the largest part a ``parts-<variant>`` job wrote (0 for other jobs)."""
    import json

    m = re.fullmatch(r"parts-(.+)", stage)
    rec = results / "parts" / graph / m.group(1) / "parts.json" if m else None
    if rec is None or not rec.is_file():
        return 0.0
    return float(max(p["bytes"] for p in json.loads(rec.read_text())["parts"]))


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="results/<model>")
    ap.add_argument("--activations", type=float, default=1.5, help="A of the budget, GB")
    ap.add_argument("--machine-gb", type=float, default=24 * 2**30 / GB,
                    help="no job may peak above the machine's memory (default 24 GiB), whatever its budget")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    return ap.parse_args()


def main(a: argparse.Namespace) -> None:
    bench = a.results / "benchmarks"
    vision_graphs = sorted({str(p.parent.relative_to(bench)) for p in bench.glob("vision/*/*.tsv")})
    vision_w = max((weights(a.results, g) for g in vision_graphs), default=0.0)
    rows, over = [], []
    for tsv in sorted(bench.rglob("*.tsv")):
        rel = tsv.relative_to(bench)
        graph = str(rel.parent) if str(rel.parent) != "." else "-"
        stage = rel.stem
        m = read_tsv(tsv)
        if graph == "-":
            w = 0.0
        elif graph == "deploy":
            w = vision_w + weights(a.results, "decoder")
        else:
            w = weights(a.results, graph)
            if graph in ("text", "decoder") and re.match(r"(reference|calibration)$", stage):
                w += vision_w  # the multimodal forward runs the vision tower too
        budget = min(2 * w + a.activations * GB, a.machine_gb * GB) if w else a.machine_gb * GB
        part = largest_part(a.results, graph, stage)
        if part:  # onnxsim's Python API holds a part, its simplified copy and its own session
            budget = min(max(budget, 4 * part + a.activations * GB), a.machine_gb * GB)
        ok = m["rss_mb"] * 1e6 <= budget
        rows.append((graph, stage, m["s"], m["rss_mb"] / 1e3, w / GB, budget / GB, ok))
        if not ok:
            over.append(f"{graph} {stage}")
    print(f"| graph | stage | s | peak RSS GB | model GB (fp32 W) | budget GB (2W + {a.activations:g}, at most "
          f"{a.machine_gb:.1f}) | within |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for g, st, s, rss, w, b, ok in rows:
        print(f"| {g} | {st} | {s:.0f} | {rss:.2f} | {w:.2f} | {b:.2f} | "
              f"{'yes' if ok else '**no**'} |")
    total = sum(r[2] for r in rows)
    print(f"\n{len(rows)} jobs, {total / 60:.1f} min of job time, highest peak {max(r[3] for r in rows):.2f} GB")
    if over:
        print(f"over budget: {', '.join(over)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    from _publish import published

    # results/3b: make scale's table; another model (make scale-int4's 3b-full) publishes its own
    args = parse()
    name = args.results.name
    with published("scale" if name == "3b" else f"scale-{name}", f"every stage of results/{name}"):
        main(args)
