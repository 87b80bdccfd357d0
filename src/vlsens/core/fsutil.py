"""The I/O layer: every file vlsens writes goes through here. Nothing partial may look complete,
nothing private, nothing left behind.

Every file vlsens publishes is written under a temporary name first and moved into place with
``os.replace`` (atomic on one file system). The temporary name belongs to the output it becomes:

``<dir>/.<name>.tmp-XXXX``       a single file on its way to ``<dir>/<name>``
``<dir>/.<name>.staging-XXXX/``  a scratch folder for the outputs of the job that writes ``<name>``

Snakemake lets one job at a time write a given output, so when a job starts, every temporary
entry named after one of *its* outputs is a leftover of an earlier, killed run of the same job
and is removed (:func:`remove_stale`). For an ONNX model the ``.onnx`` file is moved last, so its
presence implies that its external data file and record are already in place.

Published files get the permissions of an ordinary file under the process umask (``0644`` under
umask ``022``), not the private ``0600`` of :mod:`tempfile`. Nothing is ever hard-linked: a
link between a scratch folder and a published file would let a killed job's leftover change the
published one (and onnx refuses to load external data with more than one link).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

TMP_TAG = ".tmp-"
STAGING_TAG = ".staging-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def normal_mode(path: str | Path) -> None:
    """Give ``path`` (recursively, for a folder) the mode a plain ``open``/``mkdir`` would."""
    mask = _umask()
    path = Path(path)
    todo = [path]
    while todo:
        p = todo.pop()
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        if stat.S_ISDIR(st.st_mode):
            os.chmod(p, 0o777 & ~mask)
            todo.extend(p.iterdir())
        else:
            os.chmod(p, 0o666 & ~mask)


def temp_file(final: str | Path, suffix: str = "") -> Path:
    """A new, empty temporary file for ``final`` (same folder, named after it, normal mode)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}{TMP_TAG}", suffix=suffix, dir=final.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return Path(tmp)


@contextlib.contextmanager
def atomic_file(final: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path; it replaces ``final`` when the block succeeds, else it is removed."""
    final = Path(final)
    tmp = temp_file(final, suffix)
    try:
        yield tmp  # created with the umask's mode by temp_file
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(out_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``out_dir`` when the block succeeds."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}{TMP_TAG}", dir=out_dir.parent))
    try:
        yield tmp
        normal_mode(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staging_dir(owner: str | Path) -> Iterator[Path]:
    """Yield a scratch folder beside ``owner`` (the job's main output file), named after it; it is
    removed afterwards in any case, and by :func:`remove_stale` when a killed job left it."""
    owner = Path(owner)
    owner.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{owner.name}{STAGING_TAG}", dir=owner.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: dict[Path, Path], last: Path | None = None) -> None:
    """Move staged files to their final paths (``{final: staged}``), ``last`` after all others."""
    from vlsens.core import faults

    order = [p for p in staged if p != last] + ([last] if last is not None else [])
    for final in order:
        normal_mode(staged[final])
    for i, final in enumerate(order):
        Path(final).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged[final], final)
        if i == 0:
            faults.point("publish")  # tests: a job killed half-way through publishing


def stale_entries(outputs: Iterable[str | Path]) -> list[Path]:
    """Temporary files and staging folders named after ``outputs`` (leftovers of killed runs)."""
    found = []
    for out in outputs:
        out = Path(out)
        if not out.parent.is_dir():
            continue
        for tag in (TMP_TAG, STAGING_TAG):
            found.extend(sorted(out.parent.glob(f".{out.name}{tag}*")))
    return found


def remove_stale(outputs: Iterable[str | Path]) -> list[Path]:
    """Remove :func:`stale_entries` of ``outputs``; call it when the job that owns them starts."""
    removed = []
    for p in stale_entries(outputs):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
        log.warning("removed %s, left by an earlier run of this job that was killed", p)
    return removed


def write_json(path: str | Path, data: dict) -> None:
    """Write JSON atomically (temp file + rename), keys sorted, trailing newline."""
    with atomic_file(path) as tmp, open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=_json_default)
        fh.write("\n")


@contextlib.contextmanager
def npz_errors(path: str | Path):
    """Reads of the ``.npz`` file ``path`` inside the ``with``: a missing, truncated or foreign
    file, or one that lacks an array the reader asks for, is a VlsensError naming the file and
    the command that rebuilds it, not a zipfile or numpy traceback."""
    import zipfile
    import zlib

    from vlsens.core.errors import VlsensError

    try:
        yield
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zlib.error) as e:
        raise VlsensError(_npz_problem(path, e)) from e


@contextlib.contextmanager
def open_npz(path: str | Path, mmap_mode: str | None = None):
    """``np.load`` of an ``.npz`` (no pickled objects) as a context manager whose reads are
    checked (:func:`npz_errors`). Use the arrays inside the ``with`` (they are read there)."""
    import numpy as np

    with npz_errors(path):
        z = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
        try:
            yield z
        finally:
            if hasattr(z, "close"):  # an .npy behind the name loads as an array
                z.close()


def _npz_problem(path, e: BaseException) -> str:
    if isinstance(e, FileNotFoundError):
        return f"{path}: no such array file; rebuild it with snakemake --forcerun {path}"
    what = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return (f"{path}: not a complete array file ({what}); it was changed or cut after it was written: "
            f"rebuild it with snakemake --forcerun {path}")


def savez(path: str | Path, arrays: dict) -> None:
    """``np.savez`` atomically (no pickled objects: plain arrays and strings only)."""
    import numpy as np

    with atomic_file(path, suffix=".npz") as tmp:
        np.savez(tmp, **arrays)


def savez_stream(path: str | Path, arrays) -> int:
    """Write arrays as they come (one in memory at a time) into an ``.npz`` named ``00000``,
    ``00001``, ... atomically; returns how many were written."""
    import zipfile

    import numpy as np

    n = 0
    with atomic_file(path, suffix=".npz") as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for i, arr in enumerate(arrays):
                with zf.open(f"{i:05d}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asarray(arr), allow_pickle=False)
                n += 1
    return n


def write_csv(path: str | Path, rows: list[dict], columns: list[str]) -> None:
    """A CSV of ``rows`` with exactly ``columns`` (floats with 9 significant digits), atomically."""
    import pandas as pd

    with atomic_file(path) as tmp:
        pd.DataFrame(rows, columns=columns).to_csv(tmp, index=False, float_format="%.9g")


def write_yaml(path: str | Path, data) -> None:
    """YAML in the given key order, atomically."""
    import yaml

    with atomic_file(path) as tmp:
        tmp.write_text(yaml.safe_dump(data, sort_keys=False, width=120))


def copy_file(src: str | Path, dst: str | Path) -> None:
    """Copy ``src`` to ``dst``: a reflink where the file system has them, else a byte copy.

    Never a hard link (see the module docstring).
    """
    import fcntl

    ficlone = 0x40049409  # FICLONE (linux/fs.h)
    with open(src, "rb") as s, open(dst, "wb") as d:
        try:
            fcntl.ioctl(d.fileno(), ficlone, s.fileno())
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


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
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
