"""The report's figures and tables, each rendered from a small fixed input (vlsens.report)."""

import json

import numpy as np
import pytest
import yaml

from vlsens.report import build, figures, tables

PRESET = {"preset": "tiny", "seed": 0, "outlier": {"block": 1, "channels": 2, "scale": 1000.0, "site": "attn"},
          "text_outlier": {"layer": 0, "channels": 2, "scale": 1000.0}}

VISION_CSV = """rank,op,op_type,block,role,weight_params,mse,cosine,sqnr_db
1,/visual/blocks.1/attn/qkv/Gemm,Gemm,1,attn.qkv,12288,0.07,0.98,16.7
2,/visual/patch_embed/proj/Conv,Conv,,patch_embed.proj,75264,0.00097,0.9998,35.2
3,/visual/merger/mlp/mlp.0/Gemm,Gemm,,merger.mlp.mlp.0,65536,0.00069,0.9999,36.7
4,/visual/blocks.0/mlp/down_proj/Gemm,Gemm,0,mlp.down_proj,8192,7.6e-05,0.99999,41.2
5,/visual/blocks.1/attn/MatMul_3,MatMul,1,attn.MatMul_3,0,5.0e-05,0.99999,43.0
6,/visual/blocks.1/attn/MatMul,MatMul,1,attn,0,4.0e-05,0.99999,44.0
7,/visual/blocks.0/attn/qkv/Gemm,Gemm,0,attn.qkv,12288,2.0e-05,0.999999,47.0
8,/visual/blocks.0/mlp/up_proj/Gemm,Gemm,0,mlp.up_proj,8192,1.0e-05,0.999999,50.0
"""

TEXT_CSV = """rank,op,op_type,block,role,weight_params,mse,cosine,sqnr_db,kl,top1
1,/language_model/layers.0/mlp/down_proj/MatMul,MatMul,0,mlp.down_proj,8192,0.0003,0.99,19.1,0.00015,0.72
2,/language_model/layers.0/self_attn/q_proj/MatMul,MatMul,0,self_attn.q_proj,4096,1e-05,0.9999,37.0,4e-06,0.99
3,/lm_head/MatMul,MatMul,,lm_head,32768,5e-06,0.9999,36.9,2.5e-06,0.99
"""


def png_pixels(path):
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float64)


def assert_drawn(path, min_std=20.0):
    """A real picture: a PNG of some size whose pixels vary (not a blank canvas)."""
    px = png_pixels(path)
    assert px.shape[0] > 150 and px.shape[1] > 300, px.shape
    assert px.std() > min_std, f"{path}: pixel std {px.std():.1f}"
    return px


@pytest.fixture
def run_files(tmp_path):
    (tmp_path / "ort.csv").write_text(VISION_CSV)
    (tmp_path / "text.csv").write_text(TEXT_CSV)
    (tmp_path / "preset.json").write_text(json.dumps(PRESET))
    profile = {"target": {"metric": "cosine", "value": 0.999, "direction": ">="}, "status": "met",
               "ops": {"/visual/blocks.1/attn/qkv/Gemm": {"precision": "fp32"},
                       "/visual/patch_embed/proj/Conv": {"precision": "int8"}}}
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    return tmp_path


def test_role_columns_group_the_attention_matmuls():
    assert figures.role_column("attn.qk") == figures.role_column("self_attn.qk") == "attn Q·Kᵀ"
    assert figures.role_column("attn.av") == "attn A·V"
    assert figures.role_column("attn.MatMul_3") == figures.role_column("attn") == "attn MatMul"
    assert figures.role_column("self_attn.MatMul_1") == "attn MatMul"
    assert figures.role_column("self_attn.q_proj") == "q_proj" and figures.role_column("attn.qkv") == "qkv"
    assert figures.role_column("merger.mlp.mlp.2") == "merger.2"
    assert figures.role_column("patch_embed.proj") == "patch_embed"


def _facts(graph, preset):
    """The graph's planted site and block label, from its tower (as the report rules do)."""
    from conftest import default_config

    return build.tower_facts(default_config(), graph, preset)


