"""The package's layers (docs/architecture.md, Layout): no module imports from a layer above its own, so the
plan sits at the bottom and the generic stages never import a tower."""

from vlsens.core.versions import _module_file, _vlsens_imports

LAYERS = {
    "floor": "errors job faults device fsutil paths sizes images prompts inputs versions metrics onnxutil onnxgraph",
    "plan": "presets presets.tables family checkpoint loading processor config quant_target",
    "data": "presets.tokenizer presets.plant presets.build cases samples calibration",
    "towers": "towers towers.base towers.vision_fixed towers.vision_uint8 towers.vision_video towers.vision_dynamic "
              "towers.text towers.decoder vision genai",
    "stages": "stages parity variants fp16 bf16 parts embeddings simplify artifacts quant sensitivity sensitivity.switch "
              "sensitivity.suffix "
              "sensitivity.engine sensitivity.nbits nbits profile_nbits "
              "sensitivity.ranking sensitivity.stages sensitivity.baseline profile compare inc inc.settings inc.names "
              "inc.capture inc.stages inc.env records plan targets resources scripting",
    "application": "runtime weight_only deploy deploy.assemble deploy.evaluate deploy.build deploy.compare deploy.anchors "
                   "report report.tables report.figures report.build report.verdict cli",
}
LEVEL = {f"vlsens.{m}": i for i, names in enumerate(LAYERS.values()) for m in names.split()}
TOWERS = {m for m in LEVEL if m.startswith("vlsens.export.towers.")}


def test_every_module_is_in_a_layer_and_imports_only_below():
    from pathlib import Path

    src = Path(_module_file("vlsens")).parent
    modules = {"vlsens." + ".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
               for p in src.rglob("*.py")} - {"vlsens.__init__", "vlsens"}
    assert modules == set(LEVEL), modules ^ set(LEVEL)
    upward = [(m, i) for m in LEVEL for i in _vlsens_imports(_module_file(m)) if LEVEL.get(i, -1) > LEVEL[m]]
    assert upward == []


def test_generic_stages_import_no_tower():
    stages = [m for m, level in LEVEL.items() if level == LEVEL["vlsens.export.parity"]]
    for m in stages:
        assert not _vlsens_imports(_module_file(m)) & TOWERS, m


def test_the_package_has_no_import_cycle():
    """Imports inside functions count too: a cycle hidden in a function is still a cycle."""
    graph = {m: {i for i in _vlsens_imports(_module_file(m)) if i in LEVEL and i != m} for m in LEVEL}
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


def test_editing_preset_code_reruns_nothing_of_a_real_checkpoint(monkeypatch):
    """The rerun trigger hashes every vlsens module a job's script (and its tower) imports: an edit
    to a preset's architecture, tokenizer, planted outlier or writer must change no hash of a job
    that runs on a user's own checkpoint (only the preset-building rules import them)."""
    from pathlib import Path

    import vlsens.export.towers
    from vlsens.core.versions import script_code_version

    scripts = sorted(p for p in (Path(__file__).resolve().parents[1] / "workflow" / "scripts").glob("*.py")
                     if not p.name.startswith(("build_", "_")))
    assert len(scripts) >= 10, scripts
    towers = sorted({path.partition(":")[0] for path in vlsens.export.towers.BUILTIN.values()})
    assert len(towers) >= 6, towers
    jobs = [(s, t) for s in scripts for t in towers]
    before = {(s.name, t): script_code_version(s, t) for s, t in jobs}
    preset_modules = [m for m in LEVEL if m.startswith("vlsens.model.presets.")]
    assert {f"vlsens.model.presets.{m}" for m in ("tables", "plant", "build", "tokenizer")} <= set(preset_modules)
    monkeypatch.setenv("VLSENS_VERSION_OVERRIDES", ",".join(f"{m}=edited" for m in preset_modules))
    after = {(s.name, t): script_code_version(s, t) for s, t in jobs}
    assert after == before
    # and the hash does see such an edit where the code is used: the preset's own rule
    build = Path(__file__).resolve().parents[1] / "workflow" / "scripts" / "build_tiny_checkpoint.py"
    edited = script_code_version(build)
    monkeypatch.delenv("VLSENS_VERSION_OVERRIDES")
    assert script_code_version(build) != edited


#: What only a tower (or the family table) may know: graph names and kinds, the output name of a
#: language model, the families' model types.
TOWER_WORDS = ("vision", "text", "decoder", "embeds.onnx", "embedding.onnx", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
#: vlsens.model.loading's "vision" and "text" name the checkpoint's two parts (model.visual, the LM), not towers.
PARTS = {"vlsens.model.loading"}


def _code_strings(module: str) -> list[tuple[int, str]]:
    """String literals of a module's code (docstrings left out), with their line numbers."""
    import ast

    tree = ast.parse(open(_module_file(module), encoding="utf-8").read())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_generic_layers_name_no_tower_and_no_family():
    """Per-tower differences live behind Tower attributes and hooks (logits, block_label,
    planted_site, outside inputs, profile settings), per-family ones in vlsens.model.family's table: the
    floor, the plan's generic modules, the data layer and the generic stages never compare a graph
    name, a tower kind, an output name or a model type."""
    generic = [m for m, level in LEVEL.items()
               if level in (LEVEL["vlsens.core.errors"], LEVEL["vlsens.config"], LEVEL["vlsens.data.cases"], LEVEL["vlsens.export.parity"])
               and not m.startswith(("vlsens.model.presets", "vlsens.model.family", "vlsens.core.paths")) and m not in PARTS]
    found = [(m, line, s) for m in generic for line, s in _code_strings(m)
             if s in TOWER_WORDS or s.split("/")[0] in TOWER_WORDS and "/" in s]
    assert found == []
