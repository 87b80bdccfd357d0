#!/usr/bin/env python
"""Per-op algorithms (``plan.algorithms``) against one algorithm for every MatMul, at the same
assignment: on a finished run with ``plan.algorithms``, every plan that names per-op algorithms
is built twice -- as it is, and with every MatMul by ``deploy.nbits.algorithm`` -- and both
decoders are measured on the measure's cases; the ratio of mean KLs per generated step with its
paired bootstrap interval (all prompts and image prompts), and both decoders' bytes. Prints a table.

    python bench/bench_algorithms.py --results results/held-out-alg
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="results/<model> of a run with plan.algorithms")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    from dataclasses import replace

    from vlsens.budget.plan import Plan, build_decoder
    from vlsens.core.onnxutil import model_bytes
    from vlsens.deploy.genai.chain import chain_kl
    from vlsens.deploy.measure import paired
    from vlsens.deploy.peers import pair_cell

    root = Path(a.results)
    summary = json.loads((root / "budget" / "nbits.json").read_text())
    if not summary.get("algorithms"):
        sys.exit(f"{root}: budget/nbits.json records no per-op algorithms (plan.algorithms was empty)")
    choice = summary["algorithms"]
    default = choice["candidates"][0]
    print(f"candidates {choice['candidates']}; of {summary['ops']} MatMuls, "
          + ", ".join(f"{len(choice['chosen'].get(w, {}))} at {w} bits" for w in ("4", "8"))
          + f" cost least alone under another algorithm than {default}\n")
    fp32 = root / "decoder" / "fp32" / "model.onnx"
    feeds, reference = root / "budget" / "decoder.npz", root / "measure" / "reference.npz"
    calib = root / "calib" / "decoder" / "calib.npz"  # what a data-aware algorithm (gptq) was chosen on
    image = lambda rows: [r for r in rows if r["modality"] != "text"]  # noqa: E731
    others = [c for c in choice["candidates"] if c != default]
    print(f"| plan | INT4 / INT8 / float | per-op: ops not {default} | MB per-op | MB all {default} | KL per-op | "
          f"KL all {default} | per-op / all {default}, all prompts | image prompts | "
          + " | ".join(f"KL all {c} | per-op / all {c}" for c in others) + " |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |" + " ---: | --- |" * len(others))
    from vlsens.core.fsutil import file_sha256
    from vlsens.quantize.nbits import data_aware

    with tempfile.TemporaryDirectory(prefix="vlsens-algorithms-") as work:
        for f in sorted((root / "budget" / "plans").glob("*.yaml"), key=lambda f: (len(f.stem), f.stem)):
            plan = Plan.load(f)
            if not plan.algorithms:
                continue
            every = {c: replace(plan, algorithms={n: c for n, b in plan.decoder.items() if b},
                                calibration=file_sha256(calib) if data_aware([c]) else "") for c in others}
            built = {}
            for tag, p in (("per-op", plan), ("one", replace(plan, algorithms={}, calibration="")), *every.items()):
                out = Path(work) / f"{plan.name}-{tag}" / "model.onnx"
                out.parent.mkdir()
                build_decoder(p, fp32, out, calib)
                built[tag] = (model_bytes(out), chain_kl(out, feeds, reference))
            (b1, r1), (b0, r0) = built["per-op"], built["one"]
            kl = lambda rows: sum(r["kl"] for r in rows) / len(rows)  # noqa: E731
            s = plan.bits_summary()
            print(f"| {plan.name} | {s['int4']} / {s['int8']} / {s['float']} | {len(plan.algorithms)} | {b1 / 1e6:.4f} | "
                  f"{b0 / 1e6:.4f} | {kl(r1):.3g} | {kl(r0):.3g} | {pair_cell(paired(r1, r0), wins=False)} | "
                  f"{pair_cell(paired(image(r1), image(r0)), wins=False)} | "
                  + " | ".join(f"{kl(built[c][1]):.3g} | {pair_cell(paired(r1, built[c][1]), wins=False)}" for c in others)
                  + " |")
    print(f"\nThe decoder alone (the fp32 folder's vision graph and table), the same plan built again: its "
          f"MatMuls by the algorithms the run chose, all by {default}, and all by each other candidate; "
          "KL per generated step against the fp32 folder through the ONNX Runtime chain the search uses "
          "(equal to onnxruntime-genai's measure, "
          "tests/test_chain.py), on the measure's cases; ratios with the 95 % paired bootstrap interval over the "
          "cases, resampled within each modality. MB: the decoder graph and its data file.")


if __name__ == "__main__":
    from _publish import published

    name = Path(sys.argv[sys.argv.index("--results") + 1]).name if "--results" in sys.argv else "run"
    with published(f"algorithms-{name}", "Per-op algorithms against one algorithm for every MatMul"):
        main()