def test_towers_say_where_a_preset_planted_and_what_their_blocks_are_called(run_files, tmp_path):
    preset = run_files / "preset.json"
    assert _facts("vision/224x224", preset) == ((1, "attn.qkv"), "block")
    assert _facts("vision/dynamic", preset) == ((1, "attn.qkv"), "block")
    assert _facts("decoder", preset)[1] == _facts("text", preset)[1] == "layer"
    assert _facts("vision/224x224", None) == (None, "block")  # a real checkpoint: no preset
    proj = tmp_path / "proj.json"
    proj.write_text(json.dumps({"outlier": {"block": 2, "site": "proj"}}))
    assert _facts("vision/224x224", proj)[0] == (2, "attn.proj")  # the op that reads attn's output


def test_heatmap_puts_the_planted_op_in_the_brightest_cell(run_files, tmp_path):
    out = tmp_path / "heat.png"
    grid = build.heatmap(run_files / "ort.csv", run_files / "profile.yaml",
                         *_facts("vision/224x224", run_files / "preset.json"), "vision/224x224", "fp32", out)
    assert_drawn(out)
    v = grid["values"]
    r, c = np.unravel_index(np.nanargmax(v), v.shape)
    assert (grid["rows"][r], grid["columns"][c]) == (1, "qkv")
    assert grid["planted_cells"] == 1 and grid["kept_cells"] == 1
    assert grid["rows"][-1] == figures.OUTSIDE and "attn MatMul" in grid["columns"]
    # both attention MatMuls of block 1 share one cell, which shows the larger error
    assert v[grid["rows"].index(1), grid["columns"].index("attn MatMul")] == pytest.approx(np.log10(5e-5))


def test_heatmap_of_a_text_graph_uses_kl_and_its_planted_layer(run_files, tmp_path):
    grid = build.heatmap(run_files / "text.csv", None, *_facts("decoder", run_files / "preset.json"), "decoder", "fp32",
                         tmp_path / "t.png")
    assert_drawn(tmp_path / "t.png")
    assert grid["planted_cells"] == 1 and grid["kept_cells"] == 0
    assert np.nanmax(grid["values"]) == pytest.approx(np.log10(0.00015))  # kl, not mse


def test_no_planted_marks_without_a_preset(run_files, tmp_path):
    grid = build.heatmap(run_files / "ort.csv", None, None, "block", "vision/224x224", "fp32", tmp_path / "h.png")
    assert grid["planted_cells"] == 0


def test_ranked_chart_shows_the_top_ops_in_rank_order(run_files, tmp_path):
    out = tmp_path / "ranked.png"
    shown = build.ranked(run_files / "ort.csv", run_files / "profile.yaml",
                         _facts("vision/224x224", run_files / "preset.json")[0], "vision/224x224", "fp32", "ort", 5, out)
    assert shown[0] == "/visual/blocks.1/attn/qkv/Gemm" and len(shown) == 5
    px = assert_drawn(out)
    # the kept (orange) bar is drawn: some pixels carry the kept colour
    kept = np.array([int(figures.KEPT_COLOUR[i:i + 2], 16) for i in (1, 3, 5)], dtype=float)
    assert (np.abs(px - kept).sum(-1) < 30).sum() > 100
    assert figures._short("/visual/blocks.1/attn/MatMul_3") == "blocks.1/attn/MatMul_3"
    assert figures._short("/visual/blocks.1/attn/qkv/Gemm") == "blocks.1/attn/qkv"


