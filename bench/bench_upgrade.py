"""Early cutoff on the default run: after one library's recorded version changes, what a plain
``snakemake`` would re-run, what ``vlsens upgrade`` runs and dates as up to date, how long it takes,
and whether the results equal the run before it.

    python bench/bench_upgrade.py [--base DIR] [--libraries torch onnxruntime onnx] [--publish]

A library's version changes through ``VLSENS_VERSION_OVERRIDES`` (the jobs that record it see a new
version; the code that runs is the same, so every output that is not a measured time should come
out equivalent: the case early cutoff is for). ``--base``: a folder holding a finished run of the
default config (``results/tiny`` and ``.snakemake``); without it the script runs one from scratch
in a scratch folder first. Each library starts from a copy of it. Columns:

- **plain run**: the jobs ``snakemake -n`` lists with the override, and their time by their last
  benchmark files;
- **must run**: the jobs whose records name the library (their params change): the floor;
- **ran** / **dated**: the jobs ``vlsens upgrade`` ran (in how many phases) and those it dated as
  up to date instead (every input they read came out equivalent);
- **equal**: ``bench/compare_runs.py`` between the upgraded run and the run before it (every
  graph, array, table and record value but times): 0 differences is the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from _publish import published  # noqa: E402

from vlsens.dag.cutoff import estimate, parse_dry_run  # noqa: E402

MODEL = "tiny"


def snakemake(wd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(wd), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=wd)


def from_scratch(wd: Path) -> float:
    wd.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    r = snakemake(wd, "--cores", "2", "--resources", "gpu=1")
    if r.returncode:
        raise SystemExit("the run from scratch failed:\n" + (r.stdout + r.stderr)[-3000:])
    return time.monotonic() - t


def jobs_recording(run: Path, library: str) -> set[str]:
    """Jobs (by their first output) whose last run recorded ``library`` among its versions."""
    out = set()
    for rec in run.rglob(".vlsens/*.json"):
        try:
            r = json.loads(rec.read_text())
        except ValueError:
            continue
        if library in ((r.get("provenance") or {}).get("versions") or {}):
            out.add(min(r.get("job_outputs") or [r.get("output")]))
    return out


def upgrade(base: Path, library: str, scratch: Path) -> dict:
    wd = scratch / f"upgrade-{library}"
    shutil.copytree(base, wd, symlinks=True)
    env = {**os.environ, "VLSENS_VERSION_OVERRIDES": f"{library}=99.0", "VLSENS_WORKFLOW": str(REPO)}
    plain = parse_dry_run((lambda r: r.stdout + r.stderr)(snakemake(wd, "-n", "--cores", "2", env=env)))
    must = jobs_recording(wd / "results" / MODEL, library)
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "vlsens.cli", "upgrade", "--dir", str(wd), "--cores", "2"],
                       capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t
    if r.returncode:
        raise SystemExit(f"vlsens upgrade ({library}) failed:\n" + (r.stdout + r.stderr)[-3000:])
    ledger = json.loads((wd / "results" / MODEL / "upgrade.json").read_text())
    after = snakemake(wd, "-n", "--cores", "2", env=env)
    nothing = "Nothing to be done" in after.stdout + after.stderr
    ran = sum(len(p["jobs"]) for p in ledger["phases"])
    plain_s, _ = estimate(plain)
    return {"library": library, "plain": len(plain), "plain_s": plain_s, "must": len(must), "ran": ran,
            "phases": len(ledger["phases"]), "dated": len(ledger["touched"]), "seconds": seconds,
            "nothing_left": nothing, "differences": differing(base, wd)}


def differing(a: Path, b: Path) -> list[str]:
    """The files bench/compare_runs.py finds different between two runs' results."""
    r = subprocess.run([sys.executable, str(REPO / "bench" / "compare_runs.py"), str(a / "results" / MODEL),
                        str(b / "results" / MODEL)], capture_output=True, text=True)
    return [] if r.returncode == 0 else sorted({line.split(":")[0] for line in r.stdout.splitlines()[:-1]})


def compare(a: Path, b: Path) -> str:
    files = differing(a, b)
    return f"differences in {len(files)} file(s): " + ", ".join(files) if files else "no difference"


def clock(s: float) -> str:
    m, s = divmod(int(round(s)), 60)
    return f"{m}:{s:02d}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="a finished run of the default config (made there first when missing)")
    ap.add_argument("--libraries", nargs="+", default=["torch", "onnxruntime", "onnx"])
    ap.add_argument("--twice", action="store_true", help="also a second run from scratch, compared with the first")
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="vlsens-upgrade-"))
    try:
        base = args.base or scratch / "base"
        if not (base / "results" / MODEL).is_dir():
            print(f"A run of the default config from scratch: {clock(from_scratch(base))}.")
        if args.twice:
            second = scratch / "second"
            print(f"A second run from scratch: {clock(from_scratch(second))}; against the first, "
                  f"bench/compare_runs.py finds {compare(base, second)}.")
        rows = [upgrade(base.resolve(), lib, scratch) for lib in args.libraries]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print("| library | plain run: jobs (time) | must run | ran (phases) | dated up to date | upgrade time | "
          "nothing left | results equal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        equal = "no: " + ", ".join(r["differences"][:3]) if r["differences"] else "yes"
        print(f"| {r['library']} | {r['plain']} ({clock(r['plain_s'])}) | {r['must']} | {r['ran']} ({r['phases']}) | "
              f"{r['dated']} | {clock(r['seconds'])} | {'yes' if r['nothing_left'] else 'no'} | {equal} |")
    print("\nplain run: what `snakemake` re-runs after the change, timed by the jobs' last benchmark files; must run: "
          "jobs whose records name the library; ran: jobs `vlsens upgrade` ran; dated: jobs it dated as up to "
          "date (every input they read came out equivalent); nothing left: `snakemake -n` afterwards; results "
          "equal: bench/compare_runs.py against the run before the upgrade.")


if __name__ == "__main__":
    with published("upgrade-tiny", "Early cutoff after a library upgrade (tiny preset, default config)"):
        main()
