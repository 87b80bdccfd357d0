"""Prefill and decode speed and peak memory of the deploy folders (onnxruntime-genai) next to
transformers' ``generate`` on the same prompts, and next to vlsens' cache-less text graph
(``text/fp32/embeds.onnx``, the whole sequence re-run per token) -- the measurement behind taking
onnxruntime-genai's builder decoder with its KV cache.

    python bench/bench_deploy.py --results results/tiny --tokens 32
    python bench/bench_deploy.py --results results/3b --tokens 16 --image

Each runner is its own process (peak RSS = its VmHWM: the model loaded plus the run): one warm-up
run, then ``--runs`` timed runs (default 5) in the same process; each figure is the median of the
runs, with its min and max and the spread max / min printed beside it. Greedy decoding with no
end-of-sequence stop, so every runner decodes exactly ``--tokens`` tokens. Prefill tokens/s =
prompt tokens / time to the first new token (image encoding included); decode tokens/s = the
other tokens / their time. Each generator's KV cache holds the prompt and its tokens (as
:class:`~vlsens.deploy.genai.runtime.Chat` sizes it), not the folder's context length. Prints a Markdown table, written to
``results/<model>/bench/deploy.md`` (``--publish``: ``docs/benchmarks/deploy-<model>.md``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PROMPT = "Describe this image in detail, then list three objects you can see."


def _peak_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024 ** 2
    return float("nan")


def _image(args) -> list[str]:
    if not args.image:
        return []
    from vlsens.data.images import open_rgb, resolve_images

    path = Path(args.workdir) / "bench-image.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    open_rgb(resolve_images("builtin")[0]).save(path)
    return [str(path)]


def run_genai(args) -> dict:
    import onnxruntime_genai as og

    from vlsens.deploy.genai.runtime import Chat

    chat = Chat(args.folder, prepack=not args.no_prepack)
    images = _image(args)
    _genai_once(og, chat, images, args.tokens)  # warm-up (allocations, first-call kernels)
    return _runs([_genai_once(og, chat, images, args.tokens) for _ in range(args.runs)])


def _runs(runs: list[dict]) -> dict:
    """The timed runs as one result: every run's times kept, the prompt and token counts of the first."""
    return {**{k: runs[0][k] for k in ("prompt_tokens", "new_tokens")},
            "prefill_s": [r["prefill_s"] for r in runs], "decode_s": [r["decode_s"] for r in runs]}


def _genai_once(og, chat, images, tokens: int) -> dict:
    from vlsens.deploy.genai.runtime import search_length

    t0 = time.perf_counter()
    inputs = chat.processor(chat.prompt(PROMPT, len(images)), images=chat._images(images))
    params = og.GeneratorParams(chat.model)
    # the KV cache sized to the prompt and its tokens, as Chat sizes it (at the folder's max_length,
    # its context length, a 36-layer 3B generator allocated 9.4 GB: bench_measure_buffer.py)
    params.set_search_options(do_sample=False, min_length=0, max_length=search_length(inputs, tokens))
    gen = og.Generator(chat.model, params)
    gen.set_inputs(inputs)
    prompt_tokens = int(inputs["input_ids"].as_numpy().shape[-1])
    gen.generate_next_token()
    t1 = time.perf_counter()
    n = 1
    while n < tokens:
        gen.generate_next_token()
        n += 1
    t2 = time.perf_counter()
    return {"prompt_tokens": prompt_tokens, "prefill_s": t1 - t0, "decode_s": t2 - t1, "new_tokens": n}


def run_transformers(args) -> dict:
    import torch
    from PIL import Image

    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    torch.set_num_threads(args.threads)
    model = load_model(args.checkpoint, attn_implementation="sdpa")
    processor = load_processor(args.checkpoint)
    images = _image(args)
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": PROMPT}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)
    pil = [Image.open(p).convert("RGB") for p in images] or None
    def timed(n: int) -> float:
        t0 = time.perf_counter()
        inputs = processor(text=[text], images=pil, return_tensors="pt")
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t0

    timed(1)  # warm-up
    n_prompt = int(processor(text=[text], images=pil, return_tensors="pt")["input_ids"].shape[-1])
    runs = []
    for _ in range(args.runs):  # prefill: one new token; decode: the rest of a full run beyond it
        first, full = timed(1), timed(args.tokens)
        runs.append({"prompt_tokens": n_prompt, "prefill_s": first, "decode_s": full - first,
                     "new_tokens": args.tokens})
    return _runs(runs)


def run_nocache(args) -> dict:
    """vlsens' text graph without a cache: every step re-runs the whole sequence (text only)."""
    import numpy as np

    from vlsens.core.onnxutil import make_session
    from vlsens.export.towers.prompts import text_position_ids_np
    from vlsens.model.loading import embedding_table
    from vlsens.model.processor import load_processor

    processor = load_processor(args.checkpoint)
    table = embedding_table(args.checkpoint)
    sess = make_session(args.folder, threads=args.threads)
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
                                         tokenize=False, add_generation_prompt=True)
    ids = processor.tokenizer(text, return_tensors="np")["input_ids"].astype(np.int64)
    sess.run(None, {"inputs_embeds": table[ids].astype(np.float32), "attention_mask": np.ones_like(ids),
                    "position_ids": text_position_ids_np(np.ones_like(ids))})  # warm-up
    runs = []
    for _ in range(args.runs):
        seq, stamps, t0 = ids, [], time.perf_counter()
        for _ in range(args.tokens):
            mask = np.ones_like(seq)
            logits = sess.run(None, {"inputs_embeds": table[seq].astype(np.float32), "attention_mask": mask,
                                     "position_ids": text_position_ids_np(mask)})[0]
            seq = np.concatenate([seq, logits[:, -1:].argmax(-1)], axis=1)
            stamps.append(time.perf_counter())
        runs.append({"prompt_tokens": int(ids.shape[1]), "prefill_s": stamps[0] - t0,
                     "decode_s": stamps[-1] - stamps[0], "new_tokens": args.tokens})
    return _runs(runs)


