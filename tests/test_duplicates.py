"""tests/duplicates.py (make lint's copied-block check) on a tiny tree: a copied block and a
renamed copy are found, code that only looks alike line by line is not."""

import importlib.util
import sys
from pathlib import Path

# A script, not a package module: loaded from its file.
_spec = importlib.util.spec_from_file_location("duplicates", Path(__file__).with_name("duplicates.py"))
duplicates = sys.modules["duplicates"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(duplicates)

BLOCK = '''
def scale_rows(table, factor):
    """Every row of the table times factor, rounded."""
    out = []
    for row in table:
        scaled = [round(x * factor, 3) for x in row]
        out.append(scaled)
    total = sum(len(r) for r in out)
    print(f"scaled {total} values")
    return out
'''

# The same code with other names, strings and numbers: a copy by shape.
RENAMED = '''
def double_cells(grid, k):
    """Each cell doubled."""
    res = []
    for line in grid:
        cells = [round(v * k, 1) for v in line]
        res.append(cells)
    n = sum(len(c) for c in res)
    print(f"doubled {n} cells")
    return res
'''

# Lines of the same kinds (assignments, a loop, calls) in another order and nesting: not a copy.
OTHER = '''
def count_words(text, limit):
    words = text.split()
    if len(words) > limit:
        words = words[:limit]
    counts = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    best = max(counts, key=counts.get)
    return best, counts
'''


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text("import os\n\nPREFIX = os.sep\n" + BLOCK)
    (root / "b.py").write_text('"""Module b."""\n\n\nLIMIT = 3\n' + BLOCK + "\n\ndef other():\n    return LIMIT\n")
    (root / "c.py").write_text(RENAMED)
    (root / "d.py").write_text(OTHER)
    (root / "notes.txt").write_text(BLOCK)  # not a source file: not read
    return root


def test_finds_the_copy_and_the_renamed_copy_not_the_other_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _tree(tmp_path)
    result = duplicates.find_pairs(["pkg"])
    pairs = {(Path(p.a).name, Path(p.b).name): p for p in result.pairs}
    assert result.files == 4
    assert set(pairs) == {("a.py", "b.py"), ("a.py", "c.py"), ("b.py", "c.py")}, [str(p) for p in result.pairs]
    copy = pairs[("a.py", "b.py")]
    assert not copy.shape and copy.longest.a == (5, 13) and copy.longest.b == (6, 14)  # def ... return
    assert pairs[("a.py", "c.py")].shape and pairs[("b.py", "c.py")].shape
    assert not any("d.py" in (p.a + p.b) for p in result.pairs)


def test_max_fails_above_the_count_and_a_run_in_many_places_is_too_common(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _tree(tmp_path)
    assert duplicates.main(["--max", "3", "pkg"]) == 0
    assert duplicates.main(["--max", "2", "pkg"]) == 1
    out = capsys.readouterr().out
    assert "3 pairs of places" in out and "pkg/a.py:5-13 ~ pkg/b.py:6-14" in out
    for i in range(9):  # the block in nine more files: a convention, not a copy
        (tmp_path / "pkg" / f"e{i}.py").write_text(BLOCK)
    result = duplicates.find_pairs(["pkg"])
    assert result.too_common and not any("e0.py" in p.a + p.b for p in result.pairs)
