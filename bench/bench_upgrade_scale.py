#!/usr/bin/env python
"""Early cutoff at real size: one library's recorded version changed on a finished ``make scale``
(the Qwen2.5-VL-3B widths, ``config/scale.yaml``), in place, and what ``vlsens upgrade`` costs
next to the jobs that must run.

    python bench/bench_upgrade_scale.py [--dir .] [--config config/scale.yaml] [--model 3b]
                                        [--library torch] [--alone] [--publish]

The run folder must hold a finished run of the config (``snakemake -n`` empty). The library's
version changes through ``VLSENS_VERSION_OVERRIDES`` (every job that records it sees a new
version; the code is the same, so its outputs should come out equivalent). Columns:

- **plain run**: the jobs ``snakemake -n`` lists with the override, timed by their last benchmark
  files (what Snakemake alone would re-run);
- **must run**: the jobs whose records name the library;
- **upgrade**: ``vlsens upgrade``'s wall time, its phases and the jobs it ran; **in phases**: the
  phases' own wall time (Snakemake runs of the jobs), the rest being the DAG reads, comparisons
  and dating between them;
- **upgrade / jobs' own time**: the wall time against the sum of the benchmark files' seconds of
  the jobs it ran;
- **alone** (``--alone``): afterwards, the same jobs forced in one plain Snakemake run with
  nothing downstream: the time of those stages alone, the floor; **ratio**: upgrade / alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

import bench_upgrade  # noqa: E402
from bench_upgrade import clock, jobs_recording  # noqa: E402

from vlsens.dag.cutoff import estimate, parse_dry_run  # noqa: E402


def snakemake(run_dir: Path, config: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return bench_upgrade.snakemake(run_dir, "--configfile", str(config), "--cores", "2", "--resources", "gpu=1",
                                   *args, env=env)


def dry(run_dir: Path, config: Path, env: dict) -> list:
    """The jobs ``snakemake -n`` lists."""
    r = snakemake(run_dir, config, env, "-n")
    return parse_dry_run(r.stdout + r.stderr)


def measure(run_dir: Path, config: Path, model: str, library: str, alone: bool) -> dict:
    env = {**os.environ, "VLSENS_VERSION_OVERRIDES": f"{library}=99.0", "VLSENS_WORKFLOW": str(REPO),
           "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    os.chdir(run_dir)  # benchmark paths are relative to the run's folder
    plain = dry(run_dir, config, env)
    must = jobs_recording(run_dir / "results" / model, library)
    must_before = estimate(j for j in plain if j.key in must)[0]
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "vlsens.cli", "upgrade", "--dir", str(run_dir), "--config", str(config),
                        "--cores", "2", "--gpus", "1"], capture_output=True, text=True, env=env, cwd=run_dir)
    seconds = time.monotonic() - t
    if r.returncode:
        raise SystemExit("vlsens upgrade failed:\n" + (r.stdout + r.stderr)[-3000:])
    ledger = json.loads((run_dir / "results" / model / "upgrade.json").read_text())
    left = dry(run_dir, config, env)
    phases = ledger["phases"]
    written = sorted({o for p in phases for o in p["equivalent"] + p["changed"]})
    labels = {label for p in phases for label in p["jobs"]}
    out = {"library": library, "plain": len(plain), "plain_s": estimate(plain)[0], "must": len(must),
           "ran": sum(len(p["jobs"]) for p in phases), "phases": len(phases), "seconds": seconds,
           "in_phases": sum(p["seconds"] for p in phases), "dated": len(ledger["touched"]), "left": len(left),
           "equivalent": sum(len(p["equivalent"]) for p in phases), "changed": sum(len(p["changed"]) for p in phases),
           "must_before": must_before, "jobs_s": estimate(j for j in plain if j.label in labels)[0]}
    if alone:
        t = time.monotonic()
        r = snakemake(run_dir, config, env, "--forcerun", *written, "--", *written)
        if r.returncode:
            raise SystemExit("the forced run of the same jobs failed:\n" + (r.stdout + r.stderr)[-3000:])
        out["alone"] = time.monotonic() - t
        out["alone_jobs"] = len(parse_dry_run(r.stdout + r.stderr))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("."), help="the run's folder (results/ and .snakemake/)")
    ap.add_argument("--config", type=Path, default=REPO / "config" / "scale.yaml")
    ap.add_argument("--model", default="3b", help="results/<model>/")
    ap.add_argument("--library", default="torch")
    ap.add_argument("--alone", action="store_true", help="then force the same jobs in one plain run (the floor)")
    ap.add_argument("--publish", action="store_true")
    a = ap.parse_args()
    r = measure(a.dir.resolve(), a.config.resolve(), a.model, a.library, a.alone)
    print(f"results/{a.model}, `{a.config.name}`, library {a.library}\n")
    print("| plain run: jobs (time) | must run (time, last run) | upgrade: wall | phases | jobs ran (their own time) | "
          "in phases | dated | outputs equivalent / changed | nothing left | upgrade / jobs' own time | "
          "alone: wall (jobs) | upgrade / alone |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | --- | --- | ---: | --- | ---: |")
    alone = f"{clock(r['alone'])} ({r['alone_jobs']})" if "alone" in r else "-"
    ratio = f"{r['seconds'] / r['alone']:.2f}x" if "alone" in r else "-"
    left = "yes" if not r["left"] else f"no ({r['left']})"
    print(f"| {r['plain']} ({clock(r['plain_s'])}) | {r['must']} ({clock(r['must_before'])}) | {clock(r['seconds'])} | "
          f"{r['phases']} | {r['ran']} ({clock(r['jobs_s'])}) | {clock(r['in_phases'])} | {r['dated']} | "
          f"{r['equivalent']} / {r['changed']} | {left} | {r['seconds'] / r['jobs_s']:.2f}x | {alone} | {ratio} |")
    print("\njobs' own time: the sum of the benchmark files' seconds of the jobs the upgrade ran (at real size "
          "each job reserves every core, so they run one after the other); must run (time, last run): the same "
          "from the run before.")


if __name__ == "__main__":
    from _publish import published

    with published(f"upgrade-{sys.argv[sys.argv.index('--model') + 1] if '--model' in sys.argv else '3b'}",
                   "Early cutoff at real size (make scale)"):
        main()
