"""The profile on a checkpoint no other test uses (depth 6, width 96, an outlier on the attention
output of block 3, 308x196): the search's estimate is what the built model measures in the
target's arithmetic, with no repair; the shipped model holds the INT8 share the search chose and
is smaller than float; the latency objective ships the fastest built candidate that meets the
target; every op says what was measured for it."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import build_graph, run_settings

HELD_OUT_VISION = {"depth": 6, "hidden_size": 96, "intermediate_size": 192, "num_heads": 3, "out_hidden_size": 64,
                   "fullatt_block_indexes": [2, 5]}
HELD_OUT_PLANT = {"block": 3, "channels": 2, "scale": 1000.0, "site": "proj"}
SIZE = "308x196"


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """The held-out planted tower through export, calibration and the ort engine (run settings)."""
    from vlsens.data.images import resolve_images
    from vlsens.model.presets.build import build_tiny_checkpoint
    from vlsens.sensitivity.stages import gather, prepare, run_shard

    root = tmp_path_factory.mktemp("held-out")
    ckpt = build_tiny_checkpoint(root / "ckpt", seed=7, outlier=HELD_OUT_PLANT, vision=HELD_OUT_VISION)
    build_graph(f"vision/{SIZE}", ckpt, root, resolve_images("builtin")[:2], **{"vision.sizes": [SIZE]})
    ev = root / "calib" / "eval.npz"
    prepare(root / "fp32" / "model.onnx", root / "calib" / "calib.npz", ev, root / "engine", run_settings(), logits=False)
    shards = [root / f"ort.{i}-of-2.csv" for i in range(2)]
    for i, p in enumerate(shards):
        run_shard(root / "engine", ev, i, 2, p)
    gather(root / "engine", ev, shards, root / "ort.csv", root / "ort.json")
    return root


def _profile(root, out, objective="accuracy"):
    from vlsens.precision.int8 import ProfileSettings, build_profile

    return build_profile(root / "engine", root / "ort.csv", root / "calib" / "eval.npz",
                         {"fp32": root / "fp32" / "model.onnx"}, out, ProfileSettings("cosine", 0.999, objective=objective))


@pytest.mark.slow
def test_estimate_is_the_built_model_on_a_held_out_checkpoint(held_out, tmp_path):
    from vlsens.core.onnxutil import check_compact
    from vlsens.sensitivity.ranking import read_csv

    rec = _profile(held_out, tmp_path / "p")
    assert rec["status"] == "met" and rec["meets_target"]
    assert abs(rec["estimate_gap"]) <= 1e-4, rec["estimate_gap"]
    assert rec["rebuilds"] == 0 and len(rec["builds"]) == 1
    assert rec["int8_weight_share"] >= 0.9 * rec["search_choice"]["int8_weight_share"]
    assert rec["session"] == "default" and rec["quant_target"]["arithmetic"] == "integer"
    assert rec["settings"]["guard"] == ("reduce_range" if rec["quant_target"]["cpu"]["u8s8_saturates"] else "none")
    check_compact(tmp_path / "p" / "model.onnx")
    assert rec["model_bytes"] < rec["float_model_bytes"]
    assert set(rec["latency_ms"]) == {"int8_mixed", "fp32"}
    speedup = rec["speedup"]["vs_fp32"]
    assert speedup == pytest.approx(rec["latency_ms"]["fp32"] / rec["latency_ms"]["int8_mixed"])
    # Two real timings of one small tower, in interleaved rounds, within 0.5x-2.5x of each other (measured 0.91x here;
    # 0.75x-1.27x over the guards and machines of docs/benchmarks/profile-held-out.md: on 6 blocks of
    # width 96 the Q/DQ overhead and the integer kernels about cancel). Outside: a timing is broken.
    assert 0.5 < speedup < 2.5, rec["latency_ms"]
    # the planted block is what the ranking and the profile single out
    top = read_csv(held_out / "ort.csv")[0]
    assert top["block"] == HELD_OUT_PLANT["block"] and top["role"].startswith("attn"), top
    prof = yaml.safe_load((tmp_path / "p" / "profile.yaml").read_text())
    assert prof["ops"][top["op"]]["precision"] == "fp32"
    assert "misses" in prof["ops"][top["op"]]["why"]
    # every op of the ranking is in the profile; most are INT8 (76 of 85 measured here, 75-76 over the
    # guards of docs/benchmarks/profile-held-out.md), never all (the planted op is not), and each
    # INT8 op says what was measured for it
    assert len(prof["ops"]) == len(read_csv(held_out / "ort.csv"))
    int8 = [o for o in prof["ops"].values() if o["precision"] == "int8"]
    assert len(int8) == rec["int8_ops"] and 0.8 * len(prof["ops"]) < len(int8) < len(prof["ops"]), len(int8)
    assert all("measured" in o["why"] for o in int8)


@pytest.mark.slow
def test_latency_objective_ships_the_fastest_candidate_that_meets(held_out, tmp_path):
    rec = _profile(held_out, tmp_path / "p", objective="latency")
    assert rec["objective"] == "latency" and rec["status"] == "met"
    timed = [b for b in rec["builds"] if "latency_ms" in b]
    assert len(timed) >= 2 and any(b["reason"].startswith("latency candidate") for b in timed)
    ok = [b for b in timed if b["meets"]]
    fastest = min(ok, key=lambda b: b["latency_ms"])
    assert rec["int8_ops"] == fastest["int8_ops"] and rec["measured"]["cosine"] == fastest["cosine"]
    # the fastest by its own timing; the record's comparison times it again, interleaved with the float models
    assert rec["meets_target"] and rec["latency_ms"]["int8_mixed"] > 0
    prof = yaml.safe_load((tmp_path / "p" / "profile.yaml").read_text())
    if rec["int8_ops"] < rec["search_choice"]["int8_ops"]:  # some INT8 ops were left float for speed: said so
        assert any("faster" in o["why"] for o in prof["ops"].values())
    assert json.loads((tmp_path / "p" / "eval.json").read_text())["builds"] == rec["builds"]


@pytest.mark.slow
def test_a_missed_build_is_repaired_by_bisection_and_explained(held_out, tmp_path, monkeypatch):
    """Force the built model to miss (its measurement made worse than the engine's by a fixed
    amount): the profile searches again for the shifted target, then bisects over built models,
    and ships the met build with the largest INT8 share; every op back in float says why."""
    from vlsens.precision import int8 as profile

    real = profile.measure

    def pessimistic(sess, float_session, samples, logits, cases=None):
        m = real(sess, float_session, samples, logits, cases)
        return {**m, "cosine": m["cosine"] - (4e-4 if m["cosine"] < 1.0 else 0.0)}

    monkeypatch.setattr(profile, "measure", pessimistic)
    rec = _profile(held_out, tmp_path / "p")
    first = rec["builds"][0]
    assert not first["meets"] and rec["rebuilds"] >= 1 and rec["status"] == "met"
    assert rec["meets_target"] and rec["int8_ops"] < rec["search_choice"]["int8_ops"]
    reasons = [b["reason"] for b in rec["builds"]]
    assert any(r.startswith("the search again") for r in reasons) or any(r.startswith("repair") for r in reasons)
    best = max((b for b in rec["builds"] if b["meets"] and b["int8_ops"]), key=lambda b: b["int8_weight_share"])
    assert rec["int8_weight_share"] == best["int8_weight_share"]
    import math

    assert len(rec["builds"]) <= 2 + math.ceil(math.log2(rec["search_choice"]["int8_ops"]))
    prof = yaml.safe_load((tmp_path / "p" / "profile.yaml").read_text())
    assert not any("breaks the target" in o["why"] for o in prof["ops"].values())  # nothing unmeasured claimed
