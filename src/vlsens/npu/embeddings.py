"""The token embedding table as raw binaries, the way NPU LLM runtimes take it beside a compiled
decoder: ``embed_tokens.<dtype>.bin`` (row-major ``(vocab, hidden)``, little-endian, no header) and
``manifest.json`` (shape, dtype, byte order, SHA-256 of each file, the source tensor).

The table is read straight from the checkpoint's safetensors (its header and the tensor's bytes; no
model is built, nothing unpickled): a ``bf16`` table from a BF16 checkpoint is its bytes as stored;
any other conversion goes through ``ml_dtypes`` (round to nearest even, as torch's ``.to()``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from vlsens.core.errors import CheckpointError
from vlsens.model.checkpoint import safetensors_tensors
from vlsens.model.family import NODE_NAMES

#: ``embeddings.dtypes`` -> numpy dtype names (bfloat16 from ml_dtypes).
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: safetensors dtype names -> numpy dtype names.
SAFETENSORS = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
#: The language model's token table (the vision tower has no such tensor).
KEY = re.compile(r"(?:^|\.)embed_tokens\.weight$")


def numpy_dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def find_table(checkpoint: str | Path) -> tuple[str, Path, dict, int]:
    """The token embedding tensor: ``(name, file, header entry, data start)``."""
    checkpoint = Path(checkpoint)
    heads = safetensors_tensors(checkpoint)
    names = [k for k in heads if KEY.search(k) and NODE_NAMES.vision_weights not in k]
    if len(names) != 1:
        raise CheckpointError(f"{checkpoint}: expected one token embedding tensor (*embed_tokens.weight) in its "
                              f"safetensors, found {names or 'none'}")
    return (names[0], *heads[names[0]])


def read_table(checkpoint: str | Path) -> tuple[str, np.ndarray]:
    """The table as stored (memory-mapped; ``bfloat16`` through ml_dtypes)."""
    name, f, entry, start = find_table(checkpoint)
    if entry["dtype"] not in SAFETENSORS:
        raise CheckpointError(f"{f}: {name} is {entry['dtype']}; embeddings are read from "
                              f"{', '.join(SAFETENSORS)} tensors")
    begin, end = entry["data_offsets"]
    dtype = numpy_dtype(SAFETENSORS[entry["dtype"]]).newbyteorder("<")
    arr = np.memmap(f, dtype=dtype, mode="r", offset=start + begin, shape=tuple(entry["shape"]))
    if arr.nbytes != end - begin:
        raise CheckpointError(f"{f}: {name}'s header gives {end - begin} bytes for shape {entry['shape']}")
    return name, arr


def export_embeddings(checkpoint: str | Path, out_dir: str | Path, dtypes: list[str]) -> dict:
    """``out_dir``: one binary per entry of ``dtypes`` and the manifest (written atomically)."""
    from vlsens.core.fsutil import atomic_dir, file_sha256, write_json

    name, table = read_table(checkpoint)
    files = {}
    with atomic_dir(out_dir) as tmp:
        for d in dtypes:
            want = numpy_dtype(DTYPES[d]).newbyteorder("<")
            fname = f"embed_tokens.{d}.bin"
            with open(tmp / fname, "wb") as fh:
                for i in range(0, table.shape[0], 8192):  # a few MB at a time
                    fh.write(np.ascontiguousarray(table[i:i + 8192]).astype(want).tobytes())
            files[fname] = {"dtype": DTYPES[d], "shape": list(table.shape), "byte_order": "little",
                            "layout": "row-major (vocab, hidden), no header", "bytes": (tmp / fname).stat().st_size,
                            "sha256": file_sha256(tmp / fname)}
        manifest = {"checkpoint": str(checkpoint), "tensor": name, "stored_as": str(table.dtype),
                    "vocab_size": int(table.shape[0]), "hidden_size": int(table.shape[1]), "files": files}
        write_json(tmp / "manifest.json", manifest)
    return manifest


def load_binary(folder: str | Path, dtype: str) -> np.ndarray:
    """A table written by :func:`export_embeddings`, read back through its manifest."""
    folder = Path(folder)
    man = json.loads((folder / "manifest.json").read_text())
    entry = man["files"][f"embed_tokens.{dtype}.bin"]
    arr = np.fromfile(folder / f"embed_tokens.{dtype}.bin", dtype=numpy_dtype(entry["dtype"]).newbyteorder("<"))
    return arr.reshape(entry["shape"])
