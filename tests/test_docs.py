"""Every `make` command the README, the docs and the config files document does what it says: the
target exists, and the Snakemake run it starts reads the config the text names (make -n). The
README's benchmark tables are the bench scripts' output. And the docs cannot go stale silently:
what the code defines is in the docs that list it, no doc says "not yet" about what exists, and
every module path a doc names is a current one."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

DOCUMENTED = re.compile(r"(?<![a-z])make ([a-z][a-z0-9-]*)((?: [A-Z_]+=[^\s`)\"]+)*)")
#: The config each target reads when the command names none.
DEFAULT_CONFIG = {"run": "config/config.yaml", "report": "config/config.yaml", "scale": "config/scale.yaml",
                  "scale-int4": "config/scale-int4.yaml"}


def documented() -> set[tuple[str, str]]:
    files = [REPO / "README.md", REPO / "config" / "README.md", *(REPO / "docs").glob("*.md"),
             *(REPO / "config").glob("*.yaml")]
    found = set()
    for f in files:
        for target, variables in DOCUMENTED.findall(f.read_text()):
            found.add((target, variables.strip()))
    return found


def test_every_documented_make_command_uses_the_config_it_names():
    cmds = documented()
    assert ("run", "CONFIG=config/tiny-qwen3vl.yaml") in cmds and ("scale", "") in cmds
    for target, variables in sorted(cmds):
        args = variables.split() if variables else []
        if "CONFIG=..." in args or any(a.startswith("CONFIG=my") for a in args):
            args = [a for a in args if not a.startswith("CONFIG=")] + ["CONFIG=config/tiny-qwen2vl.yaml"]
        r = subprocess.run(["make", "-n", target, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"make -n {target} {variables}: {r.stderr[-500:]}"
        want = next((a.split("=", 1)[1] for a in args if a.startswith("CONFIG=")), DEFAULT_CONFIG.get(target))
        runs = [line for line in r.stdout.splitlines() if "bin/snakemake" in line]
        if target in DEFAULT_CONFIG:
            assert runs and all(f"--configfile {want}" in line for line in runs), (target, variables, runs)
            assert (REPO / want).is_file()


def test_readme_tables_are_the_bench_scripts_output():
    """Every table the README quotes from docs/benchmarks/ (what a bench script wrote) is that
    file's table, character for character (bench/readme_tables.py copies them), and a changed
    number is caught."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_tables", REPO / "bench" / "readme_tables.py")
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)
    readme = (REPO / "README.md").read_text()
    found = rt.quoted(readme)
    assert found, "README.md quotes no benchmark table"
    for file, n, body, table in found:
        assert table, f"{file} has no table {n}"
        assert body == table, f"README.md's copy of {file} table {n} is stale: python bench/readme_tables.py"
    file, n, body, table = found[0]
    changed = readme.replace(body, body.replace("|", "| 9", 1), 1)
    assert any(b != t for _, _, b, t in rt.quoted(changed))


# --- Docs that cannot go stale silently --------------------------------------------------------
# What the code defines (deploy precisions, graph kinds, report categories, rules files) is in the
# docs that list it; no doc says "not yet" about what exists; no doc names a module path that only
# imports through the deprecated-path table.

#: The docs these tests read: the README, docs/*.md (not the generated docs/benchmarks/, not the
#: CHANGELOG, which names old paths on purpose) and config/README.md.
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "config" / "README.md"]


def _doc(name: str) -> str:
    return (REPO / name).read_text()


def _flat(text: str) -> str:
    """The text with every run of whitespace one space: a line break does not hide a phrase."""
    return " ".join(text.split())


def _table_first_cells(text: str, header: str) -> list[str]:
    """First cells (backticks stripped) of the rows of every markdown table whose header's first
    cell is ``header``."""
    cells, in_table = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        first = line.split("|")[1].strip()
        if not in_table:
            in_table, take = True, first == header
        elif take and not set(first) <= set("-: "):
            cells.append(first.replace("`", ""))
    return cells


DEPLOY_PATH = re.compile(r"(?<![\w.])(?<!vlsens/)deploy/(?:([a-z0-9_-]+)|\{([a-z0-9_,-]+)\})/")


