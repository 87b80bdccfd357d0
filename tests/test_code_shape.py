"""The package's code shape: knobs that travel together are a settings object, not ten loose
parameters, and a long function is split into named steps or says in its docstring why it reads
better whole (a sentence beginning with "Long:")."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vlsens"
MAX_PARAMS = 9  # self / cls not counted
MAX_LINES = 60  # the def line to the last line, docstring included
LONG_REASON = "Long:"


def _functions():
    """``(module path, qualified name, node)`` of every function and method under ``src/vlsens``."""
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

        def walk(node, prefix=""):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield child, f"{prefix}{child.name}"
                    yield from walk(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    yield from walk(child, f"{prefix}{child.name}.")
                else:
                    yield from walk(child, prefix)

        for node, name in walk(tree):
            yield path.relative_to(SRC.parent), name, node


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def test_the_tree_has_functions_to_check():
    assert sum(1 for _ in _functions()) > 500


def test_no_function_takes_ten_or_more_parameters():
    offenders = [f"{path}:{node.lineno} {name} ({n} parameters)"
                 for path, name, node in _functions() if (n := _params(node)) > MAX_PARAMS]
    assert not offenders, (f"functions with more than {MAX_PARAMS} parameters (self/cls not counted); pass the knobs "
                           "that travel together as a settings object (a frozen dataclass):\n  " + "\n  ".join(offenders))


def test_no_function_is_longer_than_sixty_lines_without_a_reason():
    offenders = []
    for path, name, node in _functions():
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_LINES and LONG_REASON not in (ast.get_docstring(node) or ""):
            offenders.append(f"{path}:{node.lineno} {name} ({lines} lines)")
    assert not offenders, (f"functions over {MAX_LINES} lines; split them into named steps, or say why one reads "
                           f"better whole in its docstring (a sentence beginning with {LONG_REASON!r}):\n  "
                           + "\n  ".join(offenders))


def test_the_checks_catch_what_they_name():
    long_args = ", ".join(f"a{i}" for i in range(MAX_PARAMS + 1))
    wide = ast.parse(f"class C:\n    def f(self, {long_args}):\n        pass\n").body[0].body[0]
    assert _params(wide) == MAX_PARAMS + 1
    narrow = ast.parse("def f(self, a, *args, b, **kw):\n    pass\n").body[0]
    assert _params(narrow) == 4
