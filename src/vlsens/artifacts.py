"""Published ONNX artifacts: model + data + a record that holds their sizes and SHA-256.

Every ``.onnx`` file the workflow publishes is listed, with its external data file, under
``files`` in the JSON record written with it (``parity.json`` for exported and converted
models, ``engine.json`` for a sensitivity engine, ``eval.json`` for a profile):

    "files": {"model.onnx": {"bytes": 123, "sha256": "..."},
              "model.onnx.data": {"bytes": 456, "sha256": "..."}, "rule": "export_vision"}

A job that reads an ONNX artifact checks it against that record first (:func:`verify`), so a file
truncated, edited or copied over after it was published fails the consumer with the path and the
fix instead of an ONNX Runtime error, or a silently different result.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable

from vlsens import job
from vlsens.errors import ArtifactError
from vlsens.fsutil import file_sha256, publish, write_json
from vlsens.onnxutil import data_path

log = logging.getLogger(__name__)

#: Records that may list the files of the ONNX models beside them.
RECORD_NAMES = ("parity.json", "engine.json", "eval.json")


def file_entries(models: Iterable[str | Path]) -> dict:
    """``files`` entries for staged models and their data files (hashed before they move)."""
    out: dict = {}
    for m in models:
        for p in (Path(m), data_path(m)):
            out[p.name] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    out["rule"] = job.rule
    return out


def publish_model(staged_model: Path, record: dict, out_model: str | Path, out_parity: str | Path) -> None:
    """Move a staged, verified model into place: data file, parity record, then ``model.onnx``."""
    out_model, out_parity = Path(out_model), Path(out_parity)
    staged_parity = staged_model.with_name("parity.json")
    record["files"] = file_entries([staged_model])
    write_json(staged_parity, record)
    publish(
        {
            data_path(out_model): data_path(staged_model),
            out_parity: staged_parity,
            out_model: staged_model,
        },
        last=out_model,
    )
    log.info("published %s", out_model)


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


def verify(model: str | Path) -> None:
    """Raise :class:`ArtifactError` unless ``model`` and its data file are byte for byte what
    their record says was published."""
    model = Path(model)
    found = find_record(model)
    if found is None:
        raise ArtifactError(
            f"{model}: no record beside it ({', '.join(RECORD_NAMES)}) lists this model, so it was not "
            f"published by this version of vlsens. {fix_hint(model, None)}")
    record_path, record = found
    files = record["files"]
    for p in (model, data_path(model)):
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


def fix_hint(model: Path, rule: str | None) -> str:
    by = f" (rule {rule})" if rule else ""
    return (f"Re-create it{by}: snakemake --forcerun {model} (or delete {model.parent}/ and run again).")


def verify_inputs(paths: Iterable[str | Path]) -> int:
    """:func:`verify` every ``.onnx`` file among a job's inputs; returns how many were checked."""
    n = 0
    for p in paths:
        if str(p).endswith(".onnx"):
            verify(p)
            n += 1
    return n
