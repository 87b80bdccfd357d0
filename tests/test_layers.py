"""The package's layout is the picture docs/architecture.md draws ("Packages"): every module is
placed in one row, a package imports only the packages its row allows, nothing imports in a
circle, and the generic packages name no tower, graph, family or checkpoint module."""

import ast
import re
import warnings
from pathlib import Path

import pytest
from conftest import REPO

from vlsens.core.versions import _module_file, _vlsens_imports

SRC = REPO / "src" / "vlsens"
DOC = REPO / "docs" / "architecture.md"


def _ticks(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def packages() -> dict[str, dict]:
    """The rows of architecture.md's "Packages" table: package -> modules (dotted, full), rules
    files, packages it may import, generic (bool) ."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Packages"):]
    section = section[:section.index("\n\n", section.index("| package |"))]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[0].startswith("`"):
            continue
        name = _ticks(cells[0])[0]
        full = f"vlsens.{name}"
        modules = {full} | {f"{full}.{m}" for m in _ticks(cells[1])}
        rows[name] = {"modules": modules, "rules": _ticks(cells[3]), "may": set(_ticks(cells[4])),
                      "generic": cells[5] == "yes"}
    return rows


def tree_modules() -> set[str]:
    return {"vlsens." + ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
            for p in SRC.rglob("*.py")} - {"vlsens.__init__"}


def row_of(module: str, rows: dict) -> str:
    """The most specific row that lists ``module``."""
    return max((name for name, r in rows.items() if module in r["modules"]), key=len)


def test_every_module_is_placed_once_and_every_placed_module_exists():
    rows = packages()
    assert {"core", "export.towers", "precision", "deploy", "cli"} <= set(rows), sorted(rows)
    tree = tree_modules() - {"vlsens"}
    placed = [m for r in rows.values() for m in r["modules"]]
    assert sorted(tree - set(placed)) == [], "modules docs/architecture.md does not place"
    assert sorted(set(placed) - tree) == [], "docs/architecture.md places modules that do not exist"
    assert len(placed) == len(set(placed)), "a module placed twice"


def test_a_package_imports_only_what_its_row_allows():
    rows = packages()
    wrong = []
    for m in sorted(tree_modules() - {"vlsens"}):
        own = row_of(m, rows)
        for i in _vlsens_imports(_module_file(m)):
            if _module_file(i) is None or i == "vlsens":
                continue
            other = row_of(i, rows)
            allowed = rows[own]["may"] | {own, own.split(".")[0]}
            if not any(other == p or other.startswith(p + ".") for p in allowed):
                wrong.append(f"{m} ({own}) imports {i} ({other})")
    assert wrong == []


def test_the_allowed_imports_form_no_circle():
    rows = packages()
    for name, r in rows.items():
        assert r["may"] <= set(rows), (name, r["may"] - set(rows))
    done, path = set(), []

    def visit(p):
        if p in path:
            raise AssertionError("packages that may import each other: " + " -> ".join(path[path.index(p):] + [p]))
        if p not in done:
            path.append(p)
            for q in sorted(rows[p]["may"]):
                visit(q)
            path.pop()
            done.add(p)

    for p in sorted(rows):
        visit(p)


def test_the_package_has_no_import_cycle():
    """Imports inside functions count too: a cycle hidden in a function is still a cycle."""
    modules = tree_modules() - {"vlsens"}
    graph = {m: {i for i in _vlsens_imports(_module_file(m)) if i in modules and i != m} for m in modules}
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        path.append(m)
        for i in sorted(graph[m]):
            visit(i)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_every_rules_file_has_one_package():
    rows = packages()
    named = [f for r in rows.values() for f in r["rules"]]
    files = sorted(p.name for p in (REPO / "rules").glob("*.smk"))
    assert sorted(named) == files, "each rules file named in exactly one row of docs/architecture.md"


def test_editing_preset_code_reruns_nothing_of_a_real_checkpoint(monkeypatch):
    """The rerun trigger hashes every vlsens module a job's script (and its tower) imports: an edit
    to a preset's architecture, tokenizer, planted outlier or writer must change no hash of a job
    that runs on a user's own checkpoint (only the preset-building rules import them)."""
    import vlsens.export.towers
    from vlsens.core.versions import script_code_version

    scripts = sorted(p for p in (REPO / "workflow" / "scripts").glob("*.py") if not p.name.startswith(("build_", "_")))
    assert len(scripts) >= 10, scripts
    towers = sorted({path.partition(":")[0] for path in vlsens.export.towers.BUILTIN.values()})
    assert len(towers) >= 6, towers
    jobs = [(s, t) for s in scripts for t in towers]
    before = {(s.name, t): script_code_version(s, t) for s, t in jobs}
    preset_modules = sorted(m for m in packages()["model"]["modules"] if m.startswith("vlsens.model.presets."))
    assert {f"vlsens.model.presets.{m}" for m in ("tables", "plant", "build", "tokenizer")} == set(preset_modules)
    monkeypatch.setenv("VLSENS_VERSION_OVERRIDES", ",".join(f"{m}=edited" for m in preset_modules))
    after = {(s.name, t): script_code_version(s, t) for s, t in jobs}
    assert after == before
    # and the hash does see such an edit where the code is used: the preset's own rule
    build = REPO / "workflow" / "scripts" / "build_tiny_checkpoint.py"
    edited = script_code_version(build)
    monkeypatch.delenv("VLSENS_VERSION_OVERRIDES")
    assert script_code_version(build) != edited


def _known_names() -> tuple[set[str], tuple[str, ...]]:
    """What only a tower or the family table may know: graph names and tower kinds, the families'
    model types and onnxruntime-genai names, the checkpoint's module names (from
    ``NODE_NAMES``) -- read from the towers and the table themselves, so a new one is covered."""
    from dataclasses import fields

    import vlsens.export.towers as towers
    from vlsens.model.family import FAMILIES, NODE_NAMES

    words = {"vision", "text", "decoder", "embeds.onnx", "embedding.onnx", *towers.BUILTIN}
    for f in FAMILIES.values():
        words |= {f.model_type, *(v for v in (f.genai_type, f.genai_processor) if v)}
    modules = (*NODE_NAMES.prefixes, NODE_NAMES.lm_head)
    assert {field.name for field in fields(NODE_NAMES)} >= {"prefixes", "block", "vision_block", "lm_head", "logits"}
    return words, tuple(m for m in modules if m != "model")  # "model" is also the ONNX file's stem


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String literals of a module's code (docstrings left out), with their line numbers."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


#: The mark of a line whose literal names a prompt's modality ("text": no image), not the text tower.
MODALITY_MARK = "# a modality, not a graph"


def named_knowledge(path: Path) -> list[tuple[int, str]]:
    """The literals of ``path`` that name a tower, graph, family or checkpoint module: a whole
    literal or its first path component; a top module scope (``visual``) as a whole literal; a
    module name inside a node path or pattern (``/lm_head/MatMul``, ``(?:visual/)?blocks``). Prose
    in a message, and a record's field (``"lm_head": node.name``), may say "lm_head"."""
    words, modules = _known_names()
    from vlsens.model.family import NODE_NAMES

    scopes = {m for m in NODE_NAMES.prefixes if m != "model"}
    found = []
    source = path.read_text(encoding="utf-8").splitlines()
    for line, s in _code_strings(path):
        if source[line - 1].rstrip().endswith(MODALITY_MARK):  # a prompt's modality, the same word
            continue
        pathlike = not re.search(r"\s", s) and re.search(r"[/\\(]", s)
        if s in words or s in scopes or ("/" in s and s.split("/")[0] in words):
            found.append((line, s))
        elif pathlike and any(re.search(rf"(?<![A-Za-z]){re.escape(m)}(?![A-Za-z])", s) for m in modules):
            found.append((line, s))
    return found


def test_generic_packages_name_no_tower_family_or_module():
    """Per-tower differences live behind Tower attributes and hooks (logits, block_label,
    planted_site, outside inputs, profile settings), per-family ones in vlsens.model.family's
    tables (FAMILIES, NODE_NAMES): a generic package never compares a graph name, a tower kind,
    a model type or a checkpoint module's name."""
    rows = packages()
    generic = [m for m in tree_modules() - {"vlsens"} if rows[row_of(m, rows)]["generic"]]
    assert len(generic) > 40 and {"vlsens.quantize.qdq", "vlsens.report.figures", "vlsens.npu.cut"} <= set(generic)
    found = [(m, line, s) for m in sorted(generic) for line, s in named_knowledge(Path(_module_file(m)))]
    assert found == []


def test_the_literal_check_sees_what_it_is_for(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('A = "vision/dynamic"\nB = ("visual", "model")\nC = r"(?:visual/)?blocks"\nD = "qwen2_5_vl"\n'
                 'E = "the lm_head weight"\nF = "model.onnx"\nG = {"lm_head": 1}\nH = "/lm_head/MatMul"\n'
                 'I = "decoder"\nJ = "language_model.layers"\n')
    assert sorted({line for line, _ in named_knowledge(f)}) == [1, 2, 3, 4, 8, 9]


@pytest.mark.parametrize("old, new, name", [("vlsens.runtime", "vlsens.deploy.genai.runtime", "Chat"),
                                            ("vlsens.quant", "vlsens.quantize.qdq", "parse_op_name"),
                                            ("vlsens.towers.text", "vlsens.export.towers.text", "Text"),
                                            ("vlsens.parts", "vlsens.npu.build", "build_parts"),
                                            ("vlsens.fp16", "vlsens.variants.float16", "convert_fp16")])
def test_old_module_paths_import_for_one_release_with_a_warning(old, new, name):
    import importlib
    import sys

    import vlsens

    for m in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        del sys.modules[m]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and new.rsplit(".", 1)[0] in str(w.message) for w in caught)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    assert vlsens.moved_to(old) and all(importlib.util.find_spec(n) for n in vlsens.moved_to(old))


def test_every_old_path_leads_somewhere():
    import importlib.util

    import vlsens

    for old, new in vlsens.MOVED.items():
        assert old not in tree_modules(), f"{old} is both a module and a moved path"
        for n in new:
            assert importlib.util.find_spec(n) is not None, (old, n)
