"""Model inputs as a list of ``session.run`` feeds, with the output positions that count.

Calibration and evaluation sets (``calib.npz`` / ``eval.npz``) are stored in one of two layouts:

stacked    ``<input>`` arrays stacked along axis 0, one row per sample, and ``names``: graphs with
           a fixed batch (fixed-size vision: ``pixel_values`` (N, 3, H, W)); cut into the graph's
           batch when loaded.
per feed   ``<input>/<index>`` arrays, one feed each (any shapes: text sequences, dynamic vision
           images), ``__valid__/<index>`` where only some output positions count (real tokens),
           and ``names``; ``__read_only__`` (a flag) where the valid positions are the only ones
           whose outputs exist in what the set stands for (the measure's teacher forcing returns
           logits at the answer's steps alone): an engine need not compute the others.

:class:`ReferenceStore` reads float reference outputs kept on disk one array per feed (written by
:func:`vlsens.core.fsutil.savez_stream`), so a 152k-vocabulary language model's logits never sit in
memory all at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.fsutil import npz_errors, open_npz, savez

VALID = "__valid__"
READ_ONLY = "__read_only__"


class Samples:
    """Feeds for one graph, the valid output positions of each (None: all), and sample names."""

    def __init__(self, feeds: list[dict[str, np.ndarray]], valid: list[np.ndarray | None] | None = None,
                 names: Sequence[str] | None = None, read_only: bool = False):
        self.feeds = feeds
        self.valid = valid if valid is not None else [None] * len(feeds)
        self.names = list(names) if names is not None else [str(i) for i in range(len(feeds))]
        #: only the valid positions' outputs exist where the set is used (see the module's doc)
        self.read_only = bool(read_only)
        if self.read_only and any(v is None for v in self.valid):
            raise ValueError("read_only samples need a valid mask on every feed")

    def __len__(self) -> int:
        return len(self.feeds)

    @property
    def count(self) -> int:
        """Number of samples (images or sequences) over all feeds."""
        return len(self.names)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], batch: int | None = 1,
                    names: Sequence[str] | None = None) -> "Samples":
        """Stacked arrays cut into feeds of ``batch`` rows (a remainder is dropped)."""
        batch = batch or 1
        n = len(next(iter(arrays.values())))
        n -= n % batch
        feeds = [{k: v[i:i + batch] for k, v in arrays.items()} for i in range(0, n, batch)]
        return cls(feeds, None, list(names)[:n] if names is not None else [str(i) for i in range(n)])

    @classmethod
    def load(cls, path: str | Path, model=None) -> "Samples":
        """A calibration split in either layout; stacked arrays are cut into ``model``'s batch (a
        path, ModelProto or session; default 1)."""
        with open_npz(path) as z:
            names = [str(s) for s in z["names"]] if "names" in z.files else None
            keys = [k for k in z.files if "/" in k]
            if not keys:  # stacked
                from vlsens.core.onnxutil import input_batch

                batch = input_batch(model)[1] if model is not None else 1
                return cls.from_arrays({k: z[k] for k in z.files if k not in ("names", READ_ONLY)}, batch, names)
            inputs = sorted({k.split("/", 1)[0] for k in keys} - {VALID})
            count = len({k.split("/", 1)[1] for k in keys if not k.startswith(VALID + "/")})
            feeds = [{k: z[f"{k}/{i:05d}"] for k in inputs} for i in range(count)]
            valid = [z[f"{VALID}/{i:05d}"] if f"{VALID}/{i:05d}" in z.files else None for i in range(count)]
            read_only = READ_ONLY in z.files and bool(z[READ_ONLY])
        return cls(feeds, valid, names, read_only)

    def save(self, path: str | Path) -> None:
        """The per-feed layout."""
        arrays = {"names": np.array(self.names), **({READ_ONLY: np.array(True)} if self.read_only else {})}
        for i, (feed, valid) in enumerate(zip(self.feeds, self.valid)):
            arrays.update({f"{k}/{i:05d}": v for k, v in feed.items()})
            if valid is not None:
                arrays[f"{VALID}/{i:05d}"] = np.asarray(valid, dtype=bool)
        savez(path, arrays)


def save_stacked(path: str | Path, arrays: dict[str, np.ndarray], names: Sequence[str]) -> None:
    """The stacked layout: one row per sample in every array."""
    savez(path, {**arrays, "names": np.array(list(names))})


def load_stacked(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of a stacked split (``names`` left out)."""
    with open_npz(path) as z:
        if any("/" in k for k in z.files):
            raise ValueError(f"{path}: per-feed layout, not stacked")
        return {k: z[k] for k in z.files if k != "names"}


def fit_batch(feeds: list[dict[str, np.ndarray]], batch: int | None) -> list[dict[str, np.ndarray]]:
    """Regroup feeds into feeds of exactly ``batch`` rows (a graph with a fixed batch): rows are
    concatenated in order and the last feed is padded by repeating rows. ``None``: unchanged."""
    if not batch or all(len(next(iter(f.values()))) == batch for f in feeds):
        return feeds
    names = list(feeds[0])
    rows = {k: np.concatenate([f[k] for f in feeds], axis=0) for k in names}
    n = len(rows[names[0]])
    if n % batch:
        pad = np.arange(batch - n % batch) % n
        rows = {k: np.concatenate([v, v[pad]], axis=0) for k, v in rows.items()}
    return [{k: v[i:i + batch] for k, v in rows.items()} for i in range(0, len(rows[names[0]]), batch)]


def run_fitted(session, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The first output for ``feed``, run in the session's fixed batch when it has one (padded
    rows dropped)."""
    from vlsens.core.onnxutil import input_batch

    _, batch = input_batch(session)
    n = len(next(iter(feed.values())))
    if not batch or n == batch:
        return session.run(None, feed)[0]
    return np.concatenate([session.run(None, f)[0] for f in fit_batch([feed], batch)], axis=0)[:n]


class FeedReader:
    """ORT ``CalibrationDataReader`` over :class:`Samples`."""

    def __init__(self, samples: Samples):
        self._it = iter(samples.feeds)

    def get_next(self):
        return next(self._it, None)


class ReferenceStore:
    """Float reference outputs, one array per feed, read lazily from an ``.npz``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with npz_errors(self.path):
            self._z = np.load(self.path, allow_pickle=False)
        self._n = len(self._z.files)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> np.ndarray:
        with npz_errors(self.path):
            return self._z[f"{i:05d}"]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def concatenated(self) -> np.ndarray:
        return np.concatenate(list(self), axis=0)
