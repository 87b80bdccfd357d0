"""The package's layers (README, Layout): no module imports from a layer above its own, so the
plan sits at the bottom and the generic stages never import a tower."""

from vlsens.versions import _module_file, _vlsens_imports

LAYERS = {
    "floor": "errors job faults device fsutil paths sizes images prompts inputs versions metrics onnxutil",
    "plan": "checkpoint family config quant_target",
    "data": "cases samples calibration",
    "towers": "towers towers.base towers.vision_fixed towers.vision_uint8 towers.vision_video towers.vision_dynamic towers.text towers.decoder vision genai",
    "stages": "stages parity variants fp16 simplify artifacts quant sensitivity sensitivity.switch sensitivity.suffix sensitivity.engine "
              "sensitivity.ranking sensitivity.stages sensitivity.baseline profile compare inc inc.settings inc.names "
              "inc.capture inc.stages inc.env records targets resources scripting",
    "application": "runtime deploy report report.tables report.figures report.build",
}
LEVEL = {f"vlsens.{m}": i for i, names in enumerate(LAYERS.values()) for m in names.split()}
TOWERS = {m for m in LEVEL if m.startswith("vlsens.towers.")}


def test_every_module_is_in_a_layer_and_imports_only_below():
    from pathlib import Path

    src = Path(_module_file("vlsens")).parent
    modules = {"vlsens." + ".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
               for p in src.rglob("*.py")} - {"vlsens.__init__", "vlsens"}
    assert modules == set(LEVEL), modules ^ set(LEVEL)
    upward = [(m, i) for m in LEVEL for i in _vlsens_imports(_module_file(m)) if LEVEL.get(i, -1) > LEVEL[m]]
    assert upward == []


def test_generic_stages_import_no_tower():
    stages = [m for m, level in LEVEL.items() if level == LEVEL["vlsens.parity"]]
    for m in stages:
        assert not _vlsens_imports(_module_file(m)) & TOWERS, m