WORKERS = {"genai": run_genai, "transformers": run_transformers, "nocache": run_nocache}


def worker(argv) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=sorted(WORKERS))
    for k in ("--folder", "--checkpoint", "--workdir"):
        p.add_argument(k)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--image", action="store_true")
    p.add_argument("--no-prepack", action="store_true")
    args = p.parse_args(argv)
    out = WORKERS[args.kind](args)
    out["peak_gb"] = _peak_gb()
    print("RESULT " + json.dumps(out))


def _spawn(kind: str, args, **extra) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--tokens", str(args.tokens), "--runs", str(args.runs),
           "--threads", str(args.threads),
           "--workdir", args.workdir, *(["--image"] if args.image else [])]
    for k, v in extra.items():
        if v is True:
            cmd.append(f"--{k}")
        elif v is not False:
            cmd += [f"--{k}", str(v)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    line = next((s for s in r.stdout.splitlines() if s.startswith("RESULT ")), None)
    if line is None:
        return {"error": (r.stdout + r.stderr)[-500:] or f"exit {r.returncode} with no output (killed?)"}
    return json.loads(line[len("RESULT "):])


def main() -> None:
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(sys.argv[i + 1:] + sys.argv[1:i])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results/tiny", help="results/<model> of a finished run")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per run")
    p.add_argument("--runs", type=int, default=5, help="timed runs per runner after one warm-up (default 5)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--image", action="store_true", help="one image + prompt (else text only)")
    p.add_argument("--workdir", default="/tmp/vlsens-bench-deploy")
    p.add_argument("--precisions", nargs="+", help="deploy folders to run (default: every one built)")
    p.add_argument("--no-prepack", nargs="*", default=[], metavar="PRECISION",
                   help="folders loaded with ONNX Runtime's weight prepacking off (memory-mapped weights: the "
                        "36-layer fp32 folder's 16.4 GB do not fit twice in 24 GiB)")
    p.add_argument("--no-transformers", action="store_true", help="skip transformers' generate")
    p.add_argument("--publish", action="store_true", help="write the table to docs/benchmarks/ (default: "
                                                          "results/<model>/bench/)")
    args = p.parse_args()
    res = Path(args.results)
    if not list(res.glob("deploy/*/genai_config.json")):
        sys.exit(f"{res}/deploy/: no deploy folder; run the workflow first (make run, or make scale for results/3b)")
    ckpt = checkpoint_of(res)
    rows = []
    from vlsens.deploy import PRECISIONS

    for precision in args.precisions or PRECISIONS:
        folder = res / "deploy" / precision
        if (folder / "genai_config.json").is_file():
            lean = precision in args.no_prepack
            rows.append((f"deploy/{precision} (onnxruntime-genai{', prepacking off' if lean else ''})",
                         _spawn("genai", args, folder=folder, **{"no-prepack": lean})))
    if not args.no_transformers:
        rows.append(("transformers generate (fp32, sdpa)", _spawn("transformers", args, checkpoint=ckpt)))
    nocache = res / "text" / "fp32" / "embeds.onnx"
    if nocache.is_file() and not args.image:
        rows.append(("text/fp32/embeds.onnx, no KV cache", _spawn("nocache", args, folder=nocache, checkpoint=ckpt)))
    table(rows, args)


def checkpoint_of(res: Path) -> Path:
    """The run's checkpoint: a preset's folder, or the local checkpoint its content manifest names."""
    manifest = res / "inputs" / "checkpoint.json"
    if (res / "checkpoint" / "config.json").is_file() or not manifest.is_file():
        return res / "checkpoint"
    return Path(json.loads(manifest.read_text())["directory"])


def _stat(values: list[float]) -> tuple[float, float, float]:
    import statistics

    return statistics.median(values), min(values), max(values)


def table(rows, args) -> None:
    print(f"\n{'image + ' if args.image else ''}prompt, {args.tokens} new tokens, {args.threads} threads, CPU; "
          f"median of {args.runs} runs after one warm-up [min, max]; spread = max / min\n")
    print("| runner | prompt tokens | prefill s | prefill tok/s | decode tok/s [min, max] | decode spread | "
          "peak RSS GB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows:
        if "error" in r:  # the runner's last line, whole
            print(f"| {name} | failed: {r['error'].strip().splitlines()[-1]} | | | | | |")
            continue
        prefill = _stat(r["prefill_s"])
        tps = [(r["new_tokens"] - 1) / d for d in r["decode_s"] if d > 0] or [float("nan")]
        dec = _stat(tps)
        print(f"| {name} | {r['prompt_tokens']} | {prefill[0]:.3f} | {r['prompt_tokens'] / prefill[0]:.0f} | "
              f"{dec[0]:.1f} [{dec[1]:.1f}, {dec[2]:.1f}] | {dec[2] / dec[1]:.2f}x | {r['peak_gb']:.2f} |")


if __name__ == "__main__" and "--worker" in sys.argv:  # a runner's own process: prints one RESULT line
    main()
elif __name__ == "__main__":
    from _publish import published

    results = sys.argv[sys.argv.index("--results") + 1] if "--results" in sys.argv else "results/tiny"
    with published(f"deploy-{Path(results).name}", f"Deploy folders of {results}: decode speed", results=results):
        main()
