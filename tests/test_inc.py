"""Engine inc (Intel Neural Compressor mse_v2): name mapping, the pinned private API, a clear
error when its environment is missing, the planted op found, INC's own fallback run, and the
comparison with engine ort."""

import json
import subprocess
import sys

import pytest
from conftest import PLANT, REPO

from vlsens.quantize.qdq import QuantSettings
from vlsens.sensitivity.compare import average_ranks, compare, spearman, top_k
from vlsens.sensitivity.inc.names import Node, map_names
from vlsens.sensitivity.inc.settings import IncEnvironmentError, check_private_api, check_settings
from vlsens.sensitivity.ranking import read_csv

SCRIPT = REPO / "workflow" / "scripts" / "sensitivity_inc.py"
SETTINGS = json.dumps(QuantSettings().as_dict())


# --- name mapping (pure) ------------------------------------------------------------------------

EXPORTED = [
    Node("/visual/patch_embed/proj/Conv", "Conv", ("x", "patch.w"), ("conv_out",)),
    Node("/visual/blocks.0/attn/qkv/Gemm", "Gemm", ("h0", "qkv.w", "qkv.b"), ("qkv_out",)),
    Node("/visual/blocks.0/attn/MatMul", "MatMul", ("q", "k"), ("scores",)),
    Node("/visual/blocks.0/mlp/up_proj/Gemm", "Gemm", ("h1", "shared.w", "b"), ("up_out",)),
    Node("/visual/blocks.0/mlp/gate_proj/Gemm", "Gemm", ("h1", "shared.w", "b"), ("gate_out",)),
    Node("/visual/blocks.0/attn/MatMul_1", "MatMul", ("p", "v"), ("ctx",)),
]
INITS = {"patch.w", "qkv.w", "qkv.b", "shared.w", "b"}


def test_map_names_by_name_weight_output_and_prefix():
    inc_nodes = [
        Node("/visual/patch_embed/proj/Conv", "Conv", ("x", "patch.w"), ("conv_out",)),
        # INC's Gemm -> MatMul + Add split keeps the weight and renames node and output
        Node("/visual/blocks.0/attn/qkv/Gemm_MatMul", "MatMul", ("h0", "qkv.w"), ("qkv_out_MatMul",)),
        # a fused/renamed activation MatMul: no weight, output kept
        Node("MatMul_token_7", "MatMul", ("q", "k"), ("scores",)),
        # renamed, output renamed too: only the name prefix is left
        Node("/visual/blocks.0/attn/MatMul_1_quant", "MatMul", ("p2", "v2"), ("ctx2",)),
    ]
    mapping, unmapped = map_names([n.name for n in inc_nodes], inc_nodes, EXPORTED, INITS)
    assert mapping == {
        "/visual/patch_embed/proj/Conv": ("/visual/patch_embed/proj/Conv", "name"),
        "/visual/blocks.0/attn/qkv/Gemm_MatMul": ("/visual/blocks.0/attn/qkv/Gemm", "weight"),
        "MatMul_token_7": ("/visual/blocks.0/attn/MatMul", "output"),
        "/visual/blocks.0/attn/MatMul_1_quant": ("/visual/blocks.0/attn/MatMul_1", "prefix"),
    }
    assert unmapped == {}


def test_map_names_lists_what_it_cannot_map():
    inc_nodes = [
        # both Gemms share "shared.w" (the legacy exporter dedups identical tensors): ambiguous
        Node("/visual/blocks.0/mlp/up_proj/Gemm_MatMul", "MatMul", ("h1", "shared.w"), ("u",)),
        Node("Conv_token_1", "Conv", ("x", "other.w"), ("zzz",)),
        Node("/visual/patch_embed/proj/Conv", "Conv", ("x", "patch.w"), ("conv_out",)),
        Node("dup_of_conv", "Conv", ("x", "patch.w"), ("conv_out2",)),
    ]
    names = [n.name for n in inc_nodes] + ["ghost"]
    mapping, unmapped = map_names(names, inc_nodes, EXPORTED, INITS)
    assert mapping == {"/visual/patch_embed/proj/Conv": ("/visual/patch_embed/proj/Conv", "name")}
    assert set(unmapped) == {"/visual/blocks.0/mlp/up_proj/Gemm_MatMul", "Conv_token_1", "dup_of_conv", "ghost"}
    assert "shared by" in unmapped["/visual/blocks.0/mlp/up_proj/Gemm_MatMul"]
    assert "already mapped" in unmapped["dup_of_conv"]
    assert "not in INC's graph" in unmapped["ghost"]