def eval_record(metric="cosine", value=0.999, direction=">="):
    trace = [
        {"step": "all", "int8_ops": 8, "cosine": 0.98, "kl": 2e-4, "meets": False, "int8_weight_share": 1.0},
        {"step": "prefix 4", "int8_ops": 4, "cosine": 0.99999, "kl": 1e-7, "meets": True, "int8_weight_share": 0.2},
        {"step": "prefix 6", "int8_ops": 6, "cosine": 0.9999, "kl": 3e-6, "meets": True, "int8_weight_share": 0.45},
        {"step": "prefix 7", "int8_ops": 7, "cosine": 0.9995, "kl": 9e-6, "meets": True, "int8_weight_share": 0.6},
    ]
    for t in trace:
        t["meets"] = t[metric] >= value if direction == ">=" else t[metric] <= value
    return {"target": {"metric": metric, "value": value, "direction": direction}, "status": "met",
            "quantizable_ops": 8, "int8_ops": 7, "int8_op_share": 7 / 8, "int8_weight_share": 0.6,
            "measured": {"cosine": 0.99948, "kl": 9.1e-6}, "search": {"evaluations": len(trace), "trace": trace},
            "latency_ms": {"fp32": 4.9, "fp16": 5.5, "int8_mixed": 5.4}, "model_bytes": 640000,
            "builds": [{"int8_ops": 7, "int8_weight_share": 0.6, "cosine": 0.99948, "kl": 9.1e-6, "meets": True,
                        "latency_ms": 5.4, "reason": "the search's choice"},
                       {"int8_ops": 5, "int8_weight_share": 0.4, "cosine": 0.99990, "kl": 2e-6, "meets": True,
                        "latency_ms": 4.6, "reason": "latency candidate"}],
            "speedup": {"vs_fp32": 4.9 / 5.4}, "quant_target": {"name": "ort-cpu", "measured_on": ["CPUExecutionProvider"]}}


@pytest.mark.parametrize("metric,value,direction", [("cosine", 0.999, ">="), ("kl", 1e-4, "<=")])
def test_pareto_marks_the_chosen_and_the_built_point(tmp_path, metric, value, direction):
    out = tmp_path / "pareto.png"
    rec = eval_record(metric, value, direction)
    res = figures.pareto(rec, out, "t")
    assert_drawn(out)
    assert res["chosen"]["ops"] == pytest.approx(7 / 8) and res["chosen"]["weights"] == pytest.approx(0.6)
    assert res["built"]["ops"] == pytest.approx(7 / 8)
    # the built model meets the target: on the better side of the line (1 - cosine and KL: lower)
    assert res["built"]["y"] <= res["target"]
    assert [p["meets"] for p in res["points"]] == [False, True, True, True]


def test_pareto_draws_a_panel_per_axis_it_has_data_for(tmp_path):
    rec = eval_record()
    figures.pareto(rec, tmp_path / "p3.png", "t")
    three = png_pixels(tmp_path / "p3.png").shape[1]
    for t in rec["search"]["trace"]:
        del t["int8_weight_share"]
    res = figures.pareto(rec, tmp_path / "p2.png", "t")
    assert [b["latency"] for b in res["builds"]] == [5.4, 4.6] and res["built"]["latency"] == 5.4
    two = png_pixels(tmp_path / "p2.png").shape[1]
    del rec["latency_ms"], rec["builds"]
    figures.pareto(rec, tmp_path / "p1.png", "t")
    one = png_pixels(tmp_path / "p1.png").shape[1]
    assert one < 700 < two < three  # shares of ops / of weights / latency


def test_engine_agreement_scatter(run_files, tmp_path):
    inc = VISION_CSV.replace("0.07,", "0.5,")  # any second ranking of the same ops
    (tmp_path / "inc.csv").write_text(inc)
    compare = {"spearman": -0.83, "top_k": {"1": {"k": 1, "overlap": 1.0, "ort": ["/visual/blocks.1/attn/qkv/Gemm"]},
                                           "5": {"k": 5, "overlap": 0.6, "ort": ["/visual/blocks.1/attn/qkv/Gemm"]}}}
    (tmp_path / "compare.json").write_text(json.dumps(compare))
    n = build.engines(run_files / "ort.csv", tmp_path / "inc.csv", tmp_path / "compare.json", "vision/224x224",
                      "fp32", tmp_path / "engines.png")
    assert n == 8
    assert_drawn(tmp_path / "engines.png")