def _deploy_paths(text: str) -> set[str]:
    """Precisions named in ``deploy/<precision>/`` (or ``deploy/{a,b}/``) paths."""
    return {n for one, many in DEPLOY_PATH.findall(text) for n in ([one] if one else many.split(","))}


#: Where each doc lists the deploy folders: a table (by the header of its first column) or paths.
DEPLOY_LISTS = {"README.md": lambda t: set(_table_first_cells(t, "precision")),
                "docs/deploy.md": lambda t: set(_table_first_cells(t, "folder")),
                "docs/graphs.md": _deploy_paths}


def test_every_deploy_precision_is_in_the_docs_that_list_them():
    from vlsens.deploy import PRECISIONS

    assert len(PRECISIONS) == 7
    for name, listing in DEPLOY_LISTS.items():
        listed = listing(_doc(name))
        assert set(PRECISIONS) <= listed, f"{name} does not list deploy folder(s) {set(PRECISIONS) - listed}"
    # no doc names a deploy folder that is not built, or counts them wrong ("default all three")
    words = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
    for f in DOC_FILES:
        text = f.read_text()
        stale = _deploy_paths(text) - set(PRECISIONS)
        assert not stale, f"{f.relative_to(REPO)} names deploy folder(s) {stale}: deploy.PRECISIONS has no such precision"
        for many in [m for _, m in DEPLOY_PATH.findall(text) if m]:  # deploy/{a,b}/ enumerates the folders
            assert set(many.split(",")) == set(PRECISIONS), f"{f.relative_to(REPO)}: deploy/{{{many}}}/ is not every folder"
        for n in re.findall(r"`deploy\.precisions`[^.]{0,40}?\bdefault all (\w+)", _flat(text)):
            assert words.get(n, n) in (len(PRECISIONS), str(len(PRECISIONS))), \
                f"{f.relative_to(REPO)}: deploy.precisions 'default all {n}', and there are {len(PRECISIONS)}"


def _tower_patterns() -> dict[str, str]:
    """kind -> the regular expression its graph names match, of every builtin tower."""
    from vlsens.export.towers import BUILTIN, load_class

    return {kind: load_class(path).pattern for kind, path in BUILTIN.items()}


def _graph_names(names) -> list[str]:
    """The names in ``names`` that are graph names (``vision/<H>x<W>...``, or a whole name such as
    ``text``), with ``<H>x<W>`` made a size."""
    kinds = _tower_patterns()
    out = []
    for n in names:
        concrete = n.replace("<H>x<W>", "224x224")
        if n.startswith("vision/") or any(re.fullmatch(p, concrete) for p in kinds.values()):
            out.append(concrete)
    return out


def test_every_graph_kind_is_in_the_docs_that_list_them():
    """The README's graph table and docs/graphs.md's list (its first paragraph) name every kind of
    graph of the tower registry, in the form its graphs are named (``vision/<H>x<W>-u8``, ...), and
    nothing that no tower builds."""
    kinds = _tower_patterns()
    assert {"vision_fixed", "vision_uint8", "vision_video", "vision_dynamic", "text", "decoder"} <= set(kinds)
    graphs_md = _doc("docs/graphs.md").split("## What it builds", 1)[1].split("```", 1)[0]
    lists = {"README.md (table 'graph')": _graph_names(_table_first_cells(_doc("README.md"), "graph")),
             "docs/graphs.md ('What it builds')": _graph_names(re.findall(r"`([^`]+)`", graphs_md))}
    for where, names in lists.items():
        missing = [k for k, p in kinds.items() if not any(re.fullmatch(p, n) for n in names)]
        assert not missing, f"{where} lists no graph of tower kind(s) {missing} (patterns {[kinds[k] for k in missing]})"
        stale = [n for n in names if not any(re.fullmatch(p, n) for p in kinds.values())]
        assert not stale, f"{where} lists graph(s) {stale} that no tower of vlsens.export.towers.BUILTIN builds"


def _report_categories() -> dict[str, int]:
    """Category name -> its number in a run that draws every category (vlsens.report.CATEGORIES,
    numbered at DAG build over the categories a run draws); the report's rules file each output
    under ``CATEGORY[name]``."""
    from vlsens.report import CATEGORIES

    used = {c for f in (REPO / "rules").glob("*.smk") for c in re.findall(r'CATEGORY\["([^"]+)"\]', f.read_text())}
    assert used == {c for c, _ in CATEGORIES}, "the rules file their report outputs under CATEGORY[name]"
    return {c: i for i, (c, _) in enumerate(CATEGORIES, 1)}


