"""Published ONNX artifacts: model + data + a record that holds their sizes and SHA-256.

Every ``.onnx`` file the workflow publishes is listed, with its external data file, under
``files`` in the JSON record written with it (``parity.json`` for exported and converted
models, ``engine.json`` for a sensitivity engine, ``eval.json`` for a profile):

    "files": {"model.onnx": {"bytes": 123, "sha256": "..."},
              "model.onnx.data": {"bytes": 456, "sha256": "..."}, "rule": "export"}

A job that reads an ONNX artifact checks it against that record first (:func:`verify`), so a file
truncated, edited or copied over after it was published fails the consumer with the path and the
fix instead of an ONNX Runtime error, or a silently different result.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from vlsens.core import job
from vlsens.core.errors import ArtifactError
from vlsens.core.fsutil import file_sha256, publish, write_json
from vlsens.core.onnxutil import data_path
from vlsens.core.paths import MAIN, RECORD

log = logging.getLogger(__name__)

#: Records that may list the files of the ONNX models beside them.
RECORD_NAMES = ("parity.json", "engine.json", "eval.json", "parts.json")


def file_entries(models: Iterable[str | Path], single_file: bool = False) -> dict:
    """``files`` entries for staged models and their data files (hashed before they move);
    ``single_file``: models whose weights are inside (a data file is listed where there is one)."""
    out: dict = {}
    for m in models:
        for p in (Path(m), data_path(m)):
            if single_file and p != Path(m) and not p.exists():
                continue
            out[p.name] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    out["rule"] = job.rule
    return out


def publish_models(staged: dict[str, Path], record: dict, out_dir: str | Path, main: str = MAIN) -> None:
    """Move staged, verified graph files into ``out_dir``: data files, the record
    (``parity.json``, with ``files``), the other graphs, then ``main`` last, so its presence
    means the folder is complete."""
    out_dir = Path(out_dir)
    stage = Path(staged[main]).parent
    record["files"] = file_entries(staged.values())
    write_json(stage / RECORD, record)
    moves = {out_dir / data_path(Path(f)).name: data_path(p) for f, p in staged.items()}
    moves[out_dir / RECORD] = stage / RECORD
    moves.update({out_dir / f: Path(p) for f, p in staged.items()})
    publish(moves, last=out_dir / main)
    log.info("published %s", out_dir / main)


def find_record(model: str | Path) -> tuple[Path, dict] | None:
    """The record beside ``model`` that lists it under ``files`` (None if there is none)."""
    model = Path(model)
    for name in RECORD_NAMES:
        p = model.with_name(name)
        if p.is_file():
            try:
                rec = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if model.name in (rec.get("files") or {}):
                return p, rec
    return None


#: Files this process verified already, by (path, size, mtime_ns): each is hashed once per job.
_verified: set[tuple] = set()


def verify(model: str | Path) -> Path:
    """Raise :class:`ArtifactError` unless ``model`` and its data file are byte for byte what
    their record says was published; returns ``model``. A job calls it on every graph it reads
    from another rule's folder."""
    model = Path(model)
    key = _stat_key(model)
    if key in _verified:
        return model
    found = find_record(model)
    if found is None:
        raise ArtifactError(
            f"{model}: no record beside it ({', '.join(RECORD_NAMES)}) lists this model, so it was not "
            f"published by this version of vlsens. {fix_hint(model, None)}")
    record_path, record = found
    files = record["files"]
    single = data_path(model).name not in files and not data_path(model).exists()  # weights inside
    for p in (model,) if single else (model, data_path(model)):
        want = files.get(p.name)
        if want is None:
            raise ArtifactError(f"{p}: {record_path} does not list it. {fix_hint(model, files.get('rule'))}")
        if not p.is_file():
            raise ArtifactError(f"{p}: missing, but {record_path} lists it. {fix_hint(model, files.get('rule'))}")
        size = p.stat().st_size
        digest = file_sha256(p) if size == want["bytes"] else None
        if size != want["bytes"] or digest != want["sha256"]:
            found_txt = f"{size} bytes" + (f", sha256 {digest[:12]}…" if digest else "")
            raise ArtifactError(
                f"{p}: {found_txt}, but {record_path} records {want['bytes']} bytes, sha256 "
                f"{want['sha256'][:12]}… from when it was published: the file changed afterwards (truncated, "
                f"edited or copied over). {fix_hint(model, files.get('rule'))}")
    _verified.add(key)
    return model


def _stat_key(model: Path) -> tuple:
    try:
        return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in (model, data_path(model)))
    except OSError:
        return (str(model), None)


def fix_hint(model: Path, rule: str | None) -> str:
    # A model folder is known to Snakemake by its main graph (the others are listed in its record).
    target = model.with_name(MAIN) if (model.parent / RECORD).is_file() else model
    by = f" (rule {rule})" if rule else ""
    return f"Re-create it{by}: snakemake --forcerun {target} (or delete {model.parent}/ and run again)."


def verify_inputs(paths: Iterable[str | Path]) -> int:
    """:func:`verify` every ``.onnx`` file among a job's inputs; returns how many were checked."""
    n = 0
    for p in paths:
        if str(p).endswith(".onnx"):
            verify(p)
            n += 1
    return n