def test_fp16_fallback_with_and_without_fallback_nodes(tmp_path):
    graphs = {"model.onnx": {"fp32_fallback": [
        {"node": "Where", "kind": "activation", "tensor": "mask", "observed": 1e30, "bound": 512.0, "reason": "r"},
        {"node": "/visual/blocks.2/attn/qkv/Gemm", "kind": "activation", "tensor": "t", "observed": 2272.0,
         "bound": 512.0, "reason": "activation 't' reaches 2272 > 512"},
        {"node": "/visual/blocks.2/norm1/Mul_1", "kind": "activation", "tensor": "t", "observed": 2272.0,
         "bound": 512.0, "reason": "r"}], "fp32_islands": {"nodes": 110}, "observed_max_activation": 2272.0,
        "max_activation": 512.0}}
    record = {"extra": {"graphs": graphs}}
    (tmp_path / "parity.json").write_text(json.dumps(record))
    graphs["model.onnx"]["fp32_fallback"] += [
        {"node": "/Where_2", "kind": "activation", "tensor": "m", "observed": 65504.0, "bound": 512.0, "reason": "r"},
        {"node": "/layers.0/self_attn/Softmax", "kind": "activation", "tensor": "s", "observed": 65504.13,
         "bound": 512.0, "reason": "r"},
        {"node": "/visual/blocks.31/mlp/down_proj/Gemm", "kind": "activation", "tensor": "d", "observed": 1.2e5,
         "bound": 512.0, "reason": "r"}]
    (tmp_path / "parity.json").write_text(json.dumps(record))
    shown = build.fp16(tmp_path / "parity.json", "vision/224x224", tmp_path / "a.png")
    # findings first, a real overflow beyond FP16's range included; masks (FP16's own limit) and
    # sentinel constants after them
    assert shown == ["/visual/blocks.31/mlp/down_proj/Gemm", "/visual/blocks.2/attn/qkv/Gemm",
                     "/visual/blocks.2/norm1/Mul_1", "Where", "/layers.0/self_attn/Softmax", "/Where_2"]
    assert [figures.mask_valued(x) for x in (65504.0, 65504.13, 1e30, 1.2e5, 2272.0)] == [True, True, True, False,
                                                                                          False]
    assert_drawn(tmp_path / "a.png")
    graphs["model.onnx"]["fp32_fallback"] = []
    graphs["model.onnx"]["observed_max_activation"] = 80.0
    assert figures.fp16_fallback(graphs, tmp_path / "b.png", "x") == []
    assert_drawn(tmp_path / "b.png")


def test_latency_and_size(tmp_path):
    prof = tmp_path / "eval.json"
    prof.write_text(json.dumps(eval_record()))
    recs = {}
    for v, size in (("fp32", 1_000_000), ("fp16", 500_000)):
        p = tmp_path / f"{v}.json"
        p.write_text(json.dumps({"files": {"model.onnx": {"bytes": 1000}, "model.onnx.data": {"bytes": size},
                                           "other.onnx": {"bytes": 7}, "rule": "export"}}))
        recs[v] = str(p)
    deploy = tmp_path / "deploy" / "fp32"
    deploy.mkdir(parents=True)
    (deploy / "parity.json").write_text(json.dumps({"files": {"decoder.onnx": {"bytes": 3_000_000}}}))
    (deploy / "eval.json").write_text(json.dumps({"tokens_per_second": 42.0}))
    n = build.latency({"vision/224x224/fp32": str(prof)}, {"vision/224x224": recs}, {"vision/224x224": "model.onnx"},
                      {"fp32": str(deploy)}, "tiny", tmp_path / "lat.png")
    assert n == 3 + 3 + 1 + 1  # latency x3, size x3, deploy size, deploy speed
    assert_drawn(tmp_path / "lat.png")
    assert build.files_bytes(json.loads(open(recs["fp16"]).read()), {"model.onnx"}) == 501_000


