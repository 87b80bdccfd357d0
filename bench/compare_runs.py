"""Two runs' results compared file by file: what a refactoring must leave unchanged.

    python bench/compare_runs.py results-before/tiny results-after/tiny

Every file of either tree is compared by content, by kind:

- ``.onnx``: the graph with its weights (nodes, initializers by name, inputs, outputs, opsets)
  after dropping what names the writer rather than the computation (``producer_name`` /
  ``producer_version``, ``doc_string``, ``metadata_props``); a graph's ``.data`` file is compared
  through it, other binaries byte for byte;
- ``.npz``: every array, exactly (dtype, shape, values);
- ``.json`` / ``.yaml``: every value, exactly, after dropping the keys :data:`VOLATILE` lists (times
  and ratios of times, memory peaks, library versions and code hashes) and :data:`DESCRIBED`
  (a record's sizes and hashes of files that are themselves compared here; they change with the
  writer's stamp), with module paths read through ``vlsens.MOVED`` (a record names the code that
  made it) and absolute paths made relative: parity numbers, rankings, profile choices and
  metrics, deploy tokens and KL are all compared;
- ``.csv``: every cell, exactly, but columns :data:`VOLATILE` names (seconds);
- ``.tar``: the members' names and bytes; ``.md`` / ``.html`` / ``.rst``: the text with table
  columns whose header :data:`VOLATILE_LINES` matches left out (tokens per second, seconds), and
  in other lines the numbers followed by a time unit masked (:data:`TIMED_NUMBER`; the decode
  step's paragraph, :data:`TIMED_TEXT`, left out);
- ``.png``: byte for byte, except the figures :data:`TIMED_FIGURES` names, which draw measured
  latencies (their records are compared).

Logs, benchmark files, Snakemake's own markers, the outputs' records (``.vlsens/``) and
``vlsens upgrade``'s ledger are not results and are skipped. Prints one
line per difference and a summary; exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
import tarfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from vlsens.core.canonical import VOLATILE_KEYS  # noqa: E402

#: Keys whose values depend on the machine, the moment or the checkout, not on the computation:
#: those the outputs' own equivalence check ignores (vlsens.core.canonical, early cutoff), and these.
VOLATILE = set(VOLATILE_KEYS) | {"seconds", "time", "time_s", "wall_s", "elapsed", "peak_rss_bytes", "peak_rss", "peak_rss_mb",
            "versions", "library_versions", "code", "code_version", "created", "date", "host", "hostname",
            "tokens_per_second", "tok_s", "decode_tok_s", "prefill_s", "load_s", "session_s", "per_op_s",
            "ms", "latency_ms", "speedup", "timing", "timings", "seconds_per_op", "cpu", "threads_used",
            "per_op_over_floor"}
#: Keys that describe a file compared on its own (its size and hash include the writer's stamp,
#: e.g. onnxruntime-genai's builder writes its own commit into ``producer_version``).
DESCRIBED = {"sha256", "data_sha256", "bytes", "folder_bytes", "folder_vs_fp16", "bytes_goal/ratio"}
#: Figures that draw measured latencies.
TIMED_FIGURES = {"latency.png", "pareto.png"}
#: Lines of text reports whose numbers are timings.
VOLATILE_LINES = re.compile(r"tok/s|tokens/s|seconds|\bs\)|ms\b|speed|latency", re.I)
#: Text lines that describe measured times as a whole (the decode step's paragraph), and a number
#: followed by a time unit in any other line ("about 173 tokens/s"), which is masked.
TIMED_TEXT = re.compile(r"^\s*Decode step:")
TIMED_NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:e[-+]?\d+)?)\s*(tok/s|tokens/s|ms\b|s\b)")
SKIP_DIRS = {"logs", "benchmarks", ".snakemake", ".vlsens"}  # .vlsens: the outputs' records (sizes, hashes, stat keys)
SKIP_NAMES = {"upgrade.json"}  # `vlsens upgrade`'s ledger: what ran, not a result
SKIP_SUFFIXES = {".log", ".tsv", ".snakemake_timestamp", ".jinja"}


_MODULE = re.compile(r"\bvlsens(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _module_path(m: re.Match) -> str:
    """A dotted vlsens path, old or new, as its current module path (+ attribute)."""
    import vlsens

    name = m.group(0)
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        new = vlsens.moved_to(".".join(parts[:i]))
        if new:
            return ".".join([new[0], *parts[i:]])
    return name


def _strip(value, root: str, parent: str = ""):
    if isinstance(value, dict):
        return {k: _strip(v, root, k) for k, v in value.items()
                if k not in VOLATILE | DESCRIBED and f"{parent}/{k}" not in DESCRIBED and not k.endswith(("_seconds", "_s"))}
    if isinstance(value, list):
        return [_strip(v, root, parent) for v in value]
    if isinstance(value, str):
        return _MODULE.sub(_module_path, value.replace(root, "<results>"))
    return value


def _diff(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}/{k}: only in {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items before, {len(b)} after"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{where}[{i}]")]
    if a != b and not (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b)):
        return [f"{where}: {a!r} -> {b!r}"]
    return []


def _load_tree(path: Path, root: Path):
    """A record's value without its volatile keys (:data:`VOLATILE`, and those it declares itself:
    vlsens.core.canonical's ``volatile_keys``)."""
    import yaml

    from vlsens.core.canonical import declared_volatile, strip_volatile

    data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    return _strip(strip_volatile(data, keys=declared_volatile(data)), str(root.resolve()))


