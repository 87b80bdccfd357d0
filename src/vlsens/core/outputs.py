"""Every file a job writes, recorded with its size and SHA-256; every job checks its inputs
against those records, and the DAG build checks the whole run.

A job's outputs (files, and every file inside a ``directory()`` output) are recorded when the job
has written them (:func:`record_outputs`, called by :func:`vlsens.core.scripting.run`), in a
hidden folder beside each output: ``<dir>/.vlsens/<name>.json`` (beside, not inside, a deploy
folder, which ships as it is). The ONNX graphs keep their own records too
(:mod:`vlsens.core.artifacts`); these cover what those do not: CSV, YAML, JSON, NPZ, tar, PNG and
every file of a folder.

**What a check costs.** A file whose stat key (size, mtime, ctime, inode) is the one recorded
is taken as unchanged without reading it; any other is hashed in full and compared with the
recorded SHA-256. An edit that restores the mtime (``cp -p``, ``touch -r``) still changes the
ctime, which no user can set, so it is hashed and found; a ``touch`` or a copy of the results
folder changes the key but not the hash: the DAG build's check then stores the new key
(``update``), so the file is hashed once, not at every run.

**Where it is checked.** (1) Every job, before it runs, checks the recorded outputs among its
inputs (:func:`verify_paths`): a changed file fails the job with one line naming the file, its
record and the command that rebuilds it. (2) The DAG build checks every record of the run
(:func:`check_run`): a file changed with its mtime kept is a file Snakemake would not re-run
anything for, so the run refuses to start, naming it. A file changed with a newer mtime makes
Snakemake re-run its consumers, which then fail at (1) until it is rebuilt. A missing output is
Snakemake's to rebuild, and is not reported.

**A failed job keeps the previous output.** Snakemake deletes a job's outputs before the job
runs, so a job that then fails would leave nothing where a good folder was. Instead, when the run
starts, each output a job of the run will write is moved aside with its record
(:func:`keep_previous`: a rename into ``<dir>/.vlsens/previous/``, no copy); a job that completes
drops it (:func:`drop_previous`), and when the run ends (or, after a run that was killed, when the
next run builds its DAG) every output that is still missing gets its previous version back
(:func:`restore_previous`), dated just before its job's inputs, so the next run builds it again
while the old one stays usable until then.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from vlsens.core.errors import VlsensError

RECORD_DIR = ".vlsens"
#: files Snakemake itself writes inside a directory output after the job
IGNORED = (".snakemake_timestamp",)
#: where an output's previous version waits while its job runs again (inside RECORD_DIR)
PREVIOUS = "previous"


def record_path(output: str | Path) -> Path:
    output = Path(output)
    return output.parent / RECORD_DIR / f"{output.name}.json"


def _key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _files(output: Path) -> list[tuple[str, Path]]:
    """``(name in the record, path)`` of an output: itself, or every file under a folder."""
    if output.is_dir():
        return sorted((str(p.relative_to(output)), p) for p in output.rglob("*")
                      if p.is_file() and p.name not in IGNORED and RECORD_DIR not in p.relative_to(output).parts)
    return [(output.name, output)]


def record_outputs(outputs: Iterable[str | Path], rule: str, provenance: dict | None = None) -> int:
    """Record every existing output's files (size, SHA-256, stat key) and what the job ran with
    (``provenance``: its rule's library versions and code hash); where the output's previous
    version waits aside (:func:`keep_previous`), whether the new one is equivalent to it
    (:func:`cutoff`). Returns how many files."""
    from vlsens.core.fsutil import file_sha256, write_json

    n, outputs = 0, [str(o) for o in outputs]
    for out in map(Path, outputs):
        if not out.exists():
            continue
        entries = {}
        for name, p in _files(out):
            st = p.stat()
            entries[name] = {"bytes": st.st_size, "sha256": file_sha256(p), "stat": _key(st)}
        rec = {"rule": rule, "output": str(out), "job_outputs": outputs, "kind": "folder" if out.is_dir() else "file",
               "files": entries}
        if provenance is not None:
            rec["provenance"] = provenance
        cut = cutoff(out, provenance)
        if cut is not None:
            rec["cutoff"] = cut
        rec["content_since"] = _content_since(out, cut)
        write_json(record_path(out), rec)
        n += len(entries)
    return n


def _content_since(output: Path, cut: dict | None) -> float:
    """Since when ``output`` has held its content: now (its modification time) for new content;
    for content equivalent to its previous version's, the previous version's ``content_since`` (or
    its time, for a record written before this field). A job whose outputs are newer than that
    read this content (:mod:`vlsens.dag.cutoff`)."""
    if cut is None or not cut.get("equivalent"):
        return output_mtime(output)
    prev = _load(_kept_files(output)[1]) or {}
    since = prev.get("content_since")
    return float(since) if isinstance(since, int | float) else float(cut["previous_mtime"])


def output_mtime(output: str | Path) -> float:
    """What Snakemake takes as the modification time of ``output``: a folder's
    ``.snakemake_timestamp`` where it has one, else the path's own."""
    output = Path(output)
    stamp = output / ".snakemake_timestamp"
    return (stamp if output.is_dir() and stamp.is_file() else output).stat().st_mtime


def changed_versions(before: dict, now: dict) -> dict[str, list[str]]:
    """``{library: [version before, version now]}`` of the versions that differ between two
    ``provenance`` params (:func:`vlsens.core.versions.provenance`)."""
    b, n = before.get("versions") or {}, now.get("versions") or {}
    return {k: [b.get(k, "not recorded"), n.get(k, "not recorded")] for k in sorted(set(b) | set(n))
            if b.get(k) != n.get(k)}


def cutoff(output: str | Path, provenance: dict | None = None) -> dict | None:
    """The early-cutoff verdict of a job's new ``output`` against its previous version (kept aside
    while the job ran, :func:`keep_previous`), or None when there is none: ``equivalent`` (the same
    canonical content, :mod:`vlsens.core.canonical`: what a consumer computes with), the files
    that differ, when the previous version was written (its consumers made after that time read
    the same content), and which library versions and code were checked against it."""
    import datetime

    from vlsens.core.canonical import differences

    output = Path(output)
    prev, prev_rec, _ = _kept_files(output)
    if not os.path.lexists(prev):
        return None
    try:
        differ = differences(output, prev, first=True)
    except Exception as e:  # a damaged previous version (a --forcerun of an edited file): it is not this output
        differ = [f"{output.name}: the previous version could not be read ({type(e).__name__})"]
    before = (_load(prev_rec) or {}).get("provenance") or {}
    out = {"equivalent": not differ, "differs": differ, "previous_mtime": output_mtime(prev),
           "checked": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if provenance is not None:
        out["libraries"] = changed_versions(before, provenance) if before else "not recorded before"
        out["code_changed"] = before.get("code") != provenance.get("code") if before else None
    return out


def forget(outputs: Iterable[str | Path]) -> None:
    """Remove the records of ``outputs`` (a job about to write them anew: while it runs, what it
    writes is checked against nothing stale, e.g. a folder it loads to measure)."""
    for out in outputs:
        record_path(out).unlink(missing_ok=True)


def _target(output: Path, rec: dict) -> str:
    """What to force to rebuild ``output``: its job's model graph where it wrote one (the name
    Snakemake knows the model folder by), else the output itself."""
    main = [o for o in rec.get("job_outputs") or [] if Path(o).name == "model.onnx"]
    return main[0] if main else str(output)


def _load(record: Path) -> dict | None:
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None


def check_output(output: str | Path, update: bool = False) -> list[str]:
    """What differs between ``output`` and its record (one line each; none without a record or
    when the output is missing): a file changed (its hash), gone from a folder, or added to one.
    ``update``: store the stat key of files whose content is unchanged."""
    from vlsens.core.fsutil import file_sha256, write_json

    output = Path(output)
    rp = record_path(output)
    if not rp.is_file() or not os.path.lexists(output):
        return []
    rec = _load(rp)
    if not isinstance(rec, dict) or not isinstance(rec.get("files"), dict) or not all(
            isinstance(f, dict) and {"bytes", "sha256"} <= set(f) for f in rec["files"].values()):
        # a damaged record checks nothing: the output cannot be told from a changed one
        return [f"{rp}: the record of {output} is damaged (not the JSON its job wrote), so {output} cannot be "
                f"checked; rebuild it with snakemake --forcerun {output}"]
    rebuild = f"rebuild it with snakemake --forcerun {_target(output, rec)}"
    problems, changed_key = [], False
    have = dict(_files(output))
    for name, want in rec["files"].items():
        p = have.pop(name, None)
        shown = output / name if rec.get("kind") == "folder" else output
        if p is None:
            problems.append(f"{shown}: missing, but {rp} (rule {rec.get('rule')}) records it; {rebuild}")
            continue
        st = p.stat()
        if _key(st) == want.get("stat"):
            continue
        digest = file_sha256(p) if st.st_size == want["bytes"] else None
        if digest != want["sha256"]:
            how = "truncated" if st.st_size < want["bytes"] else "edited"
            problems.append(f"{shown}: {st.st_size} bytes" + (f", sha256 {digest[:12]}…" if digest else "")
                            + f", but {rp} records {want['bytes']} bytes, sha256 {want['sha256'][:12]}… as rule "
                            f"{rec.get('rule')} wrote it: {how} afterwards; {rebuild}")
        elif update:
            want["stat"], changed_key = _key(st), True
    for name in have:
        problems.append(f"{output / name}: not in {rp} (rule {rec.get('rule')}): added after the folder was written; "
                        f"{rebuild}")
    if update and changed_key and not problems:
        write_json(rp, rec)
    return problems


def verify_paths(paths: Iterable[str | Path]) -> int:
    """Check every input that has a record (:func:`check_output`); raise a VlsensError with the
    first problem (and how many more) when one differs. Returns how many were checked."""
    n, problems = 0, []
    for p in map(Path, paths):
        if record_path(p).is_file():
            n += 1
            problems += check_output(p)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise VlsensError(problems[0] + more)
    return n


def note_touched(output: str | Path, equivalent_inputs: Iterable[str]) -> None:
    """``output`` was dated now because the inputs it read were rewritten with the same content
    (early cutoff, :func:`vlsens.dag.cutoff.touch`): its record stores the new stat keys (only the
    time changed: nothing is hashed) and says so."""
    import datetime

    from vlsens.core.fsutil import write_json

    output = Path(output)
    rec = _load(record_path(output))
    if not isinstance(rec, dict) or not isinstance(rec.get("files"), dict):
        return
    have = dict(_files(output)) if output.exists() else {}
    for name, want in rec["files"].items():
        p = have.get(name)
        if p is not None and isinstance(want, dict) and p.stat().st_size == want.get("bytes"):
            want["stat"] = _key(p.stat())
    rec["touched"] = {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "equivalent_inputs": sorted(equivalent_inputs)}
    write_json(record_path(output), rec)


def records_under(folder: str | Path) -> list[Path]:
    """The outputs recorded under ``folder`` (each record's output path)."""
    out = []
    for rp in sorted(Path(folder).rglob(f"{RECORD_DIR}/*.json")):
        out.append(rp.parent.parent / rp.name.removesuffix(".json"))
    return out


def check_run(folder: str | Path, update: bool = True) -> dict[Path, tuple[str | None, list[str]]]:
    """Every recorded output under ``folder`` checked (:func:`check_output`), stat keys of
    unchanged files refreshed (``update``): ``{output: (its rule, problems)}`` of those that differ."""
    out = {}
    for o in records_under(folder):
        problems = check_output(o, update=update)
        if problems:
            rec = _load(record_path(o)) or {}
            out[o] = (rec.get("rule"), problems)
    return out


def forced_from_argv(argv: list[str]) -> tuple[list[str], bool]:
    """Snakemake's ``--forcerun`` / ``-R`` targets and whether ``--forceall`` / ``-F`` is given, read
    from its command line (the DAG build runs before Snakemake's own settings are at hand)."""
    forced, forceall, taking = [], False, False
    for a in argv:
        if a in ("-F", "--forceall"):
            forceall, taking = True, False
        elif a in ("-R", "--forcerun"):
            taking = True
        elif a.startswith("--forcerun="):
            forced.append(a.split("=", 1)[1])
            taking = True
        elif a.startswith("-"):
            taking = False
        elif taking:
            forced.append(a)
    return forced, forceall


def refusal(changed: dict[Path, tuple[str | None, list[str]]], forced: Iterable[str] = (),
            forceall: bool = False) -> str | None:
    """The DAG build's message for changed outputs (:func:`check_run`) that the run does not
    rebuild anyway (``forced``: Snakemake's ``--forcerun`` files and rules; ``forceall``), else None."""
    if forceall:
        return None
    forced = list(forced)
    files = {Path(f).resolve() for f in forced}

    def rebuilt(o: Path, rule: str | None) -> bool:
        siblings = (_load(record_path(o)) or {}).get("job_outputs") or [str(o)]
        return rule in forced or any(Path(s).resolve() in files for s in [str(o), *siblings])

    left = {o: v for o, v in changed.items() if not rebuilt(o, v[0])}
    if not left:
        return None
    lines = [p for _, ps in left.values() for p in ps]
    more = f"\n  (and {len(lines) - 5} more)" if len(lines) > 5 else ""
    return (f"{len(left)} output(s) of earlier jobs changed after they were written, which Snakemake does not see "
            "(their mtime kept); nothing reads them until they are rebuilt:\n  " + "\n  ".join(lines[:5]) + more
            + "\n  rebuild them: snakemake --forcerun "
            + " ".join(dict.fromkeys(_target(o, _load(record_path(o)) or {}) for o in list(left)[:5])))


def previous_path(output: str | Path) -> Path:
    """Where :func:`keep_previous` puts ``output`` while its job runs again."""
    output = Path(output)
    return output.parent / RECORD_DIR / PREVIOUS / output.name


def _kept_files(output: Path) -> tuple[Path, Path, Path]:
    """The previous version of ``output``, its record and the note of what it is dated back to."""
    prev = previous_path(output)
    return prev, prev.with_name(prev.name + ".json"), prev.with_name(prev.name + ".kept.json")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _oldest_mtime(paths: Iterable[str | Path]) -> float:
    """The oldest modification time among ``paths`` that exist (a folder: itself and Snakemake's
    timestamp inside it), or now."""
    times = [time.time()]
    for p in map(Path, paths):
        for q in (p, p / ".snakemake_timestamp"):
            with contextlib.suppress(OSError):
                times.append(q.stat().st_mtime)
    return min(times)


def keep_previous(jobs: Iterable[tuple[Iterable[str | Path], Iterable[str | Path]]]) -> list[Path]:
    """For each job ``(outputs, inputs)`` of a run about to start: move every existing output and
    its record aside (:func:`previous_path`), noting a time just before the oldest of the job's
    inputs (what the output is dated back to if it has to be restored). Returns the outputs moved."""
    from vlsens.core.fsutil import write_json

    moved = []
    for outputs, inputs in jobs:
        outputs = [Path(o) for o in outputs]
        if not any(os.path.lexists(o) for o in outputs):
            continue
        before = _oldest_mtime(inputs) - 1.0
        for out in outputs:
            if not os.path.lexists(out):
                continue
            prev, rec, note = _kept_files(out)
            prev.parent.mkdir(parents=True, exist_ok=True)
            for stale in (prev, rec, note):
                _remove(stale)
            os.replace(out, prev)
            if record_path(out).is_file():
                os.replace(record_path(out), rec)
            write_json(note, {"output": str(out), "mtime": before})
            moved.append(out)
    return moved


def drop_previous(outputs: Iterable[str | Path]) -> None:
    """The job that writes ``outputs`` completed: their previous versions are not needed."""
    for out in map(Path, outputs):
        files = _kept_files(out)
        for p in files:
            _remove(p)
        with contextlib.suppress(OSError):  # the folder, once empty
            files[0].parent.rmdir()


def _date_back(path: Path, when: float) -> None:
    """Set ``path`` (and every file in it) to modification time ``when``."""
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in items:
        if not p.is_symlink():
            os.utime(p, (when, when))


def restore_previous(folder: str | Path) -> list[Path]:
    """Put back every previous version under ``folder`` whose output is missing (its job failed,
    or the run stopped before it ran), with its record, dated back to before its job's inputs so
    that Snakemake runs the job again; drop those whose output exists. Returns the outputs restored."""
    restored = []
    for found in sorted(Path(folder).rglob(f"{RECORD_DIR}/{PREVIOUS}/*.kept.json")):
        out = found.parent.parent.parent / found.name.removesuffix(".kept.json")
        prev, rec, kept = _kept_files(out)
        if os.path.lexists(out) or not os.path.lexists(prev):
            drop_previous([out])
            continue
        meta = _load(kept) or {}
        os.replace(prev, out)
        if rec.is_file():
            record_path(out).parent.mkdir(parents=True, exist_ok=True)
            os.replace(rec, record_path(out))
        # the record's stat keys no longer match: the next check hashes the files (content as recorded)
        _date_back(out, float(meta.get("mtime", 0.0)))
        kept.unlink()
        with contextlib.suppress(OSError):
            kept.parent.rmdir()
        restored.append(out)
    return restored


def drop_timestamps(folder: str | Path) -> list[Path]:
    """Snakemake marks each directory output with a hidden, empty ``.snakemake_timestamp`` (its
    modification time stands for the folder's). The folders that ship (``deploy/*``, ``parts/``)
    should hold nothing hidden: the file is removed at the end of a run and the folder dated to its
    time, which Snakemake then reads from the folder itself (so nothing re-runs). Returns the
    folders cleaned."""
    folder = Path(folder)
    done = []
    for ts in sorted([*folder.glob("deploy/*/.snakemake_timestamp"), *folder.glob("parts/**/.snakemake_timestamp")]):
        with contextlib.suppress(OSError):
            when = ts.stat().st_mtime
            ts.unlink()
            os.utime(ts.parent, (when, when))
            done.append(ts.parent)
    return done