def test_tables_list_every_record_and_mark_failures(tmp_path):
    root = tmp_path / "results" / "m"
    ok = {"variant": "fp16", "passed": True, "tolerance": {"min_cosine": 0.999, "max_rel_error": 0.02},
          "metrics": {"max_rel_error": 6.3e-4, "min_cosine": 0.99999986}}
    bad = dict(ok, passed=False, variant="fp32")
    deploy = {"graph": "vision.onnx", "passed": True, "tolerance": {"min_cosine": 0.999},
              "images": [{"max_rel_error": 0.04, "cosine": 0.9996}, {"max_rel_error": 0.03, "cosine": 0.9997}]}
    paths = []
    for name, rec in (("vision/224x224/fp16", ok), ("text/fp32", bad), ("deploy/int8-mixed", deploy)):
        d = root / name
        d.mkdir(parents=True)
        (d / "parity.json").write_text(json.dumps(rec))
        paths.append(str(d / "parity.json"))
    assert build.parity_table(paths, root, tmp_path / "parity.html") == 3
    html = (tmp_path / "parity.html").read_text()
    assert html.count("<tr") == 4 and html.count('class="fail"') == 1
    assert "vision/224x224/fp16" in html and "deploy int8-mixed (vision.onnx)" in html and "0.04" in html
    assert "min_cosine ≥ 0.999" in html and "0.99999986" in html  # not rounded to 1
    prof = tmp_path / "eval.json"
    prof.write_text(json.dumps(eval_record()))
    assert build.profile_table({"vision/224x224/fp32": str(prof)}, tmp_path / "profiles.html") == 1
    html = (tmp_path / "profiles.html").read_text()
    assert "7 / 8 (88%)" in html and "cosine ≥ 0.999" in html and "60%" in html


def test_tables_escape_html():
    html = tables.render("t", ["artifact"], [{"artifact": "<script>alert(1)</script>"}])
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_search_trace_records_each_steps_int8_weight_share():
    from vlsens.precision.int8 import search

    weights = {"a": 10, "b": 30, "c": 60}  # least sensitive first: a, b, c
    err = {"a": 0.0001, "b": 0.0002, "c": 0.01}
    chosen, trace = search(["a", "b", "c"], lambda ops: {"mse": sum(err[o] for o in ops)}, "mse", 0.001,
                           weights=weights)
    assert chosen == ["a", "b"]
    assert [(t["step"], t["int8_weight_share"]) for t in trace][:2] == [("all", 1.0), ("prefix 1", 0.1)]
    assert any(t["int8_ops"] == 2 and t["int8_weight_share"] == pytest.approx(0.4) for t in trace)
    _, trace = search(["a", "b", "c"], lambda ops: {"mse": 0.0}, "mse", 0.001)
    assert "int8_weight_share" not in trace[0]


def test_verdict_says_what_failed_and_what_passed(tmp_path):
    """The landing page from records: a deploy folder whose tokens differ and an unreachable
    profile are called so, in bold, not averaged away."""
    import json

    import yaml

    from vlsens.report import verdict

    rec = {"artifact": "results/m/vision/224x224/fp32", "variant": "fp32", "passed": True,
           "metrics": {"min_cosine": 0.9999991}, "tolerance": {"min_cosine": 0.99999}}
    (tmp_path / "parity.json").write_text(json.dumps(rec))
    prof = tmp_path / "profile"
    prof.mkdir()
    (prof / "eval.json").write_text(json.dumps({
        "target": {"metric": "cosine", "direction": ">=", "value": 0.999}, "status": "unreachable",
        "measured": {"cosine": 0.99}, "int8_ops": 0, "quantizable_ops": 40, "int8_weight_share": 0.0,
        "speedup": {"vs_fp32": 1.0}}))
    (prof / "profile.yaml").write_text(yaml.safe_dump({"ops": {"/visual/blocks.0/attn/qkv/Gemm": {"precision": "fp32"}}}))
    fp32 = tmp_path / "fp32"
    fp32.mkdir()
    (fp32 / "eval.json").write_text(json.dumps({"identical": False, "tokens_per_second": 5.0,
                                                "cases": [{"identical": True}, {"identical": False}]}))
    desc = tmp_path / "workflow.rst"
    desc.write_text("About.")
    text = verdict.build([str(tmp_path / "parity.json")], {"vision/224x224/fp32": str(prof / "eval.json")},
                         {"fp32": str(fp32)}, desc, "m", tmp_path / "verdict.rst")
    assert text.startswith("Verdict: m\n==========\n")
    assert "**Parity: 1 of 1 artifacts passed their gates**" in text and "0.999999" in text
    assert "**unreachable** (cosine 0.99)" in text and "``blocks.0/attn/qkv/Gemm``" in text
    assert "**differs**: tokens identical to transformers' generate in 1 of 2 cases" in text
    assert text.rstrip().endswith("About.")
    import docutils.core

    html = docutils.core.publish_parts(text, writer="html", settings_overrides={"report_level": 2})["html_body"]
    assert html.count("<table") == 2 and "System Message" not in html


