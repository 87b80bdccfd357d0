#!/usr/bin/env python
"""The decoder's estimate at real widths: on a decoder graph and an evaluation set of a finished
run (default: ``make scale``'s 2-layer Qwen2.5-VL-3B decoder, ``results/3b/decoder/fp32``, and its
text tower's evaluation split, six text, one-image and two-image prompts at 448x448), an nbits
engine is prepared (symmetric round to nearest in blocks of 128, ``config/scale-int4.yaml``'s
``deploy.nbits``) and timed three ways:

- the engine's price of each MatMul (:func:`vlsens.sensitivity.nbits.sensitivity`: every MatMul
  alone at INT4 and at INT8 through the suffix engine), per MatMul;
- the estimate's pass (:func:`vlsens.sensitivity.estimate.capture` and
  :func:`~vlsens.sensitivity.estimate.output_errors`): every MatMul's input over the evaluation
  set, then its output error at both widths;
- a whole forward of the all-float and the all-INT4 assignments (after one untimed forward).

Each is split into the decoder layers' part and lm_head's (the layers' part is what grows with
depth: a 36-layer projection is printed beside it), with the process's peak memory.

    python bench/bench_decoder_errors.py [--results results/3b] [--publish]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(results: Path, threads: int, work: Path) -> dict:
    import pandas as pd

    from vlsens.data.samples import Samples
    from vlsens.quantize.nbits import NBitsSettings
    from vlsens.sensitivity import estimate
    from vlsens.sensitivity import nbits as nb

    model, evaluation = results / "decoder" / "fp32" / "model.onnx", results / "calib" / "decoder" / "eval.npz"
    settings = NBitsSettings(algorithm="rtn", block_size=128, symmetric=True, accuracy_level=4)
    meta, t_prepare = timed(lambda: nb.prepare(model, evaluation, work / "engine", settings, threads, logits=True))
    eng_dir = nb.Prepared(work / "engine")
    samples = Samples.load(evaluation, eng_dir.folder / nb.FILES["float"])
    positions = sum(f["inputs_embeds"].shape[1] for f in samples.feeds)
    summary, t_scores = timed(lambda: nb.sensitivity(work / "engine", evaluation, work / "nbits.csv",
                                                     work / "nbits.json", threads))
    rows = pd.read_csv(work / "nbits.csv")
    inputs, t_capture = timed(lambda: estimate.capture(eng_dir.folder / nb.FILES["float"], samples.feeds,
                                                       meta["ops"], work, threads))
    errors, t_errors = timed(lambda: estimate.output_errors(inputs, eng_dir.folder / nb.FILES["float"],
                                                            {b: eng_dir.folder / nb.FILES[f"q{b}"] for b in (4, 8)},
                                                            meta["ops"]))
    eng, ref = eng_dir.session(evaluation, threads), eng_dir.reference()
    names = eng_dir.ops
    eng.evaluate({}, ref)  # the session's first run allocates its buffers: not timed
    _, t_float = timed(lambda: eng.evaluate({}, ref))
    _, t_int4 = timed(lambda: eng.evaluate(dict.fromkeys(names, 4), ref))
    return {"meta": meta, "positions": positions, "cases": samples.count, "prepare": t_prepare, "scores": t_scores,
            "per_op": summary["seconds_per_op"], "capture": t_capture, "errors": t_errors, "float": t_float,
            "int4": t_int4, "rows": rows, "error_values": errors, "peak": peak_gb()}


def report(results: Path, r: dict) -> None:
    from vlsens.quantize.qdq import parse_op_name

    ops = r["meta"]["ops"]
    layers = 1 + max(b for b in (parse_op_name(o["name"])[0] for o in ops) if b is not None)
    w = sum(o["K"] * o["N"] for o in ops)
    lm = next(o for o in ops if "lm_head" in o["name"])
    w_layers = w - lm["K"] * lm["N"]
    print(f"{results}: decoder of {layers} layers, {len(ops)} MatMuls, {w / 1e9:.2f} G MatMul weights "
          f"({w_layers / 1e9:.2f} G in the layers, lm_head {lm['K'] * lm['N'] / 1e9:.2f} G); evaluation set "
          f"{r['cases']} cases, {r['positions']} positions; 2 threads.\n")
    print("| step | s | s per position | per MatMul |")
    print("| --- | ---: | ---: | ---: |")
    n, p = len(ops), r["positions"]
    for name, t, per in (("engine prepared (float, all-INT4 and all-INT8 models, switch, reference)", r["prepare"], None),
                         ("engine's price of every MatMul at INT4 and INT8 (suffix engine)", r["scores"], r["per_op"]),
                         ("estimate: every MatMul's input captured (one float pass)", r["capture"], None),
                         ("estimate: every MatMul's output error at INT4 and INT8", r["errors"], r["errors"] / n),
                         ("whole forward, all float", r["float"], None),
                         ("whole forward, all INT4", r["int4"], None)):
        print(f"| {name} | {t:.1f} | {1000 * t / p:.2f} ms | {'' if per is None else f'{per:.1f} s'} |")
    print()
    print(f"Peak memory of the process: {r['peak']:.1f} GB.")
    share = (w_layers / layers) / w  # one layer's share of the MatMul weights
    print(f"One layer holds {100 * share:.1f} % of these MatMul weights; at 36 layers the layers hold "
          f"{36 * w_layers / layers / 1e9:.2f} G. The output errors' time is a product per weight and position, so "
          f"at 36 layers, on the same positions, about {r['errors'] * (36 * w_layers / layers + w - w_layers) / w:.0f} s.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/3b"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    from _publish import published

    with tempfile.TemporaryDirectory(prefix="vlsens-decoder-errors-", dir=args.results) as work:
        r = run(args.results, args.threads, Path(work))
    with published(f"decoder-errors-{args.results.name}", f"The decoder's estimate at the widths of {args.results}",
                   results=args.results):
        report(args.results, r)


if __name__ == "__main__":
    main()
