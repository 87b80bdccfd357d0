"""Copied blocks: pairs of places that share runs of ``--min-lines`` (6) or more lines.

Lines are compared with white space folded, passing over blank lines, comment lines, lone
punctuation and imports. Two runs match when their lines are the same, or the same in shape: the
same tokens but for names, strings and numbers (placeholders). A shape says little where most
lines are thin (a lone string, ``log:``, ``rule export:``, a decorator, ``key = "literal"``, a
field ``title: str``): a run of those matches only to the letter. A run standing in more than
``--most-common`` (8) places is too common to list (a convention, not a copy; one line counts
them). One row per pair of files (a file with itself included): its longest shared run,
``shape`` when no run of the pair is the same to the letter, and ``(+N more runs)``. With
``--max N`` it exits 1 when there are more than N pairs (``make lint``):

    python tests/duplicates.py --max 1 src
    python tests/duplicates.py --max 18 rules Snakefile

Folders contribute their .py and .smk files; a file named on the command line always counts. A
standalone script, standard library only; ``find_pairs`` is its function (tests/test_duplicates.py).
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

#: The files a folder given as a root contributes (a file named as a root always counts).
SUFFIXES = (".py", ".smk")
SKIP_DIRS = {"__pycache__", ".git", ".venv", ".venv-inc", "node_modules", "results", ".snakemake"}

_TOKEN = re.compile(
    r"""(?P<s>[rRbBuUfF]{0,2}(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"))"""
    r"""|(?P<n>\d[\w.]*)"""
    r"""|(?P<i>[^\W\d]\w*)"""
    r"""|(?P<c>\#.*)"""
    r"""|(?P<p>\S)"""
)
_PUNCTUATION = re.compile(r"^[\s()\[\]{}:,;.*+\-=<>|&^%!/\\'\"`@~]*$")
_IMPORT = re.compile(r"^(import\s+\w|from\s+[\w.]+\s+import\b)")
_KEYWORDS = set(keyword.kwlist) | {"self", "cls"}


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in the file
    text: str  # white space folded
    tokens: tuple  # (kind, value): kind "s" string, "n" number, "i" name, "p" punctuation or keyword


@dataclass
class Run:
    a: tuple[int, int]  # first and last line numbers in file a
    b: tuple[int, int]
    exact: bool  # some min_lines-long stretch of it is the same to the letter

    @property
    def length(self) -> int:
        return max(self.a[1] - self.a[0], self.b[1] - self.b[0]) + 1


@dataclass
class Pair:
    a: str
    b: str
    runs: list[Run] = field(default_factory=list)

    @property
    def longest(self) -> Run:
        return max(self.runs, key=lambda r: (r.length, r.exact))

    @property
    def shape(self) -> bool:
        return not any(r.exact for r in self.runs)

    def __str__(self) -> str:
        r = self.longest
        more = len(self.runs) - 1
        return (f"{self.a}:{r.a[0]}-{r.a[1]} ~ {self.b}:{r.b[0]}-{r.b[1]}"
                + (" shape" if self.shape else "")
                + (f" (+{more} more run{'s' if more > 1 else ''})" if more else ""))


@dataclass
class Result:
    pairs: list[Pair]
    files: int
    too_common: int  # distinct runs of min_lines lines left out: they stand in more than most_common places


def tokens(text: str) -> tuple:
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "c":
            break
        value = m.group()
        if kind == "i" and value in _KEYWORDS:
            kind = "p"
        out.append((kind, value))
    return tuple(out)


def significant_lines(text: str) -> list[Line]:
    """The lines that count: no blank, comment, lone punctuation or import line; white space folded."""
    lines, in_import = [], False
    for number, raw in enumerate(text.splitlines(), 1):
        folded = " ".join(raw.split())
        if in_import:
            in_import = ")" not in folded
            continue
        if not folded or folded.startswith("#") or _PUNCTUATION.match(folded):
            continue
        if _IMPORT.match(folded):
            in_import = folded.endswith("(")
            continue
        lines.append(Line(number, folded, tokens(folded)))
    return lines


_LITERAL = {"s", "n"}


def thin(line: Line) -> bool:
    """A line that says little by its shape: no name (a lone string, numbers, keywords), a name
    alone before a colon (``log:``, ``else:``, ``rule export:``), a decorator, a name given a
    literal (``key = "vision"``) or a declared field (``title: str``)."""
    kinds = [kind for kind, _ in line.tokens]
    values = [value for _, value in line.tokens]
    if "i" not in kinds:
        return True
    if kinds in (["i", "p"], ["i", "i", "p"]) and values[-1] == ":":  # log:, else:, rule export:
        return True
    if kinds[0] == "p" and values[0] == "@":
        return len(line.tokens) == 2
    if kinds[0] != "i" or len(kinds) < 2 or values[1] not in (":", "="):
        return False
    rest = list(line.tokens[2:])
    if values[1] == ":" and rest[:1] and rest[0][0] == "i":  # a field: name: type [= literal]
        rest = rest[1:]
        if rest[:1] == [("p", "=")]:
            rest = rest[1:]
        elif not rest:
            return True
    return len(rest) <= 1 and all(kind in _LITERAL or value in ("True", "False", "None") for kind, value in rest)


def key(lines: list[Line]) -> tuple:
    """What a window of lines is matched by: its shape (names, strings and numbers replaced by
    placeholders) where at least half of its lines are not thin, else its text."""
    if 2 * sum(not thin(line) for line in lines) < len(lines):
        return ("text", *(line.text for line in lines))
    return ("shape", *(" ".join(value if kind == "p" else kind for kind, value in line.tokens) for line in lines))


def source_files(roots: list[str | Path]) -> list[Path]:
    files = []
    for root in map(Path, roots):
        if root.is_file():
            files.append(root)
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
            files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(SUFFIXES)]
    return files


