#!/usr/bin/env python
"""What integrity costs: the default DAG run from fresh results with every check and record of
:mod:`vlsens.core.outputs` on (as shipped) and off, in turn, on the same machine.

    python bench/bench_verify_cost.py [--runs 2] [--commit HEAD]

Two clones of ``--commit`` are made in a temporary folder; in one ("off") the output records, the
checks of recorded inputs, the DAG build's check of the run, the kept previous outputs and the
runtime's folder and image checks are turned into no-ops (a patch applied to that clone only:
the workflow has no switch that turns integrity off). Each run is ``snakemake --cores 2 --quiet
rules`` from an empty ``results/``, the two clones alternating (off, on, off, on, ...) so that a
drift of the machine's speed falls on both. Also timed: the no-op dry run of the finished run
(``snakemake -n``, several times). The table is written to ``docs/benchmarks/verify-cost.md``.
The ONNX records (``parity.json`` and the checks of ONNX inputs) predate this layer and stay on
in both clones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: (file, function) turned into ``return <value>`` in the "off" clone
NO_OPS = {
    "src/vlsens/core/outputs.py": {"record_outputs": "0", "verify_paths": "0", "check_run": "{}",
                                   "keep_previous": "[]", "restore_previous": "[]"},
}
#: the runtime's checks off by default in the "off" clone
RUNTIME = ("src/vlsens/deploy/genai/runtime.py",
           "check_images: bool = True, verify: bool = True", "check_images: bool = False, verify: bool = False")


def patch_off(clone: Path) -> None:
    import re

    for rel, funcs in NO_OPS.items():
        p = clone / rel
        s = p.read_text()
        for name, value in funcs.items():
            # the first statement after the docstring of ``def name(...)``
            m = re.search(rf"\ndef {name}\(.*?\n    \"\"\".*?\"\"\"\n", s, re.S)
            if not m:
                raise SystemExit(f"{rel}: def {name} with a docstring not found (the patch is out of date)")
            s = s[:m.end()] + f"    return {value}\n" + s[m.end():]
        p.write_text(s)
    rel, old, new = RUNTIME
    p = clone / rel
    s = p.read_text()
    if old not in s:
        raise SystemExit(f"{rel}: {old!r} not found (the patch is out of date)")
    p.write_text(s.replace(old, new))


def clone(commit: str, where: Path, off: bool) -> Path:
    dst = where / ("off" if off else "on")
    subprocess.run(["git", "clone", "-q", str(REPO), str(dst)], check=True)
    subprocess.run(["git", "-C", str(dst), "checkout", "-q", commit], check=True)
    for venv in REPO.glob(".venv*"):  # the environments the Makefile made (engine inc runs in its own)
        (dst / venv.name).symlink_to(venv)
    if off:
        patch_off(dst)
    return dst


def snakemake(clone: Path, *args: str) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(clone / "src"))
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--resources", "gpu=1", *args],
                       cwd=clone, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        raise SystemExit(f"snakemake failed in {clone}")
    return time.perf_counter() - t, r.returncode


def main(runs: int, commit: str) -> None:
    import shutil

    with tempfile.TemporaryDirectory(prefix="vlsens-verify-cost-") as tmp:
        clones = {off: clone(commit, Path(tmp), off) for off in (True, False)}
        walls: dict[bool, list[float]] = {True: [], False: []}
        for i in range(runs):
            for off in (True, False):
                shutil.rmtree(clones[off] / "results", ignore_errors=True)
                shutil.rmtree(clones[off] / ".snakemake", ignore_errors=True)
                wall, _ = snakemake(clones[off], "--quiet", "rules")
                walls[off].append(wall)
                print(f"run {i + 1} {'off' if off else 'on '}: {wall:.1f} s", file=sys.stderr)
        dry = [snakemake(clones[False], "-n")[0] for _ in range(5)]
        n_files = sum(1 for _ in (clones[False] / "results").rglob(".vlsens/*.json"))
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", commit], capture_output=True,
                         text=True).stdout.strip()
    print(f"The default DAG from empty results/, `snakemake --cores 2 --quiet rules`, at {sha}; "
          f"{runs} run(s) each, alternating; {os.cpu_count()} CPUs.\n")
    print("| integrity | runs (s) | median (s) |")
    print("| --- | --- | ---: |")
    for off in (True, False):
        label = "off (patched out)" if off else "on (as shipped)"
        print(f"| {label} | {', '.join(f'{w:.0f}' for w in walls[off])} | {statistics.median(walls[off]):.0f} |")
    ratio = statistics.median(walls[False]) / statistics.median(walls[True])
    pairs = [b / a for a, b in zip(walls[True], walls[False])]
    print(f"\nOn / off: **{ratio:.3f}x** (pair by pair: {', '.join(f'{p:.3f}' for p in pairs)}); goal <= 1.1x.")
    print(f"\nNo-op dry run of the finished run (`snakemake -n`, {len(dry)} times): median "
          f"**{statistics.median(dry):.2f} s** (min {min(dry):.2f}, max {max(dry):.2f}); goal <= 5 s. "
          f"{n_files} recorded outputs checked by stat key.")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs of each (default 2)")
    ap.add_argument("--commit", default="HEAD", help="the commit to measure (default HEAD)")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _publish import published

    with published("verify-cost", "What integrity costs"):
        main(a.runs, a.commit)
