"""Canonical content digests: two outputs with equal digests compute the same thing, whatever
library wrote them and when.

A stage that re-runs because one of its libraries changed often writes the same result in other
bytes: an exported graph whose ``producer_version`` says the new torch, an ``.npz`` archive whose
zip headers carry new timestamps, a record with new timings and versions. :func:`digest` hashes
what a consumer computes with and nothing else:

* ``.onnx``: the model without ``producer_name``, ``producer_version``, ``model_version`` and
  ``doc_string`` (graph and nodes keep theirs: node order, names, attributes, opsets, initializers
  and their external-data locations all count); its ``.data`` file is hashed as bytes;
* ``.npz``: each array's name, dtype, shape and bytes (not the zip container);
* ``.tar``: each member's name and bytes (not its header's time, owner or mode);
* ``.json``: the parsed value with the keys of :data:`VOLATILE_KEYS` removed at any depth
  (timings, library versions and code hashes, memory peaks, hashes and sizes of the files it
  lists: those files are digested themselves) and the keys it declares under ``volatile_keys``,
  serialized with sorted keys; ``.yaml`` the same (a plan's
  measured decode time is not the plan);
* anything else: its bytes.

A folder's digest is its files' (relative names and digests), skipping vlsens' and Snakemake's
own bookkeeping (``.vlsens/``, ``.snakemake_timestamp``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

#: Record keys whose values change from run to run without changing what the record says a
#: consumer computes with: timings, library versions, memory peaks, the machine, file hashes.
VOLATILE_KEYS = frozenset({
    # times, rates and memory of this run
    "seconds", "setup_seconds", "seconds_per_op", "seconds_per_op_a16", "floor_seconds", "per_op_over_floor",
    "per_op_s", "cost_vs_a8", "latency", "latency_ms", "latency_note", "speedup", "speed_note", "load_seconds",
    "wall_seconds", "wall_s", "time", "time_s", "elapsed", "timing", "timings", "ms", "tokens_per_second", "tok_s",
    "decode_tok_s", "prefill_s", "load_s", "session_s", "decode_ms", "estimate_decode_ms", "estimate_ms",
    "search_estimate_ms", "uniform_ms", "peak_rss", "peak_rss_mb", "peak_rss_bytes", "rss_mb", "threads_used",
    # who wrote it, where and when
    "versions", "library_versions", "code", "code_version", "cpu", "machine", "host", "hostname", "date", "created",
    # hashes of files that are digested themselves
    "sha256", "data_sha256",
})
#: The key under which a record lists more keys of its own that hold measured times.
DECLARED = "volatile_keys"
#: Model fields that name the writer, not the computation.
ONNX_WRITER_FIELDS = ("producer_name", "producer_version", "model_version", "doc_string")
SKIPPED = (".vlsens", ".snakemake_timestamp")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _onnx(path: Path) -> str:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for f in ONNX_WRITER_FIELDS:
        model.ClearField(f)
    return _sha(model.SerializeToString(deterministic=True))


def _npz(path: Path) -> str:
    import numpy as np

    h = hashlib.sha256()
    with np.load(path, allow_pickle=False) as z:
        for name in sorted(z.files):
            a = np.ascontiguousarray(z[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _tar(path: Path) -> str:
    import tarfile

    h = hashlib.sha256()
    with tarfile.open(path) as t:
        for m in sorted(t.getmembers(), key=lambda m: m.name):
            h.update(f"{m.name}|{m.type!r}|".encode())
            if m.isfile():
                h.update(t.extractfile(m).read())
    return h.hexdigest()


#: What a record says of each file it lists (``"files": {name: {...}}``): the files are digested
#: themselves, and a file holding a measured time changes its size with the time's digits.
FILE_ENTRY_KEYS = frozenset({"bytes", "sha256", "stat"})


def strip_volatile(value, listing: bool = False, keys: frozenset = VOLATILE_KEYS):
    """``value`` without ``keys`` (default :data:`VOLATILE_KEYS`) at any depth (in the entries of
    a ``files`` mapping, without :data:`FILE_ENTRY_KEYS` too)."""
    if isinstance(value, dict):
        if listing:
            return {k: ({kk: strip_volatile(vv, keys=keys) for kk, vv in v.items() if kk not in FILE_ENTRY_KEYS | keys}
                        if isinstance(v, dict) else strip_volatile(v, keys=keys)) for k, v in value.items()}
        return {k: strip_volatile(v, k == "files", keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [strip_volatile(v, keys=keys) for v in value]
    return value


def declared_volatile(data) -> frozenset:
    """The keys a record declares as measured times (``volatile_keys``, at its top level: names
    that mean a time there and a result elsewhere, e.g. ``error``, ``q1``), with that key itself;
    none for a record that declares none."""
    keys = data.get(DECLARED) if isinstance(data, dict) else None
    if not isinstance(keys, list):
        return frozenset()
    return frozenset(k for k in keys if isinstance(k, str)) | {DECLARED}


def _value_sha(data) -> str:
    """A parsed record's digest: without its volatile keys, serialized with sorted keys."""
    clean = strip_volatile(data, keys=VOLATILE_KEYS | declared_volatile(data))
    return _sha(json.dumps(clean, sort_keys=True, separators=(",", ":"), default=str).encode())


