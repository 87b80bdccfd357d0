"""vision.parts: a fixed-size graph cut at block boundaries into single-file parts, gated chained
against transformers and through onnxsim's Python API; each part's calibration archives."""

import io
import json
import tarfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TOL_FP16, TOL_FP32

from vlsens import variants
from vlsens.core.errors import ArtifactError, ConfigError, ParityError
from vlsens.core.onnxutil import data_path
from vlsens.data.calibration import write_npu_archive
from vlsens.npu import build, calibration, cut


@pytest.fixture(scope="module")
def fp16_folder(fixed, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16") / "fp16"
    variants.fp16(fixed.folder("fp32"), fixed.reference, out, TOL_FP16, 1000.0, 65504.0)
    return out


def _tar(path):
    with tarfile.open(path) as tar:
        return {m.name: np.load(io.BytesIO(tar.extractfile(m).read()), allow_pickle=False) for m in tar.getmembers()}


def _graph_output(model, feed):
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return s.run(None, feed)[0]


def test_two_parts_chain_to_transformers_and_are_single_files(fixed, tmp_path):
    rec = build.build_parts(fixed.folder("fp32"), fixed.reference, tmp_path / "p", TOL_FP32, "fp32", 2, 2_000_000_000)
    assert rec["passed"] and rec["extra"]["onnxsim"]["passed"]
    assert [p["file"] for p in rec["parts"]] == ["part0.onnx", "part1.onnx"]
    assert [p["blocks"] for p in rec["parts"]] == [[0, 1], [2, 3]]  # the tiny tower's 4 blocks, balanced
    on_disk = sorted(f.name for f in (tmp_path / "p").iterdir())
    assert on_disk == ["part0.onnx", "part1.onnx", "parts.json"]  # no .onnx.data: weights inside
    assert json.loads((tmp_path / "p" / "parts.json").read_text()) == json.loads(json.dumps(rec, default=str))
    # the boundary: one tensor, the hidden states after block 1
    (p0, p1) = rec["parts"]
    assert [o["name"] for o in p0["outputs"]] == [i["name"] for i in p1["inputs"]]
    (b,) = p0["outputs"]
    assert b["name"].startswith("visual_blocks.1_") and b["dtype"] == "FLOAT" and b["bytes"] == 4 * np.prod(b["shape"])
    assert rec["extra"]["boundary_bytes"] == {b["name"]: b["bytes"]}
    for p in rec["parts"]:
        m = onnx.load(str(tmp_path / "p" / p["file"]))  # one protobuf, loads alone
        onnx.checker.check_model(m, full_check=True)
        assert not any(t.external_data for t in m.graph.initializer)
        assert p["bytes"] == (tmp_path / "p" / p["file"]).stat().st_size and len(p["sha256"]) == 64
    # the chain equals the whole graph, run by ONNX Runtime directly (not through vlsens' chain)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    h = _graph_output(tmp_path / "p" / "part0.onnx", {"pixel_values": x})
    out = _graph_output(tmp_path / "p" / "part1.onnx", {b["name"]: h})
    np.testing.assert_allclose(out, _graph_output(fixed.model(), {"pixel_values": x}), rtol=1e-5, atol=1e-5)


def test_fp16_parts_keep_inserted_casts_with_their_block(fp16_folder, fixed, tmp_path):
    """The FP16 step adds unnamed Casts and Constants out of order: each goes with the block it
    reads from, and static ones are copied into the parts that read them."""
    rec = build.build_parts(fp16_folder, fixed.reference, tmp_path / "p", TOL_FP16, "fp16", 3, 2_000_000_000)
    assert rec["passed"] and len(rec["parts"]) == 3
    assert [len(p["inputs"]) for p in rec["parts"]] == [1, 1, 1]
    assert sum(p["nodes"] for p in rec["parts"]) >= len(onnx.load(str(fp16_folder / "model.onnx"),
                                                                  load_external_data=False).graph.node)


def test_auto_takes_the_fewest_parts_below_max_bytes(fixed, tmp_path):
    graph = cut.Graph.load(fixed.model())
    units = graph.unit_bytes()
    total = sum(units.values())
    assert cut.plan_cut(graph, "auto", total).count == 1
    limit = max(units[b] + (units[-1] if b == 0 else 0) for b in graph.blocks) + 1
    plan = cut.plan_cut(graph, "auto", limit)
    sizes = [sum(units[b] for b in g) for g in plan.groups]
    assert all(s <= limit for s in sizes)
    # fewest: no two neighbouring parts would fit together
    assert all(a + b > limit for a, b in zip(sizes, sizes[1:]))
    rec = build.build_parts(fixed.folder("fp32"), fixed.reference, tmp_path / "p", TOL_FP32, "fp32", "auto", limit)
    assert len(rec["parts"]) == plan.count > 1


def test_one_part_is_the_whole_graph_in_one_file(fixed, tmp_path):
    rec = build.build_parts(fixed.folder("fp32"), fixed.reference, tmp_path / "p", TOL_FP32, "fp32", 1, 2_000_000_000)
    assert len(rec["parts"]) == 1 and rec["parts"][0]["single_file"]
    assert [i["name"] for i in rec["parts"][0]["inputs"]] == ["pixel_values"]
    assert not data_path(tmp_path / "p" / "part0.onnx").exists()


def test_bad_counts_and_limits_name_the_key(fixed, tmp_path):
    graph = cut.Graph.load(fixed.model())
    with pytest.raises(ConfigError, match="vision.parts.count: 9"):
        cut.plan_cut(graph, 9, 2_000_000_000)
    with pytest.raises(ConfigError, match="vision.parts.max_bytes: 1000 bytes, but block"):
        cut.plan_cut(graph, "auto", 1000)


def test_a_failing_gate_writes_nothing(fixed, tmp_path):
    with pytest.raises(ParityError, match="parity gate failed"):
        build.build_parts(fixed.folder("fp32"), fixed.reference, tmp_path / "p", {"min_cosine": 1.1,
                          "max_rel_error": 0.0}, "fp32", 2, 2_000_000_000)
    assert not (tmp_path / "p").exists() and list(tmp_path.iterdir()) == []


def test_part_calibration_archives_are_each_parts_own_inputs(fixed, tmp_path):
    build.build_parts(fixed.folder("fp32"), fixed.reference, tmp_path / "p", TOL_FP32, "fp32", 2, 2_000_000_000)
    man = calibration.part_calibration(tmp_path / "p", fixed.calib / "calib.npz", fixed.calib / "eval.npz", tmp_path / "c")
    assert man["counts"]["calib"] >= 1 and len(man["inputs"]) == 2
    # part 0's archive is the graph's own calib.tar (rule calibration_tar), byte for byte
    write_npu_archive(fixed.calib / "calib.npz", tmp_path / "calib.tar")
    assert (tmp_path / "c" / "part0" / "calib.tar").read_bytes() == (tmp_path / "calib.tar").read_bytes()
    # part 1's inputs, run through part 1 alone, give the whole graph's output on the same image
    pix = _tar(tmp_path / "calib.tar")
    hid = _tar(tmp_path / "c" / "part1" / "calib.tar")
    (name,) = man["inputs"][1]
    assert sorted(hid) == [f"{name}_{k:04d}.npy" for k in range(man["counts"]["calib"])]
    for k in range(man["counts"]["calib"]):
        out = _graph_output(tmp_path / "p" / "part1.onnx", {name: hid[f"{name}_{k:04d}.npy"]})
        whole = _graph_output(fixed.model(), {"pixel_values": pix[f"pixel_values_{k:04d}.npy"]})
        np.testing.assert_allclose(out, whole, rtol=1e-5, atol=1e-5)


def test_a_changed_part_is_refused(fixed, tmp_path):
    build.build_parts(fixed.folder("fp32"), fixed.reference, tmp_path / "p", TOL_FP32, "fp32", 2, 2_000_000_000)
    f = tmp_path / "p" / "part1.onnx"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match="part1.onnx: not the part"):
        calibration.part_calibration(tmp_path / "p", fixed.calib / "calib.npz", fixed.calib / "eval.npz", tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_parts_of_a_variant_no_graph_builds_are_refused(tmp_path):
    from conftest import default_config

    from vlsens.dag.plan import configure

    cfg = default_config(**{"vision.parts.variants": ["fp32", "bf16"]})
    _, towers = configure(cfg, tmp_path)
    # bf16 is cut where it is built (vision.variants), not for the uint8 / video graphs
    assert {g: t.parts_variants() for g, t in towers.items() if t.cuttable} == {
        "vision/224x224": ["fp32", "bf16"], "vision/224x336": ["fp32", "bf16"], "vision/224x224-u8": ["fp32"],
        "vision/224x224-t2": ["fp32"]}
    cfg = default_config(**{"vision.parts.variants": ["fp32-sim"], "vision.variants": ["fp32"],
                            "vision.sensitivity_variants": ["fp32"]})
    with pytest.raises(ConfigError, match="vision.parts.variants: 'fp32-sim' is built by no fixed-size graph"):
        configure(cfg, tmp_path)


def test_a_part_is_a_graph_for_the_engine_and_the_profile(planted, tmp_path):
    """Engine ort and the profile on part 1 alone (blocks 2-3), calibrated on its own inputs: the
    outlier planted in block 2 is its most sensitive op, and the profile keeps it float."""
    from conftest import PLANT, run_settings

    from vlsens.precision.int8 import ProfileSettings, build_profile
    from vlsens.sensitivity.ranking import read_csv
    from vlsens.sensitivity.stages import gather, prepare, run_shard

    tol = {"min_cosine": 0.99999, "max_rel_error": 1e-4}
    rec = build.build_parts(planted / "fp32", planted / "reference.npz", tmp_path / "p", tol, "fp32", 2, 2_000_000_000)
    assert [p["blocks"] for p in rec["parts"]] == [[0, 1], [2, 3]] and PLANT["block"] == 2
    calibration.part_calibration(tmp_path / "p", planted / "calib" / "calib.npz", planted / "calib" / "eval.npz", tmp_path / "c")
    part, cal = tmp_path / "p" / "part1.onnx", tmp_path / "c" / "part1"
    prepare(part, cal / "calib.npz", cal / "eval.npz", tmp_path / "engine", run_settings(), logits=False)
    run_shard(tmp_path / "engine", cal / "eval.npz", 0, 1, tmp_path / "shard.csv")
    gather(tmp_path / "engine", cal / "eval.npz", [tmp_path / "shard.csv"], tmp_path / "ort.csv", tmp_path / "ort.json")
    rows = read_csv(tmp_path / "ort.csv")
    assert {r["block"] for r in rows} == {2, 3, ""}  # "": the merger, after the last block
    assert all("merger" in r["op"] for r in rows if r["block"] == "")
    assert (rows[0]["block"], rows[0]["role"]) == (PLANT["block"], "attn.qkv") and rows[0]["mse"] > 20 * rows[1]["mse"]
    prof = build_profile(tmp_path / "engine", tmp_path / "ort.csv", cal / "eval.npz", {"fp32": part},
                         tmp_path / "profile", ProfileSettings("cosine", 0.999))
    assert prof["status"] == "met" and rows[0]["op"] in json.loads(
        (tmp_path / "profile" / "nodes_to_exclude.json").read_text())["nodes_to_exclude"]