def _label(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def find_pairs(roots: list[str | Path], min_lines: int = 6, most_common: int = 8) -> Result:
    files = source_files(roots)
    lines = {}
    for path in files:
        try:
            lines[_label(path)] = significant_lines(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    # every window of min_lines significant lines, by what it is matched by
    places = defaultdict(list)
    for name, ls in lines.items():
        for i in range(len(ls) - min_lines + 1):
            places[key(ls[i:i + min_lines])].append((name, i))
    too_common = 0
    matches = defaultdict(set)  # (file a, file b, offset) -> window starts in a
    for group in places.values():
        if len(group) < 2:
            continue
        if len(group) > most_common:
            too_common += 1
            continue
        for x in range(len(group)):
            for y in range(x + 1, len(group)):
                (fa, i), (fb, j) = sorted((group[x], group[y]))
                if fa == fb and j - i < min_lines:
                    continue  # a run overlapping itself
                matches[(fa, fb, j - i)].add(i)
    pairs: dict[tuple[str, str], Pair] = {}
    for (fa, fb, offset), starts in sorted(matches.items()):
        la, lb = lines[fa], lines[fb]
        run_starts = sorted(starts)
        chains, chain = [], [run_starts[0]]
        for i in run_starts[1:]:
            if i == chain[-1] + 1:
                chain.append(i)
            else:
                chains.append(chain)
                chain = [i]
        chains.append(chain)
        pair = pairs.setdefault((fa, fb), Pair(fa, fb))
        for chain in chains:
            first, last = chain[0], chain[-1] + min_lines - 1
            exact = any(
                all(la[k].text == lb[k + offset].text for k in range(i, i + min_lines)) for i in chain
            )
            pair.runs.append(Run((la[first].number, la[last].number),
                                 (lb[first + offset].number, lb[last + offset].number), exact))
    for pair in pairs.values():
        pair.runs = _merge(pair.runs)
    ordered = sorted(pairs.values(), key=lambda p: (p.shape, -p.longest.length, p.a, p.b))
    return Result(ordered, len(lines), too_common)


def _merge(runs: list[Run]) -> list[Run]:
    """Runs of one pair of files that overlap or touch on both sides are one place."""
    merged: list[Run] = []
    for r in sorted(runs, key=lambda r: (r.a, r.b)):
        for m in merged:
            if r.a[0] <= m.a[1] + 1 and m.a[0] <= r.a[1] + 1 and r.b[0] <= m.b[1] + 1 and m.b[0] <= r.b[1] + 1:
                m.a = (min(m.a[0], r.a[0]), max(m.a[1], r.a[1]))
                m.b = (min(m.b[0], r.b[0]), max(m.b[1], r.b[1]))
                m.exact = m.exact or r.exact
                break
        else:
            merged.append(Run(r.a, r.b, r.exact))
    return merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", help="folders (their .py and .smk files) and files")
    ap.add_argument("--max", type=int, default=None, help="exit 1 when there are more pairs than this")
    ap.add_argument("--min-lines", type=int, default=6)
    ap.add_argument("--most-common", type=int, default=8, help="a run in more places than this is not listed")
    args = ap.parse_args(argv)
    result = find_pairs(args.roots, args.min_lines, args.most_common)
    n = len(result.pairs)
    print(f"{n} pair{'s' if n != 1 else ''} of places ({result.files} files read) sharing runs of "
          f"{args.min_lines} or more identical or same-shape lines ({sum(p.shape for p in result.pairs)} by shape alone)")
    for k, pair in enumerate(result.pairs, 1):
        print(f"D{k} {pair}")
    if result.too_common:
        print(f"left out: {result.too_common} run(s) of {args.min_lines} lines that stand in more than "
              f"{args.most_common} places each (too common to list)")
    if args.max is not None and n > args.max:
        print(f"duplicates: {n} pairs of places in {' '.join(args.roots)}, at most {args.max} allowed: "
              "let one piece of code serve both places", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
