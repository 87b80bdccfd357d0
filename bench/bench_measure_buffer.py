#!/usr/bin/env python
"""The folder measure's KV cache: sized to the folder's context, or to the case.

Every folder measure (the deploy checks, the parts', the vision Linears', the plans') runs each
case through onnxruntime-genai: a generator on the prompt, then the reference tokens appended one
at a time (:meth:`vlsens.deploy.genai.runtime.Chat.forced_logits`). With the shared past/present
buffer the runtime allocates a generator's cache at its ``max_length``; the folder's
``genai_config.json`` sets that to the context length (128 000 at Qwen2.5-VL-3B: 9.4 GB of float32
cache at 36 layers). Chat now sizes it to the prompt and its tokens (:func:`search_length`).

This bench measures a finished run's folders (default ``make scale-int4``'s 36-layer
``results/3b-full``) on the run's measure, each way in its own process (its own peak): the
measure with the cache at the folder's length, at the case's length, and the same decoder as a
plain ONNX Runtime session on the measure's prefills (:func:`vlsens.deploy.genai.chain.chain_kl`:
one prefill per case, logits at every position), and prints per folder and way the seconds,
milliseconds per position, peak memory, and whether both genai ways give the same rows.

    python bench/bench_measure_buffer.py [--results results/3b-full] [--folders fp32 int4-rtn] [--publish]
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
from bench_read_rows import feeds  # noqa: E402  (the measure's cases as prefills, as budget_nbits makes them)

WAYS = ("genai, cache at the folder's max_length", "genai, cache at the case's length", "plain session, one prefill")


def one_way(results: Path, folder: str, way: str, work: Path, threads: int, prepack: bool = True) -> dict:
    """One folder measured one way (run in a process of its own)."""
    from vlsens.deploy.cases import load_cases
    from vlsens.deploy.genai import runtime
    from vlsens.deploy.genai.measure import measure_folder

    m, path = results / "measure", results / "deploy" / folder
    if way == WAYS[2]:
        from vlsens.deploy.genai.chain import chain_kl

        rows, seconds = timed(lambda: chain_kl(path / "decoder.onnx", work / "feeds.npz", m / "reference.npz",
                                                threads))
        return {"seconds": seconds, "rows": rows, "peak": peak_gb()}
    if way == WAYS[0]:  # the measure as it was: every generator at the folder's own max_length
        length = json.loads((path / "genai_config.json").read_text())["search"]["max_length"]
        runtime.search_length = lambda inputs, new_tokens: int(length)
    record = measure_folder(path, m / "reference.npz", load_cases(m / "cases"), folder, prepack=prepack)
    return {"seconds": record["seconds"], "rows": record["cases"], "peak": peak_gb()}


def report(results: Path, facts: dict, r: dict, threads: int, prepack: bool) -> None:
    cfg = json.loads((results / "deploy" / "fp32" / "genai_config.json").read_text())
    dec = cfg["model"]["decoder"]
    per_position = dec["num_hidden_layers"] * 2 * dec["num_key_value_heads"] * dec["head_size"] * 4
    positions = sum(c["sequence"] for c in facts["per_case"])
    print(f"{results}: the measure's {facts['cases']} cases, {positions} positions in their prefills "
          f"({facts['positions']} of them read, the answers' steps); {dec['num_hidden_layers']} layers; "
          f"the folders' max_length {cfg['search']['max_length']}: a float32 cache of "
          f"{per_position} bytes a position, {per_position * cfg['search']['max_length'] / 1e9:.2f} GB a generator "
          f"at that length; {threads} threads; genai with the weights "
          f"{'prepacked (as the measures run)' if prepack else 'memory-mapped (prepacking off)'}; each way in its own "
          "process.\n")
    print("| folder | way | seconds | per case | ms a position | peak GB | mean KL |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for folder, ways in r.items():
        for way, x in ways.items():
            if "failed" in x:
                print(f"| {folder} | {way} | exit code {x['failed']} (killed) | | | | |")
                continue
            kl = sum(row["kl"] for row in x["rows"]) / len(x["rows"])
            print(f"| {folder} | {way} | {x['seconds']:.1f} | {x['seconds'] / len(x['rows']):.2f} | "
                  f"{1000 * x['seconds'] / positions:.1f} | {x['peak']:.2f} | {kl:.4g} |")
    print()
    for folder, ways in r.items():
        if any("failed" in ways[w] for w in WAYS):
            print(f"- {folder}: {', '.join(w for w in WAYS if 'failed' in ways[w])} did not finish: no comparison.")
            continue
        a, b = (ways[w]["rows"] for w in WAYS[:2])
        same = [(x["name"], x["kl"], x["top1"]) for x in a] == [(x["name"], x["kl"], x["top1"]) for x in b]
        print(f"- {folder}: the two genai ways' rows (per case KL and top-1) are {'identical' if same else 'DIFFERENT'}; "
              f"cache at the case's length {ways[WAYS[0]]['seconds'] / ways[WAYS[1]]['seconds']:.2f}x faster, "
              f"{ways[WAYS[0]]['peak'] - ways[WAYS[1]]['peak']:.2f} GB lower peak; the plain session "
              f"{ways[WAYS[1]]['seconds'] / ways[WAYS[2]]['seconds']:.2f}x faster than genai at the case's length.")
    print("\n(The plain session runs each case as one prefill with logits at every position, on inputs_embeds "
          "computed once beforehand (no vision or embedding graph in its seconds), where genai prefills the prompt "
          "and then decodes the answer's tokens one by one: the same logits, not the same work. Its prefills "
          "are the fp32 folder's, so for a folder with another vision graph its KL is the decoder's alone.)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/3b-full"))
    ap.add_argument("--folders", nargs="+", default=["fp32", "int4-rtn"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-prepack", action="store_true",
                    help="genai with the weights memory-mapped (as the deploy checks run the fp32 folder), not prepacked "
                         "(as the measures run every folder)")
    ap.add_argument("--publish", action="store_true")
    ap.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.way:
        out = one_way(args.results, args.folder, args.way, args.work, args.threads, not args.no_prepack)
        (args.work / "result.json").write_text(json.dumps(out))
        return
    from _publish import named, published

    r = {}
    with tempfile.TemporaryDirectory(prefix="vlsens-measure-buffer-", dir=args.results) as work:
        work = Path(work)
        facts = feeds(args.results, work)
        for folder in args.folders:
            r[folder] = {}
            for way in WAYS:
                (work / "result.json").unlink(missing_ok=True)
                p = subprocess.run([sys.executable, __file__, "--results", str(args.results), "--threads",
                                    str(args.threads), "--way", way, "--folder", folder, "--work", str(work),
                                    *(["--no-prepack"] if args.no_prepack else [])])
                # a way the machine cannot hold (killed for memory) is a result too, not the bench's end
                r[folder][way] = json.loads((work / "result.json").read_text()) if p.returncode == 0 else \
                    {"failed": p.returncode}
                print(f"{folder}, {way}: {r[folder][way]}"[:200], file=sys.stderr, flush=True)
        name = named(f"measure-buffer-{args.results.name}", "--folders") + ("-mapped" if args.no_prepack else "")
        with published(name,
                       "The folder measure's KV cache: at the folder's context length or the case's",
                       results=args.results):
            report(args.results, facts, r, args.threads, not args.no_prepack)


if __name__ == "__main__":
    main()
