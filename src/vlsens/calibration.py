"""Stage: calibration and evaluation tensors for one image size.

Images are preprocessed with the checkpoint's own image processor at exactly H x W (see
:func:`vlsens.vision.preprocess_nchw`) and split into disjoint calibration and evaluation sets
(by content: the same picture under two names lands in one set only). Written to one folder:

``calib.npz`` / ``eval.npz``   ``pixel_values`` (N, 3, H, W) float32 and ``names``
``calib.tar`` / ``eval.tar``   one ``.npy`` per image, (1, 3, H, W): the layout NPU toolchains
                               such as AXERA Pulsar2 take as a calibration dataset
``manifest.json``              per image: source path, sha256, split, index; plus size and counts
"""

from __future__ import annotations

import io
import logging
import random
import tarfile
from pathlib import Path
from typing import Sequence

import numpy as np

from vlsens.errors import ImageError
from vlsens.fsutil import publish, staging_dir, write_json
from vlsens.images import ImageRef, header, open_rgb

log = logging.getLogger(__name__)

SPLITS = ("calib", "eval")


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


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def write_tar(path: Path, arrays: np.ndarray, prefix: str = "pixel_values") -> None:
    with tarfile.open(path, "w") as tar:
        for i, a in enumerate(arrays):
            data = _npy_bytes(a[None].astype(np.float32))
            info = tarfile.TarInfo(f"{prefix}_{i:04d}.npy")
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))


def read_tar(path: str | Path) -> np.ndarray:
    with tarfile.open(path) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith(".npy")), key=lambda m: m.name)
        return np.concatenate([np.load(io.BytesIO(tar.extractfile(m).read()), allow_pickle=False) for m in members])


def load_split(path: str | Path) -> np.ndarray:
    with np.load(path, allow_pickle=False) as z:
        return z["pixel_values"]


def build_calibration(checkpoint: str | Path, refs: Sequence[ImageRef], height: int, width: int,
                      out_dir: str | Path, n_calib: int, n_eval: int, seed: int = 0,
                      skip_unreadable: bool = False) -> dict:
    """Write the calibration folder (all files staged, then moved into place; manifest last)."""
    from vlsens.checkpoint import load_image_processor
    from vlsens.vision import preprocess_nchw

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    refs, images, shas = load_images(refs, skip_unreadable)
    split = split_refs(refs, shas, n_calib, n_eval, seed)
    processor = load_image_processor(checkpoint)
    manifest = {"height": height, "width": width, "seed": seed, "images": [],
                "counts": {k: len(v) for k, v in split.items()}}
    with staging_dir(out_dir / "manifest.json") as tmp:
        for name in SPLITS:
            idx = split[name]
            pixels = preprocess_nchw(processor, [images[i] for i in idx], height, width)
            np.savez(tmp / f"{name}.npz", pixel_values=pixels, names=np.array([refs[i].name for i in idx]))
            write_tar(tmp / f"{name}.tar", pixels)
            for j, i in enumerate(idx):
                manifest["images"].append({"source": str(refs[i].path), "name": refs[i].name,
                                           "sha256": shas[i], "split": name, "index": j, **header(refs[i])})
        write_json(tmp / "manifest.json", manifest)
        files = [f"{n}.{ext}" for n in SPLITS for ext in ("npz", "tar")] + ["manifest.json"]
        publish({out_dir / f: tmp / f for f in files}, last=out_dir / "manifest.json")
    log.info("calibration %dx%d: %s", height, width, manifest["counts"])
    return manifest