def test_report_categories_are_numbered_without_gaps():
    """A run that draws no engine agreement (the default: one engine) numbers the rest 1..7."""
    from vlsens.report import CATEGORIES, numbered_categories

    targets = [f"r/{f.replace('*', 'ort')}" for c, files in CATEGORIES if c != "Engine agreement" for f in files]
    got = numbered_categories(targets)
    assert got["Engine agreement"] == "Engine agreement"
    assert sorted(int(v.split(".")[0]) for v in got.values() if v[0].isdigit()) == list(range(1, len(CATEGORIES)))
    assert got["Whole-VLM plan"] == f"{len(CATEGORIES) - 1}. Whole-VLM plan"


def test_every_report_category_is_in_docs_report_md():
    categories = _report_categories()
    rows = _table_first_cells(_doc("docs/report.md"), "category")
    documented = {}
    for row in rows:
        m = re.fullmatch(r"(?:(\d+)\.\s*)?(.+)", row)
        documented[m[2].strip()] = int(m[1]) if m[1] else None
    numbers = [n for n in categories.values() if n is not None]
    assert sorted(numbers) == list(range(1, len(numbers) + 1)), f"the rules number the categories {sorted(numbers)}"
    for name, number in categories.items():
        assert any(name == d or name.startswith(f"{d}:") for d in documented), \
            f"docs/report.md's category table has no row for report category '{name}'"
        doc_number = next(n for d, n in documented.items() if name == d or name.startswith(f"{d}:"))
        assert number is None or doc_number == number, f"'{name}': number {number} in the rules, {doc_number} in docs/report.md"
    stale = [d for d in documented if not any(n == d or n.startswith(f"{d}:") for n in categories)]
    assert not stale, f"docs/report.md lists report categories no rule draws: {stale}"


def test_every_rules_file_is_in_docs_architecture_md():
    """docs/architecture.md names every rules file (`rules/<name>.smk`, or `<name>.smk` in its
    package table's rules column)."""
    text = _doc("docs/architecture.md")
    rules = sorted(p.name for p in (REPO / "rules").glob("*.smk"))
    assert len(rules) >= 9
    missing = [r for r in rules if f"`rules/{r}`" not in text and f"`{r}`" not in text]
    assert not missing, f"docs/architecture.md does not describe {missing}"


def test_readme_links_every_doc():
    readme = _doc("README.md")
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert not missing, f"README.md's documentation table does not link {missing}"


# "Not there yet" claims. A doc that says something does not exist (yet) goes stale the day it
# does. Each such statement the docs make is registered here with a check of whether the thing
# exists now; the test fails while a doc still says it is missing and the check says it is there.
# A new "not yet" sentence in a doc fails too until it is registered (or listed as exempt).

def _tower_class(kind: str):
    from vlsens.export.towers import BUILTIN, load_class

    return load_class(BUILTIN[kind])


def _family(model_type: str):
    from vlsens.model.family import FAMILIES

    return FAMILIES[model_type]


def _source(module: str) -> str:
    return Path(importlib.util.find_spec(module).origin).read_text()


def _gpu_benchmark() -> bool:
    """Whether a benchmark under docs/benchmarks/ was measured on a GPU (its ``Machine:`` line)."""
    return any(re.search(r"^Machine:.*\b(GPU|CUDA|NVIDIA|H100|H200|A100)\b", p.read_text(), re.M)
               for p in (REPO / "docs" / "benchmarks").glob("*.md"))


def _scale_int8_vision() -> bool:
    import yaml

    cfg = yaml.safe_load((REPO / "config" / "scale.yaml").read_text())
    return bool(cfg["vision"]["dynamic"].get("sensitivity_variants"))


#: (phrase: a regular expression over a doc's text with whitespace runs made one space, what the
#: phrase says is missing, whether it exists now).
def _trained_reaches_goal() -> bool:
    """The shipped trained preset answers at least 90 % of each modality (its training record)."""
    import json

    acc = json.loads((REPO / "src/vlsens/model/presets/trained/tiny/training.json").read_text())["accuracy"]
    return all(v["accuracy"] >= 0.9 for v in acc["modalities"].values())


