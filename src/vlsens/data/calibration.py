"""Calibration sets: what the sensitivity engines calibrate on and evaluate with, for any graph.

A tower builds a :class:`CalibrationSet` (:meth:`vlsens.export.towers.base.Tower.calibration`); this
module writes it, the same way for every graph, into ``results/<model>/calib/<graph>/``:

``calib.npz`` / ``eval.npz``   the feeds (:mod:`vlsens.data.samples`: stacked or one per feed)
``manifest.json``              ``graph``, ``counts`` per split, one entry per sample (``name``,
                               ``split``, ``index`` and what the tower knows: source image and its
                               sha256, prompt, tokens, size ...), plus the tower's facts (size, seed)
``calib.tar`` / ``eval.tar``   optional (:func:`write_npu_archive`): one ``.npy`` per sample and
                               input, ``(1, ...)``: the layout NPU toolchains such as AXERA Pulsar2
                               take as a calibration dataset

The split files are staged and moved into place with ``manifest.json`` last. It also holds the
image helpers the vision towers share: reading a set of images and a content-disjoint split.
"""

from __future__ import annotations

import io
import logging
import random
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlsens.core import paths
from vlsens.core.errors import ImageError
from vlsens.core.fsutil import atomic_file, publish, staging_dir, write_json
from vlsens.data.images import ImageRef, open_rgb
from vlsens.data.samples import Samples, load_stacked, save_stacked

log = logging.getLogger(__name__)

SPLITS = ("calib", "eval")


@dataclass
class CalibrationSet:
    """The calibration and evaluation feeds of one graph, and what the manifest says of them."""

    splits: dict[str, Samples]
    samples: list[dict]  # manifest entries: name, split, index, ...
    facts: dict = field(default_factory=dict)  # manifest facts of the whole set (size, seed, ...)
    stacked: bool = False  # write the stacked layout (graphs with a fixed batch)


def write_calibration(cs: CalibrationSet, out_dir: str | Path, graph: str) -> dict:
    """Write ``calib.npz``, ``eval.npz`` and ``manifest.json`` (staged; the manifest last)."""
    out_dir = Path(out_dir)
    manifest = {"graph": graph, **cs.facts, "counts": {k: s.count for k, s in cs.splits.items()},
                "samples": cs.samples}
    names = paths.CALIB_FILES
    with staging_dir(out_dir / names["manifest"]) as tmp:
        for split in SPLITS:
            s = cs.splits[split]
            if cs.stacked:
                save_stacked(tmp / names[split], {k: np.concatenate([f[k] for f in s.feeds]) for k in s.feeds[0]},
                             s.names)
            else:
                s.save(tmp / names[split])
        write_json(tmp / names["manifest"], manifest)
        publish({out_dir / f: tmp / f for f in names.values()}, last=out_dir / names["manifest"])
    log.info("calibration set of %s: %s", graph, manifest["counts"])
    return manifest


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def write_npy_tar(out_tar: str | Path, arrays: dict[str, list[np.ndarray]]) -> None:
    """The NPU layout: one ``<input>_<index>.npy`` per array, as a tar (written atomically)."""
    with atomic_file(out_tar) as tmp, tarfile.open(tmp, "w") as tar:
        for name, items in arrays.items():
            for i, arr in enumerate(items):
                data = _npy_bytes(arr)
                info = tarfile.TarInfo(f"{name}_{i:04d}.npy")
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))


def write_npu_archive(split_npz: str | Path, out_tar: str | Path) -> int:
    """One ``<input>_<index>.npy`` of shape ``(1, ...)`` per sample and input of a stacked split,
    as a tar (written atomically). Returns the number of samples."""
    arrays = load_stacked(split_npz)
    write_npy_tar(out_tar, {name: [row[None] for row in rows] for name, rows in arrays.items()})
    return len(next(iter(arrays.values()))) if arrays else 0


def read_tar(path: str | Path) -> np.ndarray:
    with tarfile.open(path) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith(".npy")), key=lambda m: m.name)
        return np.concatenate([np.load(io.BytesIO(tar.extractfile(m).read()), allow_pickle=False) for m in members])


# ----------------------------------------------------------------------------------------------
# Image sets (the vision towers)


def load_images(refs: Sequence[ImageRef], skip_unreadable: bool = False):
    """Open every image as RGB; a corrupt one raises :class:`ImageError` naming the file, or is
    skipped with a warning when ``skip_unreadable``. Returns (refs, images, sha256s)."""
    kept, images, shas = [], [], []
    for ref in refs:
        try:
            images.append(open_rgb(ref))
        except ImageError as e:
            if not skip_unreadable:
                raise ImageError(f"{e} (set calibration.skip_unreadable: true to skip such files)") from e
            log.warning("skipping unreadable image: %s", e)
            continue
        kept.append(ref)
        shas.append(ref.sha256())
    return kept, images, shas


def split_refs(refs: Sequence[ImageRef], shas: Sequence[str], n_calib: int, n_eval: int,
               seed: int = 0) -> dict[str, list[int]]:
    """Indices of a seeded, content-disjoint split into ``n_calib`` + ``n_eval`` images."""
    first: dict[str, int] = {}
    for i, s in enumerate(shas):
        first.setdefault(s, i)
    unique = sorted(first.values(), key=lambda i: shas[i])
    if len(unique) < n_calib + n_eval:
        raise ImageError(
            f"calibration: {n_calib} calibration + {n_eval} evaluation images requested, but only "
            f"{len(unique)} distinct readable image(s) were found; lower calibration.num_calib / "
            "calibration.num_eval or add images."
        )
    random.Random(seed).shuffle(unique)
    return {"calib": sorted(unique[:n_calib]), "eval": sorted(unique[n_calib:n_calib + n_eval])}


def load_split(path: str | Path) -> np.ndarray:
    """The ``pixel_values`` of a fixed-size vision split (stacked layout)."""
    return load_stacked(path)["pixel_values"]
