"""The ort engine on the planted tiny preset (vision/224x224): it finds the planted outlier, and
the profile built from it keeps that op in float and is exactly what profile.yaml says. (The
engine's exactness, sharding and profiles of every tower: tests/test_stages.py.)"""

import json

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from conftest import PLANT

from vlsens.core.metrics import output_metrics
from vlsens.data.calibration import load_split
from vlsens.precision.int8 import ProfileSettings, build_profile
from vlsens.quantize.qdq import parse_op_name
from vlsens.sensitivity.engine import Engine
from vlsens.sensitivity.ranking import read_csv


def test_switches_off_is_the_float_model(planted):
    from vlsens.sensitivity.baseline import model_outputs

    eng = Engine(planted / "engine")
    evals = load_split(planted / "calib" / "eval.npz")
    np.testing.assert_array_equal(eng.float_outputs(), np.concatenate(model_outputs(eng.float_model, evals)))


def test_csv_schema_and_sidecar(planted):
    rows = read_csv(planted / "ort.csv")
    assert list(rows[0]) == ["rank", "op", "op_type", "block", "role", "weight_params", "mse", "cosine", "sqnr_db"]
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(a["mse"] >= b["mse"] for a, b in zip(rows, rows[1:]))
    down = next(r for r in rows if r["op"] == "/visual/blocks.2/mlp/down_proj/Gemm")
    assert (down["block"], down["role"], down["op_type"], down["weight_params"]) == (2, "mlp.down_proj", "Gemm", 128 * 64)
    side = json.loads((planted / "ort.json").read_text())
    assert side["all_int8"]["cosine"] < 1 and side["ops"] == len(rows) and side["shards"] == 3
    assert 1e-5 < side["seconds_per_op"] < 60 and 1e-5 < side["floor_seconds"] < 600


def test_planted_outlier_is_ranked_first(planted, unplanted):
    """qkv alone reads the outlier tensor (norm1's output): it is #1, far above everything else."""
    rows = read_csv(planted / "ort.csv")
    assert (rows[0]["block"], rows[0]["role"]) == (PLANT["block"], "attn.qkv"), rows[0]
    baseline = max(r["mse"] for r in read_csv(unplanted / "ort.csv"))
    assert rows[0]["mse"] > 20 * baseline  # a real sensitivity, not noise
    assert rows[0]["mse"] > 20 * rows[1]["mse"]


def test_mlp_site_plant_marks_both_ops_of_the_tensor(tmp_path):
    """The MLP variant of the plant: down_proj reads the outlier tensor and up_proj writes it, so
    with ORT's semantics (the Q/DQ next to op k serves every reader) both are sensitive."""
    from conftest import _pipeline

    root = _pipeline(tmp_path, {**PLANT, "site": "mlp"})
    rows = read_csv(root / "ort.csv")
    assert {(r["block"], r["role"]) for r in rows[:2]} == {(PLANT["block"], "mlp.down_proj"),
                                                           (PLANT["block"], "mlp.up_proj")}, rows[:3]
    assert rows[1]["mse"] > 20 * rows[2]["mse"]


def test_profile_meets_target_keeps_planted_op_float_and_is_remeasured(planted, tmp_path):
    out = tmp_path / "profile"
    rec = build_profile(planted / "engine", planted / "ort.csv", planted / "calib" / "eval.npz",
                        {"fp32": planted / "fp32" / "model.onnx"}, out, ProfileSettings("cosine", 0.999))
    assert rec["status"] == "met" and rec["meets_target"] and rec["measured"]["cosine"] >= 0.999
    assert rec["int8_op_share"] >= 0.8
    prof = yaml.safe_load((out / "profile.yaml").read_text())
    planted_ops = [n for n, o in prof["ops"].items() if o["block"] == PLANT["block"] and o["role"] == "attn.qkv"]
    assert prof["ops"][planted_ops[0]]["precision"] == "fp32"
    excluded = json.loads((out / "nodes_to_exclude.json").read_text())["nodes_to_exclude"]
    assert planted_ops[0] in excluded
    inc = json.loads((out / "inc_op_name_dict.json").read_text())
    # INC matches op_name_dict keys as regexes (fullmatch): one key per excluded op
    import re

    assert len(inc) == len(excluded)
    for op in excluded:
        keys = [k for k in inc if re.fullmatch(k, op)]
        assert len(keys) == 1 and inc[keys[0]]["weight"]["dtype"] == ["fp32"], (op, keys)
    # Independent re-measurement of the written model against the float model.
    evals = load_split(planted / "calib" / "eval.npz")
    q = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    f = ort.InferenceSession(str(planted / "fp32" / "model.onnx"), providers=["CPUExecutionProvider"])
    qo = np.concatenate([q.run(None, {"pixel_values": evals[i:i + 1]})[0] for i in range(len(evals))])
    fo = np.concatenate([f.run(None, {"pixel_values": evals[i:i + 1]})[0] for i in range(len(evals))])
    assert output_metrics(qo, fo)["cosine"] == pytest.approx(rec["measured"]["cosine"], abs=1e-6)
    assert len({n.op_type for n in __import__("onnx").load(str(out / "model.onnx"), load_external_data=False).graph.node}
               & {"QuantizeLinear", "DequantizeLinear"}) == 2


def _int8_ops_in_graph(model_path) -> tuple[set[str], int]:
    """Read straight from the graph: ops whose weight input is dequantized, and the Q/DQ count."""
    import onnx

    g = onnx.load(str(model_path), load_external_data=False).graph
    dq = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in g.node)
    return {n.name for n in g.node if len(n.input) > 1 and n.input[1] in dq}, qdq


