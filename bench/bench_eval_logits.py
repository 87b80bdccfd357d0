#!/usr/bin/env python
"""A folder's evaluation with the fp32 folder's logits computed once, or the fp32 folder run again.

Every deploy and plan folder but fp32 is evaluated on the three evaluation cases (text, one
image, two images) against the fp32 folder's logits teacher-forced on its tokens
(:func:`vlsens.deploy.genai.evaluate.evaluate`). Those logits were computed again for every
folder; the rule ``eval_logits`` computes them once a run
(:func:`~vlsens.deploy.genai.evaluate.write_eval_logits`) and the evaluations read them.

This bench times, on a finished run (default ``make scale-int4``'s 36-layer ``results/3b-full``),
the logits' job and one folder's evaluation both ways, and checks the two records' KL and top-1
per case are equal.

    python bench/bench_eval_logits.py [--results results/3b-full] [--folder int4-rtn] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from bench_decoder_errors import peak_gb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/3b-full"))
    ap.add_argument("--folder", default="int4-rtn")
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    from _publish import published

    from vlsens.data.inputs import checkpoint_dir, image_refs
    from vlsens.deploy.genai.evaluate import Checks, eval_cases, evaluate, write_eval_logits

    fp32, folder = args.results / "deploy" / "fp32", args.results / "deploy" / args.folder
    images = image_refs(args.results / "inputs" / "parity_images.json")
    fp32_eval = json.loads((fp32 / "eval.json").read_text())
    rows = {}
    with tempfile.TemporaryDirectory(prefix="vlsens-eval-logits-", dir=args.results) as work:
        work = Path(work)
        t0 = time.perf_counter()
        write_eval_logits(fp32, images, work / "eval-logits.npz")
        once = time.perf_counter() - t0
        for way, logits in (("the fp32 folder run again", None), ("the fp32 logits read", work / "eval-logits.npz")):
            t0 = time.perf_counter()
            checks = Checks(fp32_eval["max_new_tokens"], None, fp32_folder=fp32, fp32_logits=logits)
            rec = evaluate(folder, args.folder, checkpoint_dir(args.results / "checkpoint"),
                           eval_cases(images, work / "cases"), checks, fp32_eval)
            rows[way] = {"seconds": time.perf_counter() - t0, "cases": rec["cases"]}
    a, b = (rows[w]["cases"] for w in rows)
    same = [(r["case"], r["mean_kl"], r["max_kl"], r["top1_agreement"]) for r in a] == \
        [(r["case"], r["mean_kl"], r["max_kl"], r["top1_agreement"]) for r in b]
    with published(f"eval-logits-{args.results.name}", "A folder's evaluation: the fp32 logits once, or per folder",
                   results=args.results):
        print(f"{args.results}: the {args.folder} folder's evaluation on the {len(a)} evaluation cases "
              f"({fp32_eval['max_new_tokens']} tokens); one process, peak {peak_gb():.2f} GB.\n")
        print("| step | seconds |")
        print("| --- | ---: |")
        print(f"| the fp32 folder's logits on the cases, once a run (rule eval_logits) | {once:.1f} |")
        for way, r in rows.items():
            print(f"| {args.folder}'s evaluation, {way} | {r['seconds']:.1f} |")
        print(f"\n- KL (mean, max) and top-1 per case {'identical' if same else 'DIFFERENT'} both ways; "
              f"{rows['the fp32 folder run again']['seconds'] - rows['the fp32 logits read']['seconds']:.1f} s saved "
              "per folder evaluated.")


if __name__ == "__main__":
    main()