def _family_ships(family: str) -> bool:
    from vlsens.model.family import get

    return bool(get(family).deploy)


CLAIMS = [
    (r"The trained preset does not yet reach the 90 % per modality", "the trained preset at 90 % per modality",
     _trained_reaches_goal),
    (r"so vlsens writes no deploy folder for them yet", "deploy folders for Qwen2-VL and Qwen3-VL",
     lambda: _family_ships("qwen2_vl") and _family_ships("qwen3_vl")),
    (r"not there yet\b[^.]*video in the text graphs", "video in the text graphs",
     lambda: "def video_inputs(" in _source("vlsens.export.towers.prompts")),
    (r"not there yet\b[^.]*per-temporal-step fixed-size graph", "the per-temporal-step vision graph",
     lambda: "vision_video" in _tower_patterns()),
    (r"its text video case is not built", "Qwen3-VL's text video case", lambda: _family("qwen3_vl").video_prompt),
    (r"timestamped video prompts are not built", "Qwen3-VL's text video case", lambda: _family("qwen3_vl").video_prompt),
    (r"with a Qwen2-VL or Qwen3-VL checkpoint is refused", "deploy folders for Qwen2-VL / Qwen3-VL",
     lambda: _family("qwen2_vl").deploy or _family("qwen3_vl").deploy),
    (r"Engine `inc` analyses fixed-size FP32 vision graphs only", "engine inc on other graphs",
     lambda: any("inc" in _tower_class(k).engines for k in ("vision_uint8", "vision_video", "vision_dynamic",
                                                             "text", "decoder"))),
    (r"engine `inc` does not \(its ONNX adaptor takes float inputs only\)", "engine inc on the uint8 graph",
     lambda: "inc" in _tower_class("vision_uint8").engines),
    (r"no fused attention kernel is used yet", "a fused attention kernel in the dynamic vision graph",
     lambda: bool(re.search(r"scaled_dot_product_attention|MultiHeadAttention|GroupQueryAttention",
                            _source("vlsens.export.towers.vision_dynamic")))),
    (r"have not been run on a GPU yet", "a benchmark measured on a GPU", _gpu_benchmark),
    (r"which `make scale` does not compute", "the dynamic vision graph's profile in config/scale.yaml",
     _scale_int8_vision),
    (r"Not yet run at 3B", "the whole-VLM plan at 3B", lambda: _plan_3b()),
    (r"then the profiles\) has not run to its end yet", "the 3B NPU profiles (docs/benchmarks/npu-3b.md)",
     lambda: (REPO / "docs" / "benchmarks" / "npu-3b.md").exists()),
    (r"that run has not been made yet", "the whole-VLM plan at 3B", lambda: _plan_3b()),
    (r"3B by arithmetic, not yet run", "the whole-VLM plan at 3B", lambda: _plan_3b()),
    (r"2\.3 h for `m` = 36 against 16\.5 h for all 253; not run at 3B yet", "the decoder's estimate at 3B",
     lambda: _plan_3b()),
    (r"Not done yet \(the rest of this work\): the 3B front at full depth", "the whole-VLM plan at 3B",
     lambda: _plan_3b()),
    (r"Not done yet \(the rest of this work\)[^.]*checked at real widths",
     "the decode-step estimate measured at real widths (docs/benchmarks/decode-step-3b*.md)",
     lambda: any((REPO / "docs" / "benchmarks").glob("decode-step-3b*.md"))),
]


def _plan_3b() -> bool:
    """A published measured front of a 3B run."""
    return any((REPO / "docs" / "benchmarks").glob("plan-3b*.md"))
#: "Not yet" phrases that claim nothing a check could find (phrase -> why).
EXEMPT = {r"not explained yet": "a measurement the docs cannot explain yet, not a missing feature"}
#: What counts as a "not there yet" statement.
NOT_YET = re.compile(r"\byet\b|\bTODO\b|\b(?:still|left) to do\b|\bplanned\b|\b(?:coming|upcoming) (?:soon|later|next)\b"
                     r"|\bin a (?:future|later) (?:release|version)\b", re.I)


