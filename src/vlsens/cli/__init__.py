"""The ``vlsens`` command: one command from a checkpoint to the folder to ship.

    vlsens run /models/Qwen2.5-VL-3B-Instruct --goal deploy-int4        # the INT4 folder, and which to ship
    vlsens run CKPT --sizes 448x448 -n                                   # what the whole DAG would run
    vlsens run CKPT --config my.yaml --set deploy.precisions=fp32,int4-mixed
    vlsens run CKPT --profile slurm -- --jobs 20                         # on SLURM (profiles/slurm)
    vlsens records results/Qwen2.5-VL-3B-Instruct                        # check the run's records
    vlsens recommend results/Qwen2.5-VL-3B-Instruct                      # which folder to ship, again
    vlsens upgrade --check --config results/Qwen2.5-VL-3B-Instruct/run.yaml   # after pip install -U torch: what re-runs

``run`` writes the config it runs with to ``<dir>/results/<name>/run.yaml`` once the run goes ahead
(not for ``-n``, ``--unlock`` or a run refused before any job; the checkpoint, the
goal, and every flag below; it extends the workflow's ``config/config.yaml`` and the ``--config``
files, in that order) and runs the same Snakemake workflow ``make run`` runs, in ``<dir>`` (the
current directory unless ``--dir``): the results under ``<dir>/results/<name>/``, Snakemake's own
state in ``<dir>/.snakemake/``, nothing anywhere else. It prints one line per finished job with an
estimate of the time left, the jobs' own warnings and errors, and at the end what was built, which
folder to ship per device and what was missed (``-v``: Snakemake's own output instead). Everything
after ``--`` goes to Snakemake as it is. The workflow is the source checkout vlsens is installed
from (``pip install -e``), or ``$VLSENS_WORKFLOW``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def workflow_dir() -> Path:
    """The folder holding the ``Snakefile`` (the source checkout, or ``$VLSENS_WORKFLOW``)."""
    env = os.environ.get("VLSENS_WORKFLOW")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[3])  # src/vlsens/cli/__init__.py -> the checkout
    for c in candidates:
        if (c / "Snakefile").is_file() and (c / "rules").is_dir():
            return c
    raise SystemExit("vlsens: no workflow found (a folder with Snakefile and rules/): install vlsens from its source "
                     "checkout (pip install -e <checkout>) or set VLSENS_WORKFLOW to that checkout")


def _run_parser(sub) -> None:
    from vlsens.config import GOALS

    r = sub.add_parser("run", help="run the workflow on a checkpoint: build what the goal needs, then say which "
                                   "folder to ship", description="Run the workflow on a checkpoint.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="goals:\n" + "\n".join(f"  {g:12} {d}" for g, d in GOALS.items()))
    r.add_argument("checkpoint", help="a local Hugging Face Qwen2-VL / Qwen2.5-VL / Qwen3-VL directory, or a preset "
                                      "(tiny, tiny-qwen2vl, tiny-qwen3vl, 3b)")
    r.add_argument("targets", nargs="*", metavar="TARGET",
                   help="files or folders to build instead of the goal's (paths relative to --dir, "
                        "e.g. results/<name>/deploy/int4-mixed)")
    r.add_argument("--goal", choices=list(GOALS), help="what to build (default all; see goals below)")
    r.add_argument("--precisions", nargs="+", metavar="P", help="deploy folders to build (deploy.precisions), e.g. "
                                                               "fp32 int4-mixed")
    r.add_argument("--sizes", nargs="+", metavar="HxW", help="fixed image sizes to export (vision.sizes)")
    r.add_argument("--config", action="append", metavar="FILE", dest="configs",
                   help="a config file (repeatable; each extends config/config.yaml, later ones win)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any config key, dotted (repeatable); a list key takes a,b,c or [a, b, c]")
    r.add_argument("--name", help="results/<name>/ (default: the checkpoint directory's name)")
    r.add_argument("--dir", metavar="DIR", help="the run's folder: results/ and .snakemake/ go there "
                                                "(default: the current directory)")
    r.add_argument("--profile", help="a Snakemake profile: a folder, or one of the workflow's profiles/ (slurm)")
    r.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="cores for the jobs (default: all)")
    r.add_argument("--gpus", type=int, default=1, help="GPUs jobs may take (--resources gpu=N; default 1)")
    r.add_argument("-n", "--dry-run", action="store_true", help="show what would run, run nothing")
    r.add_argument("--unlock", action="store_true", help="remove the lock a killed run left in --dir, run nothing")
    r.add_argument("-v", "--verbose", action="store_true", help="Snakemake's own output instead of one line a job")
    r.add_argument("--strict", action="store_true", help="exit 3 when the run missed a target (recommend.json: missed)")


def _seconds(text: str) -> float:
    """A finite, non-negative number of seconds (NaN would compare false with every job's time)."""
    import math

    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds (a finite number, at least 0)")
    return value


def _upgrade_parser(sub) -> None:
    u = sub.add_parser("upgrade", help="after a library upgrade: re-run what it may change, stop where outputs come "
                                       "out equivalent (early cutoff)",
                       description="Re-run the jobs whose libraries or code changed, in phases; downstream of an "
                                   "output that came out equivalent to its previous version nothing runs.")
    u.add_argument("targets", nargs="*", metavar="TARGET", help="files or folders (default: the workflow's)")
    u.add_argument("--config", action="append", metavar="FILE", dest="configs",
                   help="the run's config files, as given to snakemake --configfile (a `vlsens run`: "
                        "results/<name>/run.yaml)")
    u.add_argument("--dir", metavar="DIR", help="the run's folder (default: the current directory)")
    u.add_argument("--profile", help="a Snakemake profile: a folder, or one of the workflow's profiles/ (slurm)")
    u.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="cores for the jobs (default: all)")
    u.add_argument("--gpus", type=int, default=1, help="GPUs jobs may take (--resources gpu=N; default 1)")
    u.add_argument("--check", action="store_true", help="say what would run, run only the phases that fit "
                                                        "--check-seconds, then print the plan left")
    u.add_argument("--check-seconds", type=_seconds, default=300.0, metavar="S",
                   help="with --check: run a phase when its jobs took at most S seconds last time (default 300)")
    u.add_argument("-v", "--verbose", action="store_true", help="Snakemake's own output instead of one line a job")