# --- the pinned private API and settings --------------------------------------------------------

def test_private_api_check_fails_loudly_when_inc_changes():
    class Adaptor:  # what an upgrade that drops or changes the private methods looks like
        def _get_mse_order(self, fp32_model, tune_cfg, replace_cfgs, ops_lst, dataloader, output_op_names,
                           confidence_batches):
            pass

        def _calculate_mse(self, fp32_output, q_output):
            pass

        def _inference_model_on_batches(self, model, tune_cfg, dataloader, output_op_name, iterations):
            pass

        def calculate_op_sensitivity(self, model, dataloader, tune_cfg, output_op_names, confidence_batches,
                                     fallback=True, requantize_cfgs=None):
            pass

    check_private_api(Adaptor)  # the 3.7.1 shape passes
    del Adaptor._get_mse_order
    with pytest.raises(IncEnvironmentError, match="_get_mse_order is gone"):
        check_private_api(Adaptor)

    class Changed(Adaptor):
        def _get_mse_order(self, model, cfg, ops):
            pass

    with pytest.raises(IncEnvironmentError, match="has parameters"):
        check_private_api(Changed)


def test_settings_inc_cannot_honour_are_named():
    assert check_settings(QuantSettings()) == []
    problems = check_settings(QuantSettings(activation_type="int16", weight_type="uint8"))
    assert any("sensitivity.activation_type" in p and "uint8" in p for p in problems)
    assert any("sensitivity.weight_type" in p for p in problems)