def _folder(root, name, nbytes, kl=None, passed=True, gated=True, provider=None, target=None):
    """A deploy folder as far as the recommendation reads it."""
    import json

    f = root / name
    f.mkdir()
    (f / "decoder.onnx.data").write_bytes(b"\0" * nbytes)
    opts = [{provider: {}}] if provider else []
    (f / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"session_options": {
        "provider_options": opts}}, "vision": {"session_options": {"provider_options": opts}}}}))
    (f / "parity.json").write_text(json.dumps({"passed": True} if passed else ({"gated": False} if not gated else
                                                                               {"passed": False})))
    cases = [{"case": c, "mean_kl": kl} for c in ("text", "one-image", "two-images")]
    ev = {"cases": cases, "tokens_per_second": 100.0} if kl is None else \
        {"cases": cases, "mean_kl": kl, "top1_agreement": 0.9, "tokens_per_second": 100.0, "target": target}
    (f / "eval.json").write_text(json.dumps(ev))
    return f


def test_the_recommendation_judges_every_folder_one_way(tmp_path):
    """The fewest bytes among the folders within the KL budget whose vision gate passed (or whose
    graph is measured, not gated); a folder's measure wins over its own 3-case check; a CUDA folder
    is picked for CUDA only; a missed target of a folder's own profile is listed."""
    import json

    from vlsens.core.records import errors
    from vlsens.report.recommend import markdown, recommend
    from vlsens.report.verdict import build

    folders = {"fp32": _folder(tmp_path, "fp32", 4000),
               "small-but-bad": _folder(tmp_path, "small-but-bad", 1000, kl=5e-4),
               "small-failed": _folder(tmp_path, "small-failed", 1100, kl=1e-6, passed=False, gated=True),
               "int4-mixed": _folder(tmp_path, "int4-mixed", 1500, kl=2e-5,
                                     target={"metric": "kl", "target": 1e-5, "measured": 2e-5, "met": False}),
               "plan-p1": _folder(tmp_path, "plan-p1", 1200, kl=9e-4, passed=False, gated=False),
               "gpu": _folder(tmp_path, "gpu", 2000, kl=1e-6, provider="cuda")}
    measure = tmp_path / "plan-p1.json"  # its 24-case measure says it is within the budget
    mods = {m: {"mean_kl": 5e-5, "min": 1e-5, "max": 9e-5, "cases": 8, "top1": 0.9} for m in ("text", "image", "images")}
    measure.write_text(json.dumps({"mean_kl": 5e-5, "top1": 0.9, "cases": [{}] * 24, "modalities": mods}))
    rec = recommend({k: str(v) for k, v in folders.items()}, {"plan-p1": str(measure)}, 1e-4)
    assert rec["devices"]["cpu"]["folder"] == "plan-p1"  # small-but-bad: above; small-failed: its gate
    assert rec["devices"]["cuda"]["folder"] == "gpu"
    assert rec["devices"]["npu"]["folder"] is None
    facts = {f["folder"]: f for f in rec["folders"]}
    assert facts["plan-p1"]["source"] == "measure" and facts["plan-p1"]["cases"] == 24
    assert facts["fp32"]["kl"] == 0 and facts["fp32"]["source"] == "reference"
    assert facts["small-failed"]["gate"] == "failed" and facts["plan-p1"]["gate"] == "measured"
    assert len(rec["missed"]) == 1 and rec["missed"][0].startswith("int4-mixed: its profile's target kl 1e-05")
    (tmp_path / "recommend.json").write_text(json.dumps(rec))
    assert errors(tmp_path / "recommend.json") == []
    text = markdown(rec)
    assert f"CPU: ship {folders['plan-p1']}" in text and "1 target(s) missed" in text
    # nothing within the budget for a device but the reference: the reference is shipped, honestly
    only = recommend({"fp32": str(folders["fp32"]), "small-but-bad": str(folders["small-but-bad"])}, {}, 1e-4)
    assert only["devices"]["cpu"]["folder"] == "fp32"
    # the verdict leads with it, and every folder is held to the same budget
    desc = tmp_path / "workflow.rst"
    desc.write_text("About.")
    page = build([], {}, {k: str(v) for k, v in folders.items() if k != "fp32"}, desc, "m", tmp_path / "v.rst",
                 tmp_path / "recommend.json")
    assert page.index("Which folder to ship") < page.index("Deploy folders")
    assert page.count("— within the budget 0.0001") == 4 and page.count("— **above** the budget 0.0001") == 1
    assert "task accuracy" not in page  # no answers scored: KL alone
    # with the task's answers scored, the verdict judges by accuracy first and each folder's row opens on it
    from vlsens.deploy.accuracy import table
    from vlsens.deploy.genai.answers import summarize
    from vlsens.report.recommend import add_accuracy

    mods = ["text", "image", "images"] * 20
    questions = [{"modality": m, "kind": "k", "answer": "red"} for m in mods]
    right = {n: [True] * 60 for n in folders} | {"small-but-bad": [i % 3 != 1 for i in range(60)]}
    add_accuracy(rec["folders"], table({n: summarize(n, questions, ["red" if c else "blue" for c in r], "q.jsonl")
                                        for n, r in right.items()}))
    (tmp_path / "recommend.json").write_text(json.dumps(rec))
    page = build([], {}, {k: str(v) for k, v in folders.items() if k != "fp32"}, desc, "m", tmp_path / "v.rst",
                 tmp_path / "recommend.json")
    assert "Every folder is judged one way: its accuracy on the task" in page
    rows = page[page.index("Deploy folders"):]
    assert "- task accuracy [95 %], paired drop" in rows
    assert "- 66.7 % [" in rows and "-33.3 pt vs fp32 (resolved below)" in rows  # small-but-bad's one-image losses


