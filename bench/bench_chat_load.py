#!/usr/bin/env python
"""What checking a deploy folder costs when ``Chat`` loads it: the load with ``verify=False``
beside the verified loads, on one folder, each in a fresh process.

    python bench/bench_chat_load.py results/3b/deploy/fp32 [--runs 3] [--name chat-load-3b]

Four ways, alternating run by run so that a drift of the machine falls on all:

- ``unverified``: ``Chat(folder, verify=False)``;
- ``results/ (record)``: the folder where vlsens wrote it, checked against the record beside it
  (files whose size, mtime, ctime and inode are the recorded ones are not read);
- ``copied, first load``: a copy of the folder elsewhere (new inodes), with an empty hash cache:
  every file hashed against the sizes and SHA-256 its ``eval.json`` lists;
- ``copied, later loads``: the same copy again: the hash cache (by size, mtime, ctime, inode)
  answers, no file is read for the check.

Seconds are the constructor's wall time (onnxruntime-genai imported before the clock starts),
weights in the page cache (the folder was read before: what a user who loads the folder again
sees). ``prepack=False`` as the deploy checks load float folders (a float32 folder's weights stay
memory-mapped). The table goes to ``docs/benchmarks/<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
import onnxruntime_genai  # imported before the clock starts
from vlsens.deploy.genai.runtime import Chat
t = time.perf_counter()
chat = Chat(sys.argv[1], prepack=False, verify=sys.argv[2] == "1")
print(json.dumps(time.perf_counter() - t))
"""


def load(folder: Path, verify: bool, cache: Path) -> float:
    env = dict(os.environ, VLSENS_CACHE_DIR=str(cache), PYTHONPATH=str(REPO / "src"))
    r = subprocess.run([sys.executable, "-c", CHILD, str(folder), "1" if verify else "0"], env=env,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"Chat({folder}) failed:\n{r.stderr[-3000:]}")
    return float(json.loads(r.stdout.strip().splitlines()[-1]))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def main(folder: Path, runs: int) -> None:
    if not (folder / "eval.json").is_file():
        raise SystemExit(f"{folder}: no eval.json; give a deploy folder vlsens wrote")
    times: dict[str, list[float]] = {k: [] for k in ("unverified", "results/ (record)", "copied, first load",
                                                      "copied, later loads")}
    with tempfile.TemporaryDirectory(prefix="vlsens-chat-load-", dir=folder.parents[2]) as tmp:
        load(folder, False, Path(tmp) / "warm")  # the weights into the page cache
        for i in range(runs):
            copy, cache = Path(tmp) / f"copy-{i}" / folder.name, Path(tmp) / f"cache-{i}"
            shutil.copytree(folder, copy)
            times["unverified"].append(load(folder, False, cache))
            times["results/ (record)"].append(load(folder, True, cache))
            times["copied, first load"].append(load(copy, True, cache))
            times["copied, later loads"].append(load(copy, True, cache))
            shutil.rmtree(copy.parent)
            print(f"run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), file=sys.stderr)
    size = folder_bytes(folder)
    base = statistics.median(times["unverified"])
    print(f"`Chat({folder}, prepack=False)`: {size / 1e9:.2f} GB in {sum(1 for p in folder.iterdir())} files; "
          f"{runs} run(s) each, in fresh processes, weights in the page cache.\n")
    print("| load | runs (s) | median (s) | / unverified |")
    print("| --- | --- | ---: | ---: |")
    for k, v in times.items():
        med = statistics.median(v)
        print(f"| {k} | {', '.join(f'{x:.2f}' for x in v)} | {med:.2f} | {med / base:.2f}x |")
    first = statistics.median(times["copied, first load"]) - base
    print(f"\nHashing a copied folder once: {first:.1f} s over {size / 1e9:.2f} GB "
          f"({size / 1e9 / max(first, 1e-9):.2f} GB/s from the page cache). Goal: a verified load within 2x "
          "the unverified one, or a documented size + mtime fast path.")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a deploy folder under results/<model>/deploy/")
    ap.add_argument("--runs", type=int, default=3, help="runs of each way (default 3)")
    ap.add_argument("--name", default=None, help="docs/benchmarks/<name>.md (default chat-load-<model>)")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _publish import published

    folder = a.folder.resolve()
    with published(a.name or f"chat-load-{folder.parents[1].name}", "What checking a folder costs at load"):
        main(folder, a.runs)
