#!/usr/bin/env python
"""A vision graph's measure in the fp32 folder: onnxruntime-genai on the folder so assembled, or the part chain.

The whole-VLM plan prices every vision format and, one at a time, the vision Linears at INT4 by
the fp32 folder's end-to-end KL on the measure's image cases. It ran each as a folder through
onnxruntime-genai (the folder loaded anew, its weights prepacked, each case's prompt prefilled and
its reference tokens decoded one by one). The part chain
(:class:`vlsens.deploy.genai.chain.PartChain`) opens the fp32 decoder and embedding once as plain
ONNX Runtime sessions, runs each distinct image through the changed vision graph once and each
case as one prefill read at the answer's positions.

This bench measures both on a finished run (default ``make scale-int4``'s 36-layer
``results/3b-full``) with two vision graphs: the run's whole INT4 graph (a component) and the fp32
graph with one Linear at INT4 (a vision Linear's price), each way in its own process (its own
peak), and prints the seconds, milliseconds per image-case position, peak memory, mean KL, and the
chain's largest relative difference from genai per case.

    python bench/bench_part_chain.py [--results results/3b-full] [--linear blocks.0/attn/qkv] [--publish]
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

WAYS = ("genai, the folder assembled", "part chain")
PARTS = ("int4 graph", "one Linear at INT4")


def _cases(results: Path) -> list[dict]:
    from vlsens.deploy.cases import load_cases

    return load_cases(results / "measure" / "cases")


def _image_modalities(cases) -> set[str]:
    return {c["modality"] for c in cases if c["images"]}


def prepare(results: Path, work: Path, linear: str) -> dict[str, Path]:
    """The two vision graphs in folder form (the fp32 folder's preamble), and for genai a folder
    of the fp32 folder's files (linked) with each in place of its vision graph."""
    from vlsens.deploy.genai import folder as genai
    from vlsens.precision.weight_only import FORMATS, linears, quantize_vision
    from vlsens.quantize.nbits import NBitsSettings

    fp32 = results / "deploy" / "fp32"
    graphs = {PARTS[0]: results / "vision" / "dynamic" / "int4" / "model.onnx"}
    src = results / "vision" / "dynamic" / "fp32" / "model.onnx"
    ops = [o["name"] for o in linears(src)]
    chosen = [o for o in ops if linear in o]
    if not chosen:
        raise SystemExit(f"no vision Linear named like {linear!r} in {src}: {ops[:4]} ...")
    staged = work / "one" / "model.onnx"
    g = json.loads(graphs[PARTS[0]].with_name("parity.json").read_text())["extra"]["graphs"]["model.onnx"]
    settings = NBitsSettings.from_config({k: g[k] for k in ("algorithm", "block_size", "accuracy_level")})  # the int4
    # graph's own, as budget_vision quantizes its Linears
    quantize_vision(src, staged, settings, per_op={o: FORMATS["int4"] if o == chosen[0] else None for o in ops})
    graphs[PARTS[1]] = staged
    out = {}
    for i, (part, graph) in enumerate(graphs.items()):
        folder = work / f"folder{i}"
        folder.mkdir()
        for f in fp32.iterdir():  # no records: a measurement vehicle, as the plan's measures built them
            if f.is_file() and not f.name.startswith("vision.onnx") and f.suffix != ".json" or \
                    f.name in ("genai_config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json"):
                (folder / f.name).symlink_to(f.resolve())
        genai.wrap_vision(graph, folder / genai.GRAPHS["vision"], None, work / f"preamble{i}",
                          fp32 / genai.GRAPHS["vision"])
        out[part] = folder
    out["linear"] = chosen[0]
    return out


def one_way(results: Path, way: str, work: Path, threads: int) -> dict:
    """Both vision graphs measured one way (run in a process of its own)."""
    from vlsens.deploy.genai import folder as genai

    cases, ref = _cases(results), results / "measure" / "reference.npz"
    folders = {p: work / f"folder{i}" for i, p in enumerate(PARTS)}
    out = {}
    if way == WAYS[0]:
        from vlsens.deploy.genai.measure import measure_folder

        for part, folder in folders.items():
            m = measure_folder(folder, ref, cases, part, modalities=_image_modalities(cases))
            out[part] = {"seconds": m["seconds"], "rows": m["cases"]}
    else:
        from vlsens.data.inputs import checkpoint_dir
        from vlsens.deploy.genai.chain import PartChain

        chain, seconds = timed(lambda: PartChain(results / "deploy" / "fp32", ref, cases,
                                                 checkpoint_dir(results / "checkpoint"), threads,
                                                 modalities=_image_modalities(cases)))
        out["setup"] = seconds
        out["positions"] = int(sum(s.shape[1] for s in chain.sequences))
        for part, folder in folders.items():
            m = chain.measure(part, vision=folder / genai.GRAPHS["vision"])
            out[part] = {"seconds": m["seconds"], "rows": m["cases"]}
    out["peak"] = peak_gb()
    return out


def report(results: Path, r: dict, linear: str, threads: int) -> None:
    cfg = json.loads((results / "deploy" / "fp32" / "genai_config.json").read_text())
    chain = r[WAYS[1]]
    positions = chain["positions"]
    rows = chain[PARTS[0]]["rows"]
    images = sorted({f["path"] for c in _cases(results) if c["images"] for f in c["images"]})
    print(f"{results}: the measure's {len(rows)} image cases ({sum(len(c['images']) for c in _cases(results))} "
          f"images, {len(images)} distinct), {positions} positions in their prefills; "
          f"{cfg['model']['decoder']['num_hidden_layers']} layers; {threads} threads; each way in its own process; "
          f"genai with the weights prepacked (as the plan's measures ran it). One Linear: {linear}.\n")
    print("| vision graph | way | seconds | ms a position | peak GB (process) | mean KL |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for part in PARTS:
        for way in WAYS:
            x = r[way]
            if "failed" in x:
                print(f"| {part} | {way} | exit code {x['failed']} | | | |")
                continue
            kl = sum(row["kl"] for row in x[part]["rows"]) / len(x[part]["rows"])
            print(f"| {part} | {way} | {x[part]['seconds']:.1f} | {1000 * x[part]['seconds'] / positions:.1f} | "
                  f"{x['peak']:.2f} | {kl:.4g} |")
    print()
    if any("failed" in r[w] for w in WAYS):
        print("- a way did not finish: no comparison.")
        return
    print(f"- part chain setup (the cases processed, positions, the fp32 decoder and embedding sessions opened, once "
          f"for every measure): {chain['setup']:.1f} s.")
    for part in PARTS:
        a, b = r[WAYS[1]][part]["rows"], r[WAYS[0]][part]["rows"]
        rel = max(abs(x["kl"] - y["kl"]) / y["kl"] for x, y in zip(a, b, strict=True) if y["kl"] > 0)
        same = all(x["name"] == y["name"] and x["top1"] == y["top1"] for x, y in zip(a, b))
        print(f"- {part}: the chain {r[WAYS[0]][part]['seconds'] / r[WAYS[1]][part]['seconds']:.2f}x faster; its KL "
              f"per case within {rel:.2e} relative of genai's, top-1 per case {'identical' if same else 'DIFFERENT'}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/3b-full"))
    ap.add_argument("--linear", default="blocks.0/attn/qkv", help="the vision Linear (a part of its MatMul's name) "
                                                                  "put at INT4 alone")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--publish", action="store_true")
    ap.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.way:
        (args.work / "result.json").write_text(json.dumps(one_way(args.results, args.way, args.work, args.threads)))
        return
    from _publish import named, published

    r = {}
    with tempfile.TemporaryDirectory(prefix="vlsens-part-chain-", dir=args.results) as work:
        work = Path(work)
        linear = prepare(args.results, work, args.linear)["linear"]
        for way in WAYS:
            (work / "result.json").unlink(missing_ok=True)
            p = subprocess.run([sys.executable, __file__, "--results", str(args.results), "--threads",
                                str(args.threads), "--way", way, "--work", str(work)])
            r[way] = json.loads((work / "result.json").read_text()) if p.returncode == 0 else {"failed": p.returncode}
            print(f"{way}: {r[way]}"[:300], file=sys.stderr, flush=True)
        with published(named(f"part-chain-{args.results.name}", "--linear"),
                       "A vision graph's measure in the fp32 folder: genai on the assembled folder or the part chain",
                       results=args.results):
            report(args.results, r, linear, args.threads)


if __name__ == "__main__":
    main()