def test_inc_environment_is_the_pinned_one(inc_python):
    """The interpreter `make inc-env` builds passes the same check the rule runs first."""
    code = "from vlsens.sensitivity.inc.settings import check_environment; import json; print(json.dumps(check_environment()))"
    r = subprocess.run([str(inc_python), "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(REPO / "src")})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["neural-compressor"] == "3.7.1" and got["onnx"].startswith("1.18")


# --- a missing environment ----------------------------------------------------------------------

def test_script_without_inc_says_how_to_get_it(planted, tmp_path):
    """Run with the main interpreter (no neural-compressor): one clear line, no outputs."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", str(planted / "fp32" / "model.onnx"),
                        "--calib", str(planted / "calib" / "calib.npz"), "--eval", str(planted / "calib" / "eval.npz"),
                        "--csv", str(tmp_path / "inc.csv"), "--summary", str(tmp_path / "inc.json"),
                        "--log", str(tmp_path / "log"), "--settings", SETTINGS], capture_output=True, text=True)
    assert r.returncode == 1
    assert "neural-compressor is not installed" in r.stderr and "make inc-env" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "inc.csv").exists() and not (tmp_path / "inc.json").exists()


def _dag(tmp_path, inc_cfg, vision=None):
    import yaml

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["sensitivity"]["engines"] = ["ort", "inc"]
    cfg["sensitivity"]["inc"] = inc_cfg
    cfg["vision"].update(vision or {})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--snakefile", str(REPO / "Snakefile"),
                           "-d", str(tmp_path), "--configfile", str(tmp_path / "config.yaml")],
                          capture_output=True, text=True, timeout=300)


def test_missing_inc_environment_fails_at_dag_build(tmp_path):
    r = _dag(tmp_path, {"python": str(tmp_path / "no-such-venv" / "bin" / "python")})
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "sensitivity.inc.python" in out and "does not exist" in out and "make inc-env" in out, out[-3000:]


def test_interpreter_without_inc_fails_at_dag_build(tmp_path):
    r = _dag(tmp_path, {"python": sys.executable})
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "has no neural-compressor" in out and "3.7.1" in out, out[-3000:]


def test_inc_on_fp16_only_is_refused_at_dag_build(tmp_path, inc_python):
    r = _dag(tmp_path, {"python": str(inc_python)}, {"sensitivity_variants": ["fp16"]})
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "fp32 variant only" in out, out[-3000:]


def test_dag_with_both_engines_plans_inc_and_compare(tmp_path, inc_python):
    r = _dag(tmp_path, {"python": str(inc_python), "tune": True})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for rule in ("sensitivity_inc", "sensitivity_compare", "sensitivity_inc_tune"):
        assert f"rule {rule}:" in out
    assert "inc.csv" in out and "compare.json" in out
    assert "fp16/inc.csv" not in out  # inc analyses fp32 graphs only


# --- the real thing on the planted model --------------------------------------------------------

@pytest.fixture(scope="module")
def inc_run(planted, inc_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("inc")
    r = subprocess.run([str(inc_python), str(SCRIPT), "--model", str(planted / "fp32" / "model.onnx"),
                        "--calib", str(planted / "calib" / "calib.npz"), "--eval", str(planted / "calib" / "eval.npz"),
                        "--csv", str(out / "inc.csv"), "--summary", str(out / "inc.json"), "--log", str(out / "log"),
                        "--settings", SETTINGS], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:] + (out / "log").read_text()[-3000:]
    return out


def test_inc_ranks_the_planted_op_first(inc_run):
    rows = read_csv(inc_run / "inc.csv")
    assert list(rows[0]) == ["rank", "op", "op_type", "block", "role", "weight_params", "mse", "cosine", "sqnr_db"]
    assert (rows[0]["block"], rows[0]["role"]) == (PLANT["block"], "attn.qkv"), rows[:3]
    assert rows[0]["mse"] < 0.2 * rows[1]["mse"]  # restoring it removes most of the error; nothing else does
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(a["mse"] <= b["mse"] for a, b in zip(rows, rows[1:]))  # lowest error with op in float first
    # progress lines in the job's log while INC scores the ops, ending with all of them
    import re

    done = re.findall(r"sensitivity \(inc\): (\d+)/(\d+) ops \(100 %\)", (inc_run / "log").read_text())
    assert done and done[-1][0] == done[-1][1] == str(len(rows)), done


def test_inc_ops_map_back_to_the_exported_graph(inc_run, planted):
    import onnx

    from vlsens.quantize.qdq import quantizable_ops

    summary = json.loads((inc_run / "inc.json").read_text())
    exported = {o.name for o in quantizable_ops(onnx.load(str(planted / "fp32" / "model.onnx")))}
    rows = read_csv(inc_run / "inc.csv")
    assert summary["unmapped"] == {} and summary["not_scored"] == []
    assert {r["op"] for r in rows} == exported  # every exported op, under its exported name
    hows = {m["by"] for m in summary["mapping"].values()}
    assert "weight" in hows  # INC renamed the Gemms (<name>_MatMul): mapped through their weights
    assert any(k.endswith("/Gemm_MatMul") for k in summary["mapping"])
    # INC's own MSE and the outputs we captured beside it agree
    assert summary["mse_max_rel_deviation"] < 1e-4
    assert 1e-4 < summary["seconds_per_op"] < 60 and summary["versions"]["neural-compressor"] == "3.7.1"


def test_bounded_inc_run_extrapolates_and_says_so(planted, inc_python, tmp_path):
    r = subprocess.run([str(inc_python), str(SCRIPT), "--model", str(planted / "fp32" / "model.onnx"),
                        "--calib", str(planted / "calib" / "calib.npz"), "--eval", str(planted / "calib" / "eval.npz"),
                        "--csv", str(tmp_path / "inc.csv"), "--summary", str(tmp_path / "inc.json"),
                        "--log", str(tmp_path / "log"), "--settings", SETTINGS, "--max-ops", "3"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "inc.json").read_text())
    assert s["bounded"] is True and s["ops"] == 3 and s["ops_total"] > 3
    assert s["extrapolated_seconds_all_ops"] == pytest.approx(s["seconds_per_op"] * s["ops_total"])
    assert len(read_csv(tmp_path / "inc.csv")) == 3


def test_inc_fallback_run_meets_the_target_and_is_remeasured(planted, inc_python, tmp_path):
    r = subprocess.run([str(inc_python), str(SCRIPT), "--tune", "--model", str(planted / "fp32" / "model.onnx"),
                        "--calib", str(planted / "calib" / "calib.npz"), "--eval", str(planted / "calib" / "eval.npz"),
                        "--summary", str(tmp_path / "inc-tune" / "eval.json"), "--log", str(tmp_path / "log"),
                        "--settings", SETTINGS, "--metric", "cosine", "--target", "0.999", "--max-trials", "30"],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((tmp_path / "inc-tune" / "eval.json").read_text())
    assert ev["status"] == "met" and ev["measured"]["cosine"] >= 0.999
    from vlsens.core import records

    assert records.errors(tmp_path / "inc-tune" / "eval.json") == []
    assert (tmp_path / "inc-tune" / "model.onnx").is_file() and (tmp_path / "inc-tune" / "model.onnx.data").is_file()
    # INC's fallback keeps the planted op in float and most ops INT8
    assert any(f"blocks.{PLANT['block']}/attn/qkv" in op for op in ev["fp32_ops"]), ev["fp32_ops"]
    assert len(ev["int8_ops"]) >= 0.8 * ev["ops_total"]
    # the saved model, measured independently here, is what eval.json says
    import numpy as np
    import onnxruntime as ort

    from vlsens.core.metrics import output_metrics
    from vlsens.data.calibration import load_split

    evals = load_split(planted / "calib" / "eval.npz")
    ref = ort.InferenceSession(str(planted / "fp32" / "model.onnx"), providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(str(tmp_path / "inc-tune" / "model.onnx"), providers=["CPUExecutionProvider"])
    name = ref.get_inputs()[0].name
    a = np.concatenate([q.run(None, {name: x[None]})[0] for x in evals])
    b = np.concatenate([ref.run(None, {name: x[None]})[0] for x in evals])
    assert output_metrics(a, b)["cosine"] == pytest.approx(ev["measured"]["cosine"], abs=1e-6)


# --- comparison ---------------------------------------------------------------------------------

def test_spearman_and_ranks():
    assert list(average_ranks([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # textbook value: d = (0, -1, 1, 0, 0) over n = 5 -> 1 - 6 * 2 / (5 * 24) = 0.9
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    assert top_k(["a", "b", "c"], [0.1, 0.9, 0.5], 2) == ["b", "c"]


def test_compare_on_the_planted_model(planted, inc_run, tmp_path):
    rec = compare({"ort": planted / "ort.csv", "inc": inc_run / "inc.csv"},
                  {"ort": planted / "ort.json", "inc": inc_run / "inc.json"}, ks=(1, 5))
    assert rec["same_eval_data"] is True
    assert rec["common_ops"] == rec["ops"]["ort"] == rec["ops"]["inc"]
    assert -1.0 <= rec["spearman"] <= 1.0
    # both engines put the planted op first
    assert rec["top_k"]["1"]["overlap"] == 1.0, rec["top_k"]["1"]
    for engine, side in (("ort", planted / "ort.json"), ("inc", inc_run / "inc.json")):  # the engines' own timings
        assert rec["seconds_per_op"][engine] == json.loads(side.read_text())["seconds_per_op"] and \
            1e-5 < rec["seconds_per_op"][engine] < 60, engine


def test_profile_inc_op_name_dict_matches_inc_names(inc_run, planted, tmp_path):
    """The profile's inc_op_name_dict keys are regexes INC fullmatches against its own (renamed)
    node names: each excluded op must match exactly its INC name, and no other op's."""
    import re

    from vlsens.precision.int8 import inc_op_name_dict

    summary = json.loads((inc_run / "inc.json").read_text())
    inc_name = {m["onnx_name"]: k for k, m in summary["mapping"].items()}  # exported -> INC
    rows = {r["op"]: r for r in read_csv(planted / "ort.csv")}
    keys = inc_op_name_dict(list(rows), {n: r["op_type"] for n, r in rows.items()})
    assert len(keys) == len(rows)
    for key, exported in zip(keys, rows):
        hits = [n for n in inc_name.values() if re.fullmatch(key, n)]
        assert hits == [inc_name[exported]], (key, hits)