def _same_array(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (NaNs equal to themselves, any dtype)."""
    return x.dtype == y.dtype and x.shape == y.shape and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()


def _sort_initializers(graph) -> None:
    """Initializers by name, in the graph and every subgraph: their order computes nothing (and
    before 0.2 the suffix engine's segments listed them in a set's order, which varied by run)."""
    inits = sorted(graph.initializer, key=lambda i: i.name)
    del graph.initializer[:]
    graph.initializer.extend(inits)
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _sort_initializers(g)


def _onnx_canonical(path: Path) -> bytes:
    import onnx

    m = onnx.load(str(path))  # weights inline, wherever the writer put them in the .data file
    m.producer_name, m.producer_version, m.doc_string = "", "", ""
    del m.metadata_props[:]
    _sort_initializers(m.graph)
    return m.SerializeToString(deterministic=True)


def _csv_rows(path: Path) -> list[dict]:
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    return [{k: v for k, v in r.items() if k not in VOLATILE and not k.endswith(("_seconds", "_s"))} for r in rows]


def _tar_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def _drop_timed_columns(rows: list[list[str]]) -> list[list[str]]:
    """A table's rows without the columns whose header (the first row) names a timing."""
    if not rows:
        return rows
    timed = {i for i, c in enumerate(rows[0]) if VOLATILE_LINES.search(c)}
    return [[c for i, c in enumerate(r) if i not in timed] for r in rows]


def _html_tables(text: str) -> list[str]:
    """An HTML report as its text outside tables plus each table's rows, timing columns left out."""
    out = []
    for i, part in enumerate(re.split(r"(<table.*?</table>)", text, flags=re.S)):
        if i % 2 == 0:
            out.append(part)
            continue
        rows = [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, flags=re.S) for tr in re.findall(r"<tr.*?</tr>", part, re.S)]
        out += [" | ".join(r) for r in _drop_timed_columns(rows)]
    return out


def _rst_list_tables(lines: list[str]) -> list[str]:
    """An RST document with each ``list-table``'s rows joined, timing columns left out."""
    out, rows = [], None
    for line in [*lines, ""]:
        s = line.strip()
        if s.startswith("* - "):
            rows = (rows or []) + [[s[4:]]]
        elif s.startswith("- ") and rows:
            rows[-1].append(s[2:])
        else:
            if rows:
                out += [" | ".join(r) for r in _drop_timed_columns(rows)]
                rows = None
            out.append(line)
    return out[:-1]


def _text(path: Path, root: Path) -> list[str]:
    text = path.read_text(errors="replace").replace(str(root.resolve()), "<results>")
    lines = _html_tables(text) if path.suffix == ".html" else text.splitlines()
    if path.suffix == ".rst":
        lines = _rst_list_tables(lines)
    out, timed = [], set()
    for line in lines:
        cells = line.strip().strip("|").split("|") if line.lstrip().startswith("|") else None
        if cells and any(VOLATILE_LINES.search(c) for c in cells) and not set(line) <= set("|-: "):
            timed = {i for i, c in enumerate(cells) if VOLATILE_LINES.search(c)}  # a table's header
        if cells is None:
            timed = set()
            if TIMED_TEXT.search(line):
                continue
            line = TIMED_NUMBER.sub(r"# \2", line)
        elif timed:
            line = "|".join(c for i, c in enumerate(cells) if i not in timed)
        elif VOLATILE_LINES.search(line):
            continue
        out.append(line)
    return out


def compare_file(a: Path, b: Path, ra: Path, rb: Path) -> list[str]:
    s = a.suffix
    if s in (".json", ".yaml", ".yml"):
        return _diff(_load_tree(a, ra), _load_tree(b, rb))
    if s == ".onnx":
        return [] if _onnx_canonical(a) == _onnx_canonical(b) else ["graph or weights differ"]
    if s == ".data" and a.with_suffix("").suffix == ".onnx" and a.with_suffix("").exists():
        return []  # compared with its graph, tensor by tensor
    if s == ".npz":
        with np.load(a, allow_pickle=False) as x, np.load(b, allow_pickle=False) as y:
            if sorted(x.files) != sorted(y.files):
                return [f"arrays {sorted(x.files)} -> {sorted(y.files)}"]
            return [f"array {k} differs" for k in x.files if not _same_array(x[k], y[k])]
    if s == ".csv":
        return _diff(_csv_rows(a), _csv_rows(b))
    if s == ".tar":
        return _diff({k: v.hex() for k, v in _tar_members(a).items()}, {k: v.hex() for k, v in _tar_members(b).items()})
    if s in (".md", ".html", ".rst", ".txt"):
        return _diff(_text(a, ra), _text(b, rb))
    if s == ".png" and a.name in TIMED_FIGURES:
        return []
    return [] if a.read_bytes() == b.read_bytes() else ["bytes differ"]


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
            and not SKIP_DIRS & set(p.relative_to(root).parts) and p.suffix not in SKIP_SUFFIXES
            and not p.name.startswith(".snakemake") and p.name not in SKIP_NAMES}


def compare(before: Path, after: Path) -> list[str]:
    fa, fb = files(before), files(after)
    out = [f"{f}: only before" for f in sorted(fa - fb)] + [f"{f}: only after" for f in sorted(fb - fa)]
    for f in sorted(fa & fb):
        out += [f"{f}: {d}" for d in compare_file(before / f, after / f, before, after)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    diffs = compare(args.before, args.after)
    for d in diffs:
        print(d)
    n = len(files(args.before) | files(args.after))
    print(f"{n} files compared: {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
