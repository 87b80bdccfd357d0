#!/usr/bin/env python
"""Copy the benchmark tables the README quotes from ``docs/benchmarks/`` (what the bench scripts
wrote) into the README, so its numbers are the scripts' output, never hand copies.

A quoted table sits between two markers in README.md::

    <!-- table from docs/benchmarks/int4-tiny.md, 1 -->
    | ... |
    <!-- end table -->

(``1``: the first table of that file). ``tests/test_docs.py`` fails while a quoted table differs
from its file; after re-running a bench script, ``python bench/readme_tables.py`` updates them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"<!-- table from (?P<file>\S+), (?P<n>\d+) -->\n(?P<body>.*?)<!-- end table -->", re.S)


def tables(text: str) -> list[str]:
    """The markdown tables of ``text`` (runs of lines starting with ``|``), in order."""
    out, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            out.append("\n".join(cur) + "\n")
            cur = []
    if cur:
        out.append("\n".join(cur) + "\n")
    return out


def quoted(readme: str, root: Path = ROOT) -> list[tuple[str, int, str, str]]:
    """``(file, n, README's body, the file's table n)`` of every quoted table."""
    out = []
    for m in MARK.finditer(readme):
        src = root / m["file"]
        found = tables(src.read_text()) if src.is_file() else []
        n = int(m["n"])
        out.append((m["file"], n, m["body"], found[n - 1] if 0 < n <= len(found) else ""))
    return out


def refresh(readme: str, root: Path = ROOT) -> str:
    def sub(m):
        src = root / m["file"]
        found = tables(src.read_text())
        n = int(m["n"])
        if not 0 < n <= len(found):
            raise SystemExit(f"{m['file']} has {len(found)} table(s); README.md quotes table {n}")
        return f"<!-- table from {m['file']}, {n} -->\n{found[n - 1]}<!-- end table -->"

    return MARK.sub(sub, readme)


def main() -> None:
    path = ROOT / "README.md"
    old = path.read_text()
    new = refresh(old)
    if new != old:
        path.write_text(new)
    print(f"README.md: {len(quoted(new))} quoted table(s), {'updated' if new != old else 'already current'}")


if __name__ == "__main__":
    sys.exit(main())
