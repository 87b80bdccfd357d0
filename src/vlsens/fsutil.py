"""Atomic file publication: nothing partial may look complete.

Everything is written into a hidden temporary sibling directory first and moved into place with
``os.replace`` (atomic on one file system). For an ONNX model the ``.onnx`` file is moved last, so
its presence implies that its external data file and parity record are already in place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_dir(out_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``out_dir`` when the block succeeds."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staging_dir(final_dir: str | Path) -> Iterator[Path]:
    """Yield a scratch directory next to ``final_dir``; it is removed afterwards in any case."""
    final_dir = Path(final_dir)
    final_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=final_dir))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: dict[Path, Path], last: Path | None = None) -> None:
    """Move staged files to their final paths (``{final: staged}``), ``last`` after all others."""
    order = [p for p in staged if p != last] + ([last] if last is not None else [])
    for final in order:
        Path(final).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged[final], final)


def write_json(path: str | Path, data: dict) -> None:
    """Write JSON atomically (temp file + rename), keys sorted, trailing newline."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=_json_default)
        fh.write("\n")
    os.replace(tmp, path)


def _json_default(obj):
    import numpy as np

    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def file_sha256(path: str | Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
