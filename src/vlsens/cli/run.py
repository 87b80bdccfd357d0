"""``vlsens run``: the run's config (``<dir>/results/<name>/run.yaml``), Snakemake in ``<dir>``, one
line per finished job, and the closing summary with the recommendation (``recommend.md``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from vlsens.cli.progress import Progress, clock


def _fail(msg: str) -> SystemExit:
    return SystemExit(f"vlsens: {msg}")


def _scalar(value: str):
    """A value as YAML reads it, except a number with an exponent and no dot (``1e-12``), which
    YAML 1.1 reads as text: a number here."""
    from vlsens.config import FLOAT_TEXT

    return float(value) if FLOAT_TEXT.fullmatch(value.strip()) else yaml.safe_load(value)


def set_value(cfg: dict, item: str, schema: dict) -> None:
    """One ``--set key=value`` into ``cfg``: the value read as YAML; a key whose schema holds a list
    takes ``a,b,c`` (or one value) as a list."""
    from vlsens.config import takes_list

    key, sep, value = item.partition("=")
    if not sep:
        raise _fail(f"--set {item!r}: expected key=value (e.g. vision.batch_size=2)")
    if not key or not all(key.split(".")):
        raise _fail(f"--set {item!r}: the key is empty or has an empty part (e.g. vision.batch_size=2)")
    *parents, last = key.split(".")
    node = cfg
    for i, p in enumerate(parents):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise _fail(f"--set {item!r}: {'.'.join(parents[:i + 1])} is already the value {node!r}, not a section "
                        "with keys")
    try:
        parsed = _scalar(value)
        if takes_list(key, schema) and not isinstance(parsed, list):
            parsed = [_scalar(v.strip()) for v in value.split(",")] if "," in value else [parsed]
    except yaml.YAMLError as e:
        raise _fail(f"--set {item!r}: the value is not YAML ({str(e).splitlines()[0]})") from None
    node[last] = parsed


def run_config(args) -> dict:
    """The config the flags say (it extends config/config.yaml and the --config files)."""
    from vlsens.config import load_schema

    ckpt = args.checkpoint
    cfg: dict = {"model": {"checkpoint": str(Path(ckpt).resolve()) if Path(ckpt).exists() else ckpt}}
    if args.name:
        cfg["model"]["name"] = args.name
    if args.goal:
        cfg["goal"] = args.goal
    if args.sizes:
        cfg["vision"] = {"sizes": list(args.sizes)}
    if args.precisions:
        if args.goal == "deploy-int4":
            raise _fail("--precisions with --goal deploy-int4: that goal builds the fp32 and int4-mixed folders; "
                        "use --goal deploy --precisions ... for others")
        cfg["deploy"] = {"precisions": list(args.precisions)}
    schema = load_schema()
    for item in args.set or []:
        set_value(cfg, item, schema)
    return cfg


def run_name(workflow: Path, configs: list[Path], cfg: dict) -> str:
    """results/<name>/ (:func:`vlsens.config.run_model_name`), a bad file or name as one line."""
    from vlsens.config import run_model_name
    from vlsens.core.errors import ConfigError

    try:
        return run_model_name(workflow / "config" / "config.yaml", configs, cfg["model"])
    except ConfigError as e:
        raise _fail(str(e)) from None


def snakemake_command(args, workflow: Path, run_dir: Path, configs: list[Path], extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(workflow / "Snakefile"), "--directory", str(run_dir),
           "--configfile", *map(str, configs), "--cores", str(args.cores), "--resources", f"gpu={args.gpus}"]
    if args.profile:
        prof = Path(args.profile)
        cmd += ["--workflow-profile", str(prof if prof.is_dir() else workflow / "profiles" / args.profile)]
    if args.dry_run:
        cmd.append("-n")
    if getattr(args, "unlock", False):
        cmd.append("--unlock")
    return cmd + extra + ["--", *args.targets] if args.targets else cmd + extra


def _stream(cmd: list[str], log_file: Path, progress: Progress | None, run_dir: Path) -> int:
    """Run Snakemake, its output into ``log_file``; each line through ``progress`` (which says what
    to print), or printed as it is (``-v``). The libraries' caches (Snakemake's source cache, ONNX
    Runtime's) go under ``<dir>/.snakemake/cache`` unless ``$XDG_CACHE_HOME`` says otherwise, so a
    run writes nothing outside its folder."""
    import os

    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or str(run_dir / ".snakemake" / "cache")}
    with open(log_file, "w", encoding="utf-8") as log, \
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                             errors="replace", env=env) as proc:
        try:
            for line in proc.stdout:
                log.write(line)
                out = progress.feed(line.rstrip("\n")) if progress else [line.rstrip("\n")]
                for o in out:
                    print(o, flush=True)
            return proc.wait()
        except KeyboardInterrupt:  # Snakemake got the same signal: let it put the previous outputs back
            return proc.wait() or 130


def cmd_run(args, extra: list[str], workflow: Path) -> int:
    cfg = run_config(args)
    configs = [Path(c).resolve() for c in args.configs or []]
    for c in configs:
        if not c.is_file():
            raise _fail(f"--config {c}: no such file")
    name = run_name(workflow, configs, cfg)
    run_dir = Path(args.dir or ".").resolve()
    root = run_dir / "results" / name
    root.mkdir(parents=True, exist_ok=True)
    config_file = root / "run.yaml"
    config_file.write_text("# written by `vlsens run`; extends config/config.yaml of the workflow"
                           + "".join(f" and {c}" for c in configs) + "\n" + yaml.safe_dump(cfg, sort_keys=False))
    cmd = snakemake_command(args, workflow, run_dir, [*configs, config_file], extra)
    log_file = root / "logs" / "vlsens-run.log"
    goal = cfg.get("goal") or "as the config says"
    print(f"vlsens: {name}, goal {goal}: config {config_file}; Snakemake's output {log_file}", flush=True)
    start = time.monotonic()
    progress = None if args.verbose else Progress(dry_run=args.dry_run)
    rc = _stream(cmd, log_file, progress, run_dir)
    if progress:
        for line in progress.closing(rc, log_file):
            print(line)
    if args.unlock and not rc:
        print(f"vlsens: the lock in {run_dir} is removed; run the command again without --unlock")
    if rc or args.dry_run or args.unlock:
        return rc
    print(f"vlsens: done in {clock(time.monotonic() - start)}; results in {root}/")
    if args.targets:  # what was asked for by name; the recommendation is a goal's (it may predate these)
        print("vlsens: built " + ", ".join(str(run_dir / t) for t in args.targets))
        return 0
    missed = print_recommendation(root)
    if missed and args.strict:
        print(f"vlsens: --strict: {len(missed)} target(s) missed", file=sys.stderr)
        return 3
    return 0


def print_recommendation(root: Path) -> list[str]:
    """The run's recommendation as a person reads it (recommend.md without its table); returns what
    was missed."""
    rec_file = root / "recommend.json"
    if not rec_file.is_file():
        print(f"vlsens: no recommendation for {root} (its goal builds no deploy folder or NPU part)")
        return []
    from vlsens.report.recommend import markdown

    rec = json.loads(rec_file.read_text())
    text = markdown(rec)
    print("\n" + text[:text.index("\n| folder |")].strip() + f"\n(every folder: {root / 'recommend.md'})")
    return rec["missed"]


def cmd_recommend(folders: list[str]) -> int:
    """Print the recommendation of each run folder (or of each run under a folder such as
    ``results``); a folder whose run built nothing to ship says so; a missing folder is exit 2."""
    status = 0
    for f in map(Path, folders):
        roots = [f] if (f / "recommend.json").is_file() else sorted(p.parent for p in f.glob("*/recommend.json"))
        if not f.is_dir():
            print(f"vlsens: {f}: no such folder (give results/<name> of a run)", file=sys.stderr)
            status = 2
        elif not roots:
            print(f"vlsens: {f}: no recommend.json (a run whose goal builds deploy folders or NPU parts writes "
                  "results/<name>/recommend.json)")
        for r in roots:
            print(f"{r}:")
            print_recommendation(r)
    return status
