"""Model inputs for calibration/evaluation as a list of feeds, and metrics streamed over them.

Vision sets are one stacked ``pixel_values`` array cut into the graph's fixed batch; text sets
are one sequence per feed (``inputs_embeds``, ``attention_mask``, ``position_ids``), lengths
differ. Both become :class:`Samples`: a list of ``session.run`` feeds plus, per feed, the output
positions that count (real tokens of a text sequence; everything for vision).

Outputs are compared feed by feed (:class:`StreamMetrics`), and float reference outputs are kept
on disk, one array per feed (:class:`ReferenceStore`), so evaluating a language model with a
152k vocabulary never holds every logits tensor in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from vlsens.fsutil import atomic_file, savez



class Samples:
    """Feeds for one graph, with the valid output positions of each."""

    def __init__(self, feeds: list[dict[str, np.ndarray]], valid: list[np.ndarray | None], names: Sequence[str]):
        self.feeds, self.valid, self.names = feeds, valid, list(names)

    def __len__(self) -> int:
        return len(self.feeds)

    @property
    def count(self) -> int:
        """Number of samples (images or sequences) over all feeds."""
        return len(self.names)

    @classmethod
    def from_array(cls, name: str, data: np.ndarray, batch: int = 1, names: Sequence[str] | None = None) -> "Samples":
        n = len(data) - len(data) % batch
        feeds = [{name: data[i:i + batch]} for i in range(0, n, batch)]
        return cls(feeds, [None] * len(feeds), names if names is not None else [str(i) for i in range(n)])

    @classmethod
    def load(cls, path: str | Path, model: str | Path | None = None) -> "Samples":
        """A calibration split (``calib.npz`` / ``eval.npz``): fixed-size vision (``pixel_values``,
        cut into ``model``'s first input's batch) or per-feed ``<input>/<index>`` arrays (text: one
        sequence each; dynamic vision: one image with its index inputs each)."""
        with np.load(path, allow_pickle=False) as z:
            names = [str(s) for s in z["names"]] if "names" in z.files else []
            if "pixel_values" in z.files:
                data = z["pixel_values"]
                name, batch = ("pixel_values", 1) if model is None else graph_input(model)
                return cls.from_array(name, data, batch, names or None)
            keys = [k for k in z.files if "/" in k]
            inputs = sorted({k.split("/", 1)[0] for k in keys})
            count = len({k.split("/", 1)[1] for k in keys})
            feeds, valid = [], []
            for i in range(count):
                feed = {k: z[f"{k}/{i:05d}"] for k in inputs}
                feeds.append(feed)
                # text sequences: only real tokens count; other graphs: every output position
                valid.append(feed["attention_mask"].astype(bool) if "attention_mask" in feed else None)
        return cls(feeds, valid, names or [str(i) for i in range(count)])

    def save_feeds(self, path: str | Path) -> None:
        """``<input>/<index>`` arrays + ``names`` (any graph whose feeds are not one stacked array)."""
        arrays = {"names": np.array(self.names)}
        for i, feed in enumerate(self.feeds):
            for k, v in feed.items():
                arrays[f"{k}/{i:05d}"] = v
        savez(path, arrays)


def graph_input(model) -> tuple[str, int]:
    """Name and fixed batch size (1 when dynamic) of a model's first input (a path or a ModelProto)."""
    import onnx

    m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    inp = m.graph.input[0]
    d0 = inp.type.tensor_type.shape.dim[0]
    return inp.name, (d0.dim_value if d0.HasField("dim_value") and d0.dim_value > 0 else 1)


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
        self._z = np.load(self.path, allow_pickle=False)
        self._n = len(self._z.files)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> np.ndarray:
        return self._z[f"{i:05d}"]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def concatenated(self) -> np.ndarray:
        return np.concatenate(list(self), axis=0)

    @staticmethod
    def write(path: str | Path, outputs: Iterable[np.ndarray]) -> int:
        """Write outputs as they come (one in memory at a time) into an ``.npz``, atomically."""
        import zipfile

        n = 0
        with atomic_file(path, suffix=".npz") as tmp:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                for i, out in enumerate(outputs):
                    with zf.open(f"{i:05d}.npy", "w", force_zip64=True) as f:
                        np.lib.format.write_array(f, np.asarray(out), allow_pickle=False)
                    n += 1
        return n


class StreamMetrics:
    """MSE, cosine and SQNR of outputs against references, accumulated feed by feed over the
    valid positions (same values as :func:`vlsens.quant.output_metrics` on the concatenation).
    For logits (last axis = vocabulary) also KL(reference || output) per position and top-1
    agreement, both averaged over positions."""

    def __init__(self, logits: bool = False):
        self.logits = logits
        self.sq = self.dot = self.na = self.nr = 0.0
        self.n = 0
        self.kl = 0.0
        self.top1 = 0
        self.positions = 0
        self.finite = True

    def add(self, actual: np.ndarray, reference: np.ndarray, valid: np.ndarray | None = None) -> None:
        if valid is not None:
            actual, reference = actual[valid], reference[valid]
        if not np.isfinite(actual).all():
            self.finite = False
            return
        a = np.asarray(actual, dtype=np.float64).ravel()
        r = np.asarray(reference, dtype=np.float64).ravel()
        e = a - r
        self.sq += float(e @ e)
        self.dot += float(a @ r)
        self.na += float(a @ a)
        self.nr += float(r @ r)
        self.n += a.size
        if self.logits:
            act = np.asarray(actual, dtype=np.float32).reshape(-1, actual.shape[-1])
            ref = np.asarray(reference, dtype=np.float32).reshape(-1, reference.shape[-1])
            for lo in range(0, len(act), 64):  # bounded temporaries for large vocabularies
                lq, lp = _log_softmax(act[lo:lo + 64]), _log_softmax(ref[lo:lo + 64])
                self.kl += float(np.sum(np.exp(lp) * (lp - lq), dtype=np.float64))
            self.top1 += int(np.sum(act.argmax(-1) == ref.argmax(-1)))
            self.positions += len(act)

    def result(self) -> dict[str, float]:
        if not self.finite:
            bad = {"mse": float("inf"), "cosine": -1.0, "sqnr_db": float("-inf")}
            return bad | ({"kl": float("inf"), "top1": 0.0} if self.logits else {})
        mse = self.sq / max(self.n, 1)
        na, nr = np.sqrt(self.na), np.sqrt(self.nr)
        cos = self.dot / (na * nr) if na > 0 and nr > 0 else float(na == nr)
        sqnr = float("inf") if self.sq == 0 else (10.0 * np.log10(self.nr / self.sq) if self.nr > 0 else float("-inf"))
        out = {"mse": float(mse), "cosine": float(cos), "sqnr_db": float(sqnr)}
        if self.logits:
            out["kl"] = self.kl / max(self.positions, 1)
            out["top1"] = self.top1 / max(self.positions, 1)
        return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


class CaseStore:
    """Named cases of arrays in one ``.npz`` (``<case>/<name>`` keys): the parity references of
    the text and dynamic graphs."""

    def __init__(self, cases: dict[str, dict[str, np.ndarray]] | None = None):
        self.cases = cases or {}

    def save(self, path: str | Path) -> None:
        savez(path, {f"{c}/{k}": v for c, arrays in self.cases.items() for k, v in arrays.items()})

    @classmethod
    def load(cls, path: str | Path):
        cases: dict[str, dict[str, np.ndarray]] = {}
        with np.load(path, allow_pickle=False) as z:
            for key in z.files:
                case, name = key.split("/", 1)
                cases.setdefault(case, {})[name] = z[key]
        return cls(cases)
