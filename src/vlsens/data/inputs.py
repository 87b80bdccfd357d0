"""Content-addressed inputs: what the workflow reads from outside ``results/``, by content.

Snakemake decides what to re-run from file modification times, and a checkpoint directory is one
input whose own mtime does not change when a file inside it is replaced. So when the DAG is built,
the user's checkpoint files, the parity and calibration images and a prompts file are hashed
into small manifests under ``results/<model>/inputs/``:

``checkpoint.json``          every file of a local checkpoint directory: bytes, sha256
``parity_images.json``       each image: path, name, bytes, sha256, width, height, mode
``calibration_images.json``  the same for the calibration images
``text_prompts.json``        a prompts JSONL and the images it names

A manifest is rewritten only when its content changes, and the rules take the manifests as inputs
instead of the files: an in-place edit (even one that keeps the mtime, as ``cp -p`` or ``rsync -t``
do) re-runs exactly what reads that input, and a touch re-runs nothing. Hashes are cached by
(size, mtime, ctime, inode), so a multi-GB checkpoint is read once per change, not on every
``snakemake`` call.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from vlsens.core.fsutil import file_sha256, write_json
from vlsens.data.images import ImageRef

log = logging.getLogger(__name__)

CACHE_NAME = ".sha256-cache.json"


class HashCache:
    """sha256 of files, remembered by their stat fingerprint (any write changes ctime)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            self._data = {}
        self._dirty = False

    @staticmethod
    def _key(st: os.stat_result) -> list:
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]

    def sha256(self, path: str | Path) -> tuple[int, str]:
        p = str(Path(path).resolve())
        st = os.stat(p)
        hit = self._data.get(p)
        if hit and hit[:4] == self._key(st):
            return st.st_size, hit[4]
        digest = file_sha256(p)
        self._data[p] = self._key(st) + [digest]
        self._dirty = True
        return st.st_size, digest

    def save(self, must: bool = True) -> None:
        """Write the cache; ``must=False``: a cache folder that cannot be written only costs the
        next call its hashing (logged), so it is not an error."""
        if self._dirty:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_json(self.path, self._data)
            except OSError as e:
                if must:
                    raise
                log.info("hash cache %s not written (%s): the next check hashes again", self.path, e)
            self._dirty = False


def user_cache(name: str = "sha256-cache.json") -> Path:
    """A file in the user's vlsens cache folder: ``$VLSENS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vlsens``, else ``~/.cache/vlsens``."""
    base = os.environ.get("VLSENS_CACHE_DIR") or \
        str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlsens")
    return Path(base) / name


def write_if_changed(path: str | Path, data: dict) -> bool:
    """Write ``data`` as JSON unless the file already holds exactly that (its mtime then stays)."""
    path = Path(path)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    write_json(path, data)
    return True


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The files a checkpoint consists of (hidden files and folders are not part of it)."""
    d = Path(directory)
    return sorted(p for p in d.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(d).parts))


def checkpoint_manifest(directory: str | Path, cache: HashCache) -> dict:
    d = Path(directory)
    files = {}
    for p in checkpoint_files(d):
        size, digest = cache.sha256(p)
        files[str(p.relative_to(d))] = {"bytes": size, "sha256": digest}
    return {"directory": str(directory), "files": files}


def image_manifest(refs: Sequence[ImageRef], cache: HashCache) -> dict:
    """Each image with its hash and what its header says (size, mode); decodes nothing. An image
    whose header cannot be read gets ``error`` instead (:func:`vlsens.config.check_images` decides
    whether that stops the DAG)."""
    from vlsens.core.errors import ImageError
    from vlsens.data.images import header

    out = []
    for r in refs:
        size, digest = cache.sha256(r.path)
        try:
            facts = header(r)
        except ImageError as e:
            facts = {"error": str(e)}
        out.append({"path": str(r.path), "name": r.name, "bytes": size, "sha256": digest, **facts})
    return {"images": out}


def read(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def image_refs(manifest_path: str | Path) -> list[ImageRef]:
    """The images of a manifest written by :func:`image_manifest`, in order."""
    return [ImageRef(i["path"], i["name"]) for i in read(manifest_path)["images"]]


def checkpoint_dir(path: str | Path) -> str:
    """A rule's ``checkpoint`` input: a preset's directory, or a local checkpoint's manifest."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        return read(p)["directory"]
    return str(p)


def os_error_message(e: OSError, results: str | Path) -> str:
    """What the DAG build says when writing the manifests fails with ``e``: a file outside
    ``results`` that cannot be read (a broken symlink, no read permission), or ``results`` itself
    not writable (a read-only file system, permissions, a full disk)."""
    import os

    results = Path(results)
    if e.filename and not Path(os.path.abspath(e.filename)).is_relative_to(results.absolute()):
        return f"cannot read {e.filename}: {e.strerror or e} (a broken symlink, or no permission to read it)"
    return (f"cannot write the run's input manifests under {results}: {e.strerror or e} ({e.filename or ''}); "
            "run from a directory you can write (snakemake -d DIR)")


def write_manifests(folder: str | Path, checkpoint: str | Path | None, parity: Sequence[ImageRef],
                    calibration: Sequence[ImageRef],
                    outside: dict[str, tuple[str, Sequence[ImageRef]]] | None = None) -> dict[str, str]:
    """Write (when changed) the manifests of a plan's outside inputs; returns {kind: path}.
    ``outside``: the towers' own files by kind (a file and the images it names)."""
    folder = Path(folder)
    cache = HashCache(folder / CACHE_NAME)
    out: dict[str, str] = {}
    todo = {"parity_images": image_manifest(parity, cache),
            "calibration_images": image_manifest(calibration, cache)}
    if checkpoint is not None:
        todo["checkpoint"] = checkpoint_manifest(checkpoint, cache)
    for kind, (file, images) in sorted((outside or {}).items()):
        size, digest = cache.sha256(file)
        todo[kind] = {"file": str(file), "bytes": size, "sha256": digest, **image_manifest(images, cache)}
    for kind, data in todo.items():
        path = folder / f"{kind}.json"
        if write_if_changed(path, data):
            log.info("input manifest %s written", path)
        out[kind] = str(path)
    cache.save()
    return out
