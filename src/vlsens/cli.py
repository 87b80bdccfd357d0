"""The ``vlsens`` command: one command from a checkpoint to the workflow's results.

    vlsens run /models/Qwen2.5-VL-3B-Instruct --sizes 448x448          # the whole DAG, here
    vlsens run /models/Qwen2.5-VL-3B-Instruct --sizes 448x448 -n       # what would run
    vlsens run CKPT --profile slurm -- --jobs 20                       # on SLURM (profiles/slurm)
    vlsens records results/Qwen2.5-VL-3B-Instruct                      # check the run's records

``run`` writes the config it runs with (``vlsens-<name>.yaml`` in the current directory: the
checkpoint, the sizes and any ``--set key=value``; it extends the workflow's ``config/config.yaml``
like every ``--configfile``) and runs the same Snakemake workflow ``make run`` runs, with results
under ``./results/<name>/``. Everything after ``--`` goes to Snakemake as it is. The workflow is
the source checkout vlsens is installed from (``pip install -e``), or ``$VLSENS_WORKFLOW``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml


def workflow_dir() -> Path:
    """The folder holding the ``Snakefile`` (the source checkout, or ``$VLSENS_WORKFLOW``)."""
    env = os.environ.get("VLSENS_WORKFLOW")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2])  # src/vlsens/cli.py -> the checkout
    for c in candidates:
        if (c / "Snakefile").is_file() and (c / "rules").is_dir():
            return c
    raise SystemExit("vlsens: no workflow found (a folder with Snakefile and rules/): install vlsens from its source "
                     "checkout (pip install -e <checkout>) or set VLSENS_WORKFLOW to that checkout")


def run_config(args) -> dict:
    cfg: dict = {"model": {"checkpoint": str(Path(args.checkpoint).resolve()) if Path(args.checkpoint).exists()
                           else args.checkpoint}}
    if args.name:
        cfg["model"]["name"] = args.name
    if args.sizes:
        cfg["vision"] = {"sizes": list(args.sizes)}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"vlsens: --set {item!r}: expected key=value (e.g. vision.batch_size=2)")
        node = cfg
        *parents, last = key.split(".")
        if not key or not all(key.split(".")):
            raise SystemExit(f"vlsens: --set {item!r}: the key is empty or has an empty part (e.g. vision.batch_size=2)")
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SystemExit(f"vlsens: --set {item!r}: {'.'.join(parents[:i + 1])} is already the value "
                                 f"{node!r}, not a section with keys")
        try:
            node[last] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise SystemExit(f"vlsens: --set {item!r}: the value is not YAML ({str(e).splitlines()[0]})") from None
    return cfg


def cmd_run(args, extra: list[str]) -> int:
    from vlsens.config import model_name
    from vlsens.core.errors import ConfigError

    wf = workflow_dir()
    cfg = run_config(args)
    try:
        name = model_name({"model": dict(cfg["model"])})
    except ConfigError as e:
        raise SystemExit(f"vlsens: {e}") from None
    config_file = Path(args.write_config or f"vlsens-{name}.yaml")
    config_file.write_text("# written by `vlsens run`; extends config/config.yaml of the workflow\n"
                           + yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(wf / "Snakefile"), "--directory", str(Path.cwd()),
           "--configfile", str(config_file), "--cores", str(args.cores), "--resources", f"gpu={args.gpus}"]
    if args.profile:
        prof = Path(args.profile)
        cmd += ["--workflow-profile", str(prof if prof.is_dir() else wf / "profiles" / args.profile)]
    if args.dry_run:
        cmd.append("-n")
    cmd += extra
    print("vlsens: config", config_file, "->", " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="vlsens", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the workflow on a checkpoint (writes vlsens-<name>.yaml, runs Snakemake)")
    r.add_argument("checkpoint", help="a local Hugging Face Qwen2-VL / Qwen2.5-VL / Qwen3-VL directory, or a preset "
                                      "(tiny, tiny-qwen2vl, tiny-qwen3vl, 3b)")
    r.add_argument("--sizes", nargs="+", metavar="HxW", help="fixed image sizes to export (vision.sizes)")
    r.add_argument("--name", help="results/<name>/ (default: the checkpoint directory's name)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config key, dotted (repeatable)")
    r.add_argument("--profile", help="a Snakemake profile: a folder, or one of the workflow's profiles/ (slurm)")
    r.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    r.add_argument("--gpus", type=int, default=1, help="GPUs jobs may take (--resources gpu=N)")
    r.add_argument("-n", "--dry-run", action="store_true", help="show what would run")
    r.add_argument("--write-config", metavar="FILE", help="where to write the config (default vlsens-<name>.yaml)")
    c = sub.add_parser("records", help="check a run's JSON records against their schemas")
    c.add_argument("folders", nargs="*", default=["results"])
    args = ap.parse_args(argv)
    if args.command == "run":
        return cmd_run(args, extra)
    from vlsens.core.records import _main

    return _main(list(args.folders))


if __name__ == "__main__":
    sys.exit(main())