@pytest.mark.parametrize("phrase,what,exists", CLAIMS, ids=[c[1] for c in CLAIMS])
def test_no_doc_says_not_yet_about_what_exists(phrase, what, exists):
    said = [f.relative_to(REPO).as_posix() for f in DOC_FILES if re.search(phrase, _flat(f.read_text()))]
    assert not (said and exists()), f"{', '.join(said)} say(s) {what} is missing, and it exists now: update the doc"


def test_every_not_yet_statement_in_the_docs_is_checked():
    for f in DOC_FILES:
        text = _flat(f.read_text())
        covered = [m.span() for p in [c[0] for c in CLAIMS] + list(EXEMPT) for m in re.finditer(p, text)]
        for m in NOT_YET.finditer(text):
            assert any(a <= m.start() < b for a, b in covered), \
                f"{f.relative_to(REPO)}: '...{text[max(0, m.start() - 100):m.end() + 40]}...' says something is " \
                "not there yet: register it in tests/test_docs.py's CLAIMS with a check of whether it exists"


def test_claim_checks_see_what_exists():
    """The checks are not blind: the two things docs/graphs.md once said were not there yet are."""
    claims = {what: exists for _, what, exists in CLAIMS}
    assert claims["video in the text graphs"]() and claims["the per-temporal-step vision graph"]()
    assert not claims["Qwen3-VL's text video case"]() and not claims["engine inc on the uint8 graph"]()


# Module paths. Every `vlsens.<name>` a doc names imports as it is written, not through the
# deprecated-path table (vlsens.MOVED), and the name after the module (a function, class or
# constant) is defined there.

DOTTED = re.compile(r"(?<![\w./-])vlsens(?:\.[A-Za-z_]\w*)+")


def _defined_names(path: str) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, imports), read
    from its source: nothing is imported."""
    import ast

    names, todo = set(), list(ast.parse(Path(path).read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
    return names


def _resolve(dotted: str) -> tuple[str | None, list[str], str | None]:
    """``(module, the attribute path after it, the new path if the module is a deprecated one)``:
    the longest importable prefix of ``dotted``."""
    import vlsens

    parts = dotted.split(".")
    for k in range(2, len(parts) + 1):  # an old path, or a submodule of one
        if (module := ".".join(parts[:k])) in vlsens.MOVED:
            return module, parts[k:], ", ".join(vlsens.MOVED[module])
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError, AttributeError):  # a prefix that is a module's attribute
            spec = None
        if spec is not None:
            return module, parts[k:], None
    return None, parts, None


def test_docs_name_no_deprecated_module_path():
    """A paragraph that names ``vlsens.MOVED`` (the table of old paths) may name old paths as
    examples of it; every other ``vlsens.<name>`` in the docs is a current path."""
    checked, bad = 0, []
    for f in DOC_FILES:
        for para in re.split(r"\n\s*\n", f.read_text()):
            explains_moves = "vlsens.MOVED" in para
            for dotted in sorted(set(DOTTED.findall(para))):
                module, rest, new = _resolve(dotted)
                checked += 1
                where = f"{f.relative_to(REPO)}: {dotted}"
                if module is None:
                    bad.append(f"{where}: no such module")
                elif new:
                    if not explains_moves:
                        bad.append(f"{where}: deprecated path (vlsens.MOVED), now {new}")
                elif rest and rest[0] not in _defined_names(importlib.util.find_spec(module).origin):
                    bad.append(f"{where}: {module} defines no '{rest[0]}'")
    assert checked > 30, checked
    assert not bad, "\n".join(bad)


def test_deprecated_path_check_catches_an_old_path():
    assert _resolve("vlsens.runtime.Chat")[2] == "vlsens.deploy.genai.runtime"
    assert _resolve("vlsens.deploy.genai.runtime.Chat") == ("vlsens.deploy.genai.runtime", ["Chat"], None)
    assert _resolve("vlsens.profile")[2] == "vlsens.precision.int8"
    assert "Chat" in _defined_names(importlib.util.find_spec("vlsens.deploy.genai.runtime").origin)
    assert "nope" not in _defined_names(importlib.util.find_spec("vlsens.deploy.genai.runtime").origin)
