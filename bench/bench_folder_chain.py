#!/usr/bin/env python
"""A whole deploy folder's measure: onnxruntime-genai on the folder, or the part chain on its own graphs.

Every plan folder is measured on the measure's cases (``measure/plan-<name>.json``). That measure
ran the folder through onnxruntime-genai: the folder loaded and prepacked, each case's prompt
prefilled and its reference tokens appended one at a time. The part chain
(:class:`vlsens.deploy.genai.chain.PartChain`) runs the folder's own processor, vision, embedding
and decoder graphs as plain ONNX Runtime sessions, each case one prefill read at the steps the
runtime teacher-forces: what ``plan_folder`` now runs.

This bench measures named deploy folders of a finished run both ways, each way in its own process
(its own peak), on every case of the run's measure, and prints the seconds (setup included: the
chain's cases processed and sessions opened, the runtime's folder loaded), milliseconds a scored
position (the reference tokens), peak memory, mean KL, and the chain's largest relative difference
from the runtime per case.

    python bench/bench_folder_chain.py [--results results/tiny] [--folders int4-rtn plan-p3] [--publish]
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
sys.path.insert(0, str(REPO / "bench"))

from bench_decoder_errors import peak_gb  # noqa: E402

WAYS = ("genai", "part chain")


def one_way(results: Path, folder: str, way: str, threads: int) -> dict:
    """One folder measured one way (run in a process of its own)."""
    import onnxruntime_genai  # noqa: F401  (both ways' libraries imported first: plan_folder has them loaded)

    from vlsens.data.inputs import checkpoint_dir
    from vlsens.deploy.cases import load_cases
    from vlsens.deploy.genai.chain import PartChain
    from vlsens.deploy.genai.measure import measure_folder
    from vlsens.model.family import family_of

    family_of(checkpoint_dir(results / "checkpoint")).transformers_class()  # transformers' modeling, as the gate has it
    cases, ref, path = load_cases(results / "measure" / "cases"), results / "measure" / "reference.npz", \
        results / "deploy" / folder
    t0 = time.perf_counter()
    if way == WAYS[0]:
        m, setup = measure_folder(path, ref, cases, folder), None
    else:
        chain = PartChain(path, ref, cases, checkpoint_dir(results / "checkpoint"), threads)
        setup = time.perf_counter() - t0
        m = chain.measure(folder)
    return {"seconds": time.perf_counter() - t0, "setup": setup, "rows": m["cases"], "mean_kl": m["mean_kl"],
            "peak": peak_gb()}


def report(results: Path, r: dict, threads: int) -> None:
    cfg = json.loads((results / "deploy" / "fp32" / "genai_config.json").read_text())
    some = next(iter(r.values()))[WAYS[0]]
    positions = sum(row["steps"] for row in some.get("rows", ()))
    print(f"{results}: every case of the run's measure ({len(some.get('rows', ()))} cases, {positions} scored "
          f"positions); {cfg['model']['decoder']['num_hidden_layers']} layers; {threads} threads; each way in its own "
          "process, the libraries imported first, its setup included (the runtime's folder loaded and prepacked; the "
          "chain's cases processed, 3-D positions computed, sessions opened: its own column).\n")
    print("| folder | way | seconds | of which setup | ms a scored position | peak GB (process) | mean KL |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for folder, ways in r.items():
        for way in WAYS:
            x = ways[way]
            if "failed" in x:
                print(f"| {folder} | {way} | exit code {x['failed']} | | | | |")
                continue
            setup = "" if x.get("setup") is None else f"{x['setup']:.1f}"
            print(f"| {folder} | {way} | {x['seconds']:.1f} | {setup} | {1000 * x['seconds'] / positions:.1f} | "
                  f"{x['peak']:.2f} | {x['mean_kl']:.4g} |")
    print()
    for folder, ways in r.items():
        if any("failed" in ways[w] for w in WAYS):
            print(f"- {folder}: a way did not finish, no comparison.")
            continue
        a, b = ways[WAYS[1]]["rows"], ways[WAYS[0]]["rows"]
        rel = max((abs(x["kl"] - y["kl"]) / y["kl"] for x, y in zip(a, b, strict=True) if y["kl"] > 0), default=0.0)
        gap = max(abs(x["kl"] - y["kl"]) for x, y in zip(a, b))
        same = all(x["name"] == y["name"] and x["top1"] == y["top1"] for x, y in zip(a, b))
        print(f"- {folder}: genai / chain time {ways[WAYS[0]]['seconds'] / ways[WAYS[1]]['seconds']:.2f}; the chain's "
              f"KL per case within {rel:.2e} relative ({gap:.1e} absolute) of genai's, smallest case KL "
              f"{min(y['kl'] for y in b):.1e}; top-1 per case {'identical' if same else 'DIFFERENT'}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/tiny"))
    ap.add_argument("--folders", nargs="+", help="deploy folders (default: int4-rtn and every plan folder)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--publish", action="store_true")
    ap.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.way:
        args.out.write_text(json.dumps(one_way(args.results, args.folder, args.way, args.threads)))
        return
    from _publish import named, published

    deploy = args.results / "deploy"
    folders = args.folders or [f for f in ("int4-rtn",) if (deploy / f).is_dir()] + \
        sorted(p.name for p in deploy.glob("plan-*") if p.is_dir())
    if not folders:
        raise SystemExit(f"{deploy}: no folder to measure (run the workflow first, or name --folders)")
    r: dict = {}
    with tempfile.TemporaryDirectory(prefix="vlsens-folder-chain-") as work:
        out = Path(work) / "result.json"
        for folder in folders:
            r[folder] = {}
            for way in WAYS:
                out.unlink(missing_ok=True)
                p = subprocess.run([sys.executable, __file__, "--results", str(args.results), "--threads",
                                    str(args.threads), "--way", way, "--folder", folder, "--out", str(out)])
                r[folder][way] = json.loads(out.read_text()) if p.returncode == 0 else {"failed": p.returncode}
                print(f"{folder} {way}: {r[folder][way]}"[:200], file=sys.stderr, flush=True)
    with published(named(f"folder-chain-{args.results.name}"),
                   "A whole deploy folder's measure: onnxruntime-genai or the part chain", results=args.results):
        report(args.results, r, args.threads)


if __name__ == "__main__":
    main()
