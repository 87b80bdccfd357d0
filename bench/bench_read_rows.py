#!/usr/bin/env python
"""Engine nbits with the logits only where they are read, at real widths.

On the measure's cases (``budget_nbits``' evaluation set: each case's prompt and its reference
tokens in one prefill, KL read at the answer's steps only), the engine's switch model computes
lm_head at the read positions alone (:func:`vlsens.sensitivity.nbits.gather_read_rows`). This
bench prepares the engine on a finished run's fp32 folder and measure (default: ``make scale``'s
2-layer Qwen2.5-VL-3B, ``results/3b``) twice, with lm_head at every position and at the read
ones, each in its own process (its own peak memory), and prints per mode: the engine's price of
every MatMul at INT4 and INT8, whole forwards all float and all INT4, the reference's bytes, the
peak; then whether both modes' ``nbits.csv`` agree, and lm_head's cost per unread position.

    python bench/bench_read_rows.py [--results results/3b] [--publish]
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

MODES = ("every position", "read positions")


def feeds(results: Path, work: Path) -> dict:
    """The measure's cases as the decoder's evaluation set, as ``budget_nbits`` makes it."""
    from vlsens.data.inputs import checkpoint_dir
    from vlsens.deploy.cases import load_cases
    from vlsens.deploy.genai.chain import decoder_feeds

    m = results / "measure"
    return decoder_feeds(results / "deploy" / "fp32", m / "reference.npz", load_cases(m / "cases"),
                         checkpoint_dir(results / "checkpoint"), work / "feeds.npz")


def one_mode(results: Path, work: Path, mode: str, threads: int) -> dict:
    """Prepare, price and time the engine in one mode (run in a process of its own)."""
    from vlsens.data.samples import Samples
    from vlsens.quantize.nbits import NBitsSettings
    from vlsens.sensitivity import nbits as nb

    model, evaluation = results / "deploy" / "fp32" / "decoder.onnx", work / "feeds.npz"
    if mode == MODES[0]:  # the engine as it was: the same set, not marked read-only, lm_head at every position
        samples = Samples.load(evaluation)
        samples.read_only = False
        evaluation = work / "feeds-every.npz"
        samples.save(evaluation)
    d = work / mode.replace(" ", "-")
    settings = NBitsSettings(algorithm="rtn", block_size=128, symmetric=True, accuracy_level=4)
    meta, t_prepare = timed(lambda: nb.prepare(model, evaluation, d / "engine", settings, threads, logits=True))
    summary, t_scores = timed(lambda: nb.sensitivity(d / "engine", evaluation, d / "nbits.csv", d / "nbits.json",
                                                     threads))
    eng_dir = nb.Prepared(d / "engine")
    eng, ref = eng_dir.session(evaluation, threads), eng_dir.reference()
    eng.evaluate({}, ref)  # the session's first run allocates its buffers: not timed
    _, t_float = timed(lambda: eng.evaluate({}, ref))
    _, t_int4 = timed(lambda: eng.evaluate(dict.fromkeys(eng_dir.ops, 4), ref))
    return {"read_rows": meta["read_rows"], "ops": len(eng_dir.ops), "prepare": t_prepare, "scores": t_scores,
            "per_op": summary["seconds_per_op"], "float": t_float, "int4": t_int4,
            "reference_bytes": (d / "engine" / nb.FILES["reference"]).stat().st_size,
            "peak": peak_gb(), "csv": str(d / "nbits.csv")}


def report(results: Path, facts: dict, r: dict) -> None:
    import pandas as pd

    p = facts["positions_total"]
    read = facts["positions"]
    print(f"{results}: the measure's {facts['cases']} cases, {p} positions in their prefills, {read} of them read "
          f"(the answers' steps); {r[MODES[0]]['ops']} MatMuls; {facts['threads']} threads; each mode in its own process.\n")
    print("| lm_head at | engine's price per MatMul (INT4 + INT8) | whole forward, all float | all INT4 | "
          "reference on disk | peak |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for mode in MODES:
        x = r[mode]
        print(f"| {mode} | {x['per_op']:.1f} s | {x['float']:.1f} s | {x['int4']:.1f} s | "
              f"{x['reference_bytes'] / 1e6:.0f} MB | {x['peak']:.1f} GB |")
    a, b = (pd.read_csv(r[m]["csv"]).set_index("op").sort_index() for m in MODES)
    cols = [c for c in ("kl_int4", "kl_int8", "top1_int4", "top1_int8", "cosine_int4", "cosine_int8") if c in a]
    rel = {(c, op): abs(a.at[op, c] - b.at[op, c]) / max(abs(a.at[op, c]), 1e-30) for c in cols for op in a.index}
    c, op = max(rel, key=rel.get)
    print()
    print(f"Both modes' nbits.csv: largest relative difference over {', '.join(cols)}: {rel[c, op]:.1e}.")
    print(f"(at {op}, {c}: {a.at[op, c]:.6g} against {b.at[op, c]:.6g})")
    saved = r[MODES[0]]["float"] - r[MODES[1]]["float"]
    print(f"lm_head at an unread position cost {1000 * saved / max(p - read, 1):.2f} ms (all-float forward, "
          f"{saved:.1f} s of {r[MODES[0]]['float']:.1f} s over {p - read} unread positions).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/3b"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--publish", action="store_true")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        (args.work / "result.json").write_text(json.dumps(one_mode(args.results, args.work, args.mode, args.threads)))
        return
    from _publish import published

    r = {}
    with tempfile.TemporaryDirectory(prefix="vlsens-read-rows-", dir=args.results) as work:
        work = Path(work)
        facts = feeds(args.results, work)
        facts["positions_total"] = sum(c["sequence"] for c in facts["per_case"])
        facts["threads"] = args.threads
        for mode in MODES:
            subprocess.run([sys.executable, __file__, "--results", str(args.results), "--threads", str(args.threads),
                            "--mode", mode, "--work", str(work)], check=True)
            r[mode] = json.loads((work / "result.json").read_text())
        with published(f"read-rows-{args.results.name}", "Engine nbits with lm_head only where the logits are read",
                       results=args.results):
            report(args.results, facts, r)


if __name__ == "__main__":
    main()