def _record(path: Path) -> str:
    """A JSON or YAML file's digest (:func:`_value_sha`); one that does not parse, by its bytes."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, UnicodeDecodeError, yaml.YAMLError):
        return _file_sha(path)
    return _value_sha(data)


def file_digest(path: str | Path) -> str:
    """The canonical digest of one file (module doc)."""
    path = Path(path)
    name = path.name
    if name.endswith(".onnx"):
        return "onnx:" + _onnx(path)
    if name.endswith(".npz"):
        return "npz:" + _npz(path)
    if name.endswith(".tar"):
        return "tar:" + _tar(path)
    if name.endswith(".json"):
        return "json:" + _record(path)
    if name.endswith((".yaml", ".yml")):
        return "yaml:" + _record(path)
    return "bytes:" + _file_sha(path)


def _members(path: Path) -> dict[str, Path]:
    """The files of a folder by relative name, without vlsens' and Snakemake's bookkeeping
    (:data:`SKIPPED`); a file: itself, by its name."""
    if not path.is_dir():
        return {path.name: path}
    return {f.relative_to(path).as_posix(): f for f in path.rglob("*")
            if f.is_file() and not any(part in SKIPPED for part in f.relative_to(path).parts)}


def digest(path: str | Path) -> str:
    """The canonical digest of a file or a folder (its files by relative name)."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    h = hashlib.sha256()
    for rel, f in sorted(_members(path).items()):
        h.update(f"{rel}|{file_digest(f)}\n".encode())
    return "dir:" + h.hexdigest()


#: Files read by their structure (:func:`file_digest`); any other file is compared as bytes.
STRUCTURED = (".onnx", ".npz", ".tar", ".json", ".yaml", ".yml")


def same_file(a: Path, b: Path) -> bool:
    """Do two files hold the same canonical content? Bytes are compared directly (sizes first,
    then 16 MB at a time, stopping at the first difference: a graph's data file is read at disk
    speed, not hashed); structured files by their digests."""
    if a.name.endswith(STRUCTURED):
        return file_digest(a) == file_digest(b)
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 24), fb.read(1 << 24)
            if x != y:
                return False
            if not x:
                return True


def differences(a: str | Path, b: str | Path, first: bool = False) -> list[str]:
    """The files whose canonical content differs between ``a`` and ``b`` (files or folders; a
    file only in one of them counts), by relative name; none when they are equivalent. ``first``:
    stop at the first difference (no more files are read)."""
    a, b = Path(a), Path(b)
    if not (os.path.lexists(a) and os.path.lexists(b)):
        return [a.name]
    if a.is_dir() != b.is_dir():
        return [a.name]
    if not a.is_dir():
        return [] if same_file(a, b) else [a.name]
    ma, mb = _members(a), _members(b)
    out = sorted(set(ma) ^ set(mb))
    if out and first:
        return out[:1]
    for name in sorted(set(ma) & set(mb)):
        # the .onnx and its .data are compared file by file: a rewritten header with equal bytes after it
        if not same_file(ma[name], mb[name]):
            out.append(name)
            if first:
                break
    return sorted(out)


def equivalent(a: str | Path, b: str | Path) -> bool:
    """Do ``a`` and ``b`` (files or folders) have the same canonical content?"""
    return Path(a).exists() and Path(b).exists() and not differences(a, b, first=True)