@pytest.mark.parametrize("case,metric,target", [
    ("all", "cosine", 0.5),          # every op INT8
    ("partial", "cosine", 0.999),    # the planted op stays float
    ("unreachable", "cosine", 2.0),  # no model can meet it: an all-float model, not an all-INT8 one
])
def test_built_model_matches_profile_yaml(planted, tmp_path, case, metric, target):
    out = tmp_path / case
    rec = build_profile(planted / "engine", planted / "ort.csv", planted / "calib" / "eval.npz",
                        {"fp32": planted / "fp32" / "model.onnx"}, out, ProfileSettings(metric, target))
    prof = yaml.safe_load((out / "profile.yaml").read_text())
    int8 = {n for n, o in prof["ops"].items() if o["precision"] == "int8"}
    in_graph, qdq = _int8_ops_in_graph(out / "model.onnx")
    assert in_graph & set(prof["ops"]) == int8 and rec["int8_ops"] == len(int8)
    excluded = json.loads((out / "nodes_to_exclude.json").read_text())["nodes_to_exclude"]
    assert set(excluded) == set(prof["ops"]) - int8
    if case == "all":
        assert rec["status"] == "met" and len(int8) == len(prof["ops"]) and not excluded
    elif case == "partial":
        assert rec["status"] == "met" and 0 < len(int8) < len(prof["ops"])
    else:
        assert rec["status"] == "unreachable" and not rec["meets_target"] and qdq == 0 and not int8
        assert rec["measured"]["cosine"] == pytest.approx(1.0, abs=1e-6)  # the float model, measured


def test_fail_if_unreachable_writes_nothing(planted, tmp_path):
    from vlsens.core.errors import VlsensError

    with pytest.raises(VlsensError, match="unreachable.*fail_if_unreachable"):
        build_profile(planted / "engine", planted / "ort.csv", planted / "calib" / "eval.npz",
                      {"fp32": planted / "fp32" / "model.onnx"}, tmp_path / "p",
                      ProfileSettings("sqnr_db", 1000.0, fail_if_unreachable=True))
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())


@pytest.mark.parametrize("name,op_type,expect", [
    ("/visual/blocks.7/mlp/down_proj/Gemm", "Gemm", (7, "mlp.down_proj")),
    ("/visual/merger/mlp/mlp.2/Gemm", "Gemm", (None, "merger.mlp.mlp.2")),
    ("/visual/blocks.0/attn/MatMul_3", "MatMul", (0, "attn.MatMul_3")),
    ("/visual/patch_embed/proj/Conv", "Conv", (None, "patch_embed.proj")),
])
def test_parse_op_name(name, op_type, expect):
    assert parse_op_name(name, op_type) == expect


def test_switch_map_survives_a_json_round_trip():
    import pathlib
    import tempfile

    from vlsens.core.fsutil import write_json
    from vlsens.sensitivity.switch import SwitchMap

    sm = SwitchMap(["b", "a"], {"z": ["a"], "y": ["b"], "x": ["a", "b"]})
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "s.json"
        write_json(p, sm.to_json())
        back = SwitchMap.from_json(json.loads(p.read_text()))
    for ops in ([], ["a"], ["b"], ["a", "b"]):
        np.testing.assert_array_equal(back.mask(ops), sm.mask(ops))


def test_weights_only_leaves_attention_matmuls_out(planted):
    import onnx

    from vlsens.quantize.qdq import quantizable_ops

    model = onnx.load(str(planted / "fp32" / "model.onnx"), load_external_data=False)
    every = quantizable_ops(model)
    weighted = quantizable_ops(model, weights_only=True)
    assert 0 < len(weighted) < len(every)
    assert all(o.weight_params >= 64 for o in weighted)  # every tiny weight matrix has >= 64 entries
    assert {o.name for o in every} - {o.name for o in weighted} == {o.name for o in every if not o.weight_params}


def test_quantizing_twice_at_one_path_writes_one_model(planted, tmp_path):
    """quantize_static saves through onnx's appending writer; vlsens.quantize.qdq.quantize starts from an
    empty data file, so a rebuild at the same path holds one model's bytes (and checks it)."""
    from vlsens.core.onnxutil import check_compact, data_path
    from vlsens.quantize.qdq import quantize

    eng = Engine(planted / "engine")
    names = [o.name for o in eng.ops]
    out = tmp_path / "model.onnx"
    quantize(eng.float_model, out, names, eng.settings, eng.cache)
    first = data_path(out).stat().st_size
    quantize(eng.float_model, out, names[: len(names) // 2], eng.settings, eng.cache)
    assert check_compact(out) == data_path(out).stat().st_size
    float_bytes = data_path(eng.float_model).stat().st_size
    assert first < float_bytes and data_path(out).stat().st_size < float_bytes


def test_attention_matmuls_are_named_by_what_they_compute(fp32_224):
    """The weightless MatMuls of attention get roles attn.qk (scores, into the Softmax) and attn.av
    (the Softmax's output times V), not their exported names (attn.MatMul_3)."""
    import onnx

    from vlsens.quantize.qdq import quantizable_ops

    ops = quantizable_ops(onnx.load(str(fp32_224), load_external_data=False))
    attn = [o for o in ops if o.op_type == "MatMul" and not o.weight_params]
    assert attn and {o.role for o in attn} == {"attn.qk", "attn.av"}
    per_block = {b: sorted(o.role for o in attn if o.block == b) for b in {o.block for o in attn}}
    # one Q·Kᵀ and one A·V per attention window of each block
    assert all(r.count("attn.qk") == r.count("attn.av") >= 1 for r in per_block.values()), per_block