def test_the_recommend_job_groups_its_sources_and_writes_both_files(tmp_path):
    """The rule's sources by kind: an NPU graph's parts and profile are joined by name, the plan's
    measured front is read for its requests; recommend.json and recommend.md are written."""
    import json

    from vlsens.report.recommend import recommend_job

    fp32 = _folder(tmp_path, "fp32", 4000)
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "parts.json").write_text(json.dumps({"parts": [{}, {}], "passed": True}))
    prof = tmp_path / "eval.json"
    prof.write_text(json.dumps({"int8_ops": 3, "quantizable_ops": 4, "status": "unreachable",
                                "measured": {"cosine": 0.99}, "target": {"metric": "cosine", "value": 0.999}}))
    front = tmp_path / "measured.json"
    front.write_text(json.dumps({"requested": {"small": {"met": False, "plan": None}}}))
    rec = recommend_job({"folder": {"fp32": str(fp32)}, "parts": {"vision/224x224/fp32": str(parts)},
                         "profile": {"vision/224x224/fp32": str(prof)}, "measured": {"front": str(front)}},
                        1e-4, tmp_path / "recommend.json", tmp_path / "recommend.md")
    assert rec["npu"][0]["parts"] == 2 and rec["npu"][0]["profile"]["status"] == "unreachable"
    assert rec["devices"]["npu"]["paths"] == [str(parts)] and rec["devices"]["cpu"]["folder"] == "fp32"
    assert len(rec["missed"]) == 2 and rec["missed"][1].startswith("plan.budgets 'small': not met")
    assert json.loads((tmp_path / "recommend.json").read_text()) == rec
    assert "**NPU:** " + str(parts) in (tmp_path / "recommend.md").read_text()


def test_a_missed_target_is_written_with_the_digits_that_tell_it_apart():
    """A folder 0.2 % over its KL target (1.002e-4 against 1e-4) reads as a miss, not as
    "0.0001 against 0.0001"."""
    from vlsens.report.recommend import apart, missed

    assert apart(1.002e-4, 1e-4) == ("0.0001002", "0.0001") and apart(0.5, 0.25) == ("0.5", "0.25")
    facts = [{"folder": "int4-mixed", "path": "deploy/int4-mixed",
              "target": {"met": False, "metric": "kl", "target": 1e-4, "measured": 1.002e-4}}]
    (line,) = missed(facts, [], None)
    assert "target kl 0.0001 is not met end to end (measured 0.0001002" in line