def parser() -> argparse.ArgumentParser:
    from vlsens import __version__

    ap = argparse.ArgumentParser(prog="vlsens", description=__doc__.split("\n\n")[0],
                                 epilog="vlsens COMMAND --help: that command's flags")
    ap.add_argument("--version", action="version", version=f"vlsens {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_parser(sub)
    _upgrade_parser(sub)
    c = sub.add_parser("records", help="check a run's files and JSON records (sizes, hashes, schemas, invariants)")
    c.add_argument("folders", nargs="*", default=["results"], help="run folders (default: results)")
    m = sub.add_parser("recommend", help="which folder to ship per device, from a finished run's recommend.json")
    m.add_argument("folders", nargs="*", default=["results"], help="run folders results/<name> (default: all under "
                                                                   "results/)")
    m.add_argument("--config", metavar="FILE", help="the run of this config file instead (results/<its model name>)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = parser().parse_args(argv)
    if args.command == "run":
        from vlsens.cli.run import cmd_run

        return cmd_run(args, extra, workflow_dir())
    if args.command == "upgrade":
        from vlsens.cli.upgrade import cmd_upgrade

        return cmd_upgrade(args, extra, workflow_dir())
    if args.command == "recommend":
        from vlsens.cli.run import cmd_recommend

        if args.config:
            from vlsens.cli.run import run_name

            args.folders = [str(Path("results") / run_name(workflow_dir(), [Path(args.config)], {"model": {}}))]
        return cmd_recommend(args.folders)
    from vlsens.core.records import _main

    return _main(list(args.folders))


if __name__ == "__main__":
    sys.exit(main())
