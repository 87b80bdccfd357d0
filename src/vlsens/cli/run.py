"""``vlsens run``: the run's config (``<dir>/results/<name>/run.yaml``), Snakemake in ``<dir>``, one
line per finished job, and the closing summary with the recommendation (``recommend.md``)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
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
    if args.unlock:
        cmd.append("--unlock")
    return cmd + extra + ["--", *args.targets] if args.targets else cmd + extra


#: Snakemake's first line of a run that goes ahead (jobs to run, or nothing to do): until it, the
#: run has written nothing of its own (:func:`_stream` with ``held``)
STARTED = ("Job stats:", "Nothing to be done")


def _stream(cmd: list[str], log_file: Path, progress: Progress | None, run_dir: Path) -> int:
    """Run Snakemake, its output into ``log_file``; each line through ``progress`` (which says what
    to print), or printed as it is (``-v``). The libraries' caches (Snakemake's source cache, ONNX
    Runtime's) go under ``<dir>/.snakemake/cache`` unless ``$XDG_CACHE_HOME`` says otherwise, so a
    run writes nothing outside its folder."""
    return _stream_held(cmd, log_file, progress, run_dir, None)[0]


def _stream_held(cmd: list[str], log_file: Path, progress: Progress | None, run_dir: Path,
                 held: Path | None, go: bool = True) -> tuple[int, bool]:
    """:func:`_stream`, with ``held``: the output is kept in memory until the run goes ahead
    (:data:`STARTED`; never when not ``go``: a dry run, an unlock), then written to ``log_file``;
    a run that never does (refused by validation, a locked folder) leaves it in ``held`` instead.
    Returns (exit status, whether the run went ahead)."""
    import os

    env = {**os.environ, "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or str(run_dir / ".snakemake" / "cache")}
    kept: list[str] = []
    log = None if held is not None else _open_log(log_file)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                          errors="replace", env=env) as proc:
        try:
            for line in proc.stdout:
                if log is None and go and line.startswith(STARTED):
                    log = _open_log(log_file)
                    log.writelines(kept)
                if log is None:
                    kept.append(line)
                else:
                    log.write(line)
                out = progress.feed(line.rstrip("\n")) if progress else [line.rstrip("\n")]
                for o in out:
                    print(o, flush=True)
            return proc.wait(), log is not None
        except KeyboardInterrupt:  # Snakemake got the same signal: let it put the previous outputs back
            return proc.wait() or 130, log is not None
        finally:
            if log is not None:
                log.close()
            elif held is not None:
                held.parent.mkdir(parents=True, exist_ok=True)
                held.write_text("".join(kept), encoding="utf-8")


def _open_log(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", encoding="utf-8")


def _changes(old: dict, new: dict, where: str = "") -> list[str]:
    """``key: old -> new`` for every key whose value differs between two run configs."""
    out = []
    for k in sorted(set(old) | set(new), key=str):
        key = f"{where}.{k}" if where else str(k)
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changes(a, b, key)
        elif a != b:
            out.append(f"{key}: {'(unset)' if a is None else a} -> {'(unset)' if b is None else b}")
    return out


def config_text(configs: list[Path], cfg: dict) -> str:
    """``run.yaml``: the run's own keys, under a line naming the config files they extend."""
    return ("# written by `vlsens run`; extends config/config.yaml of the workflow"
            + "".join(f" and {c}" for c in configs) + "\n" + yaml.safe_dump(cfg, sort_keys=False))


def _keep_config(config_file: Path, cfg: dict, text: str) -> None:
    """Write the config of a run that went ahead to ``config_file``, saying what changed since the
    last run there."""
    from vlsens.core.fsutil import atomic_file

    if config_file.is_file():
        old = yaml.safe_load(config_file.read_text()) or {}
        changed = _changes(old, cfg)
        if changed:
            print(f"vlsens: this run's config differs from the last one's ({config_file}): " + "; ".join(changed))
    with atomic_file(config_file) as tmp:
        tmp.write_text(text)


def cmd_run(args, extra: list[str], workflow: Path) -> int:
    cfg = run_config(args)
    configs = [Path(c).resolve() for c in args.configs or []]
    for c in configs:
        if not c.is_file():
            raise _fail(f"--config {c}: no such file")
    name = run_name(workflow, configs, cfg)
    run_dir = Path(args.dir or ".").resolve()
    root = run_dir / "results" / name
    config_file, log_file = root / "run.yaml", root / "logs" / "vlsens-run.log"
    text = config_text(configs, cfg)
    go = not (args.dry_run or args.unlock)  # a dry run and an unlock write nothing in results/, run.yaml included
    goal = cfg.get("goal") or "as the config says"
    print(f"vlsens: {name}, goal {goal}: config {config_file}{'' if go else ' (not written: nothing runs)'}; "
          f"Snakemake's output {log_file if go else 'on the console only'}", flush=True)
    start = time.monotonic()
    progress = None if args.verbose else Progress(dry_run=args.dry_run)
    with tempfile.TemporaryDirectory(prefix="vlsens-run-") as scratch:
        staged = Path(scratch) / "run.yaml"  # Snakemake reads it; results/<name>/run.yaml once the run goes ahead
        staged.write_text(text)
        cmd = snakemake_command(args, workflow, run_dir, [*configs, staged], extra)
        held = run_dir / ".snakemake" / "log" / "vlsens-run-not-started.log"
        rc, went = _stream_held(cmd, log_file, progress, run_dir, held, go)
    if went:
        _keep_config(config_file, cfg, text)
    if progress:
        for line in progress.closing(rc, log_file if went else held):
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
