"""The end-to-end measure of deploy folders: stratified cases, the statistics (KL per step,
summaries per modality, paired bootstrap intervals) and the measure of real folders of the tiny
checkpoint through onnxruntime-genai."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TOL_FP16, TOL_FP32

# ----------------------------------------------------------------------------------------------
# Cases


def test_folder_cases_vary_photos_sizes_and_prompts(parity_refs, tmp_path):
    from PIL import Image

    from vlsens.deploy.cases import folder_cases, load_cases

    cases = folder_cases(parity_refs, tmp_path, per_modality=8)
    assert len(cases) == 24
    assert [c["modality"] for c in cases] == ["text"] * 8 + ["image"] * 8 + ["images"] * 8
    assert cases[0]["name"] == "text-01" and cases[8]["name"] == "image-01" and cases[23]["name"] == "images-08"
    assert all(not c["images"] for c in cases[:8])
    one = [(c["images"][0]["source"], tuple(c["images"][0]["size"])) for c in cases[8:16]]
    assert all(len(c["images"]) == 1 for c in cases[8:16])
    assert len(set(one)) > 1 and len({s for _, s in one}) > 1 and len({p for p, _ in one}) == 2
    for c in cases[16:]:
        a, b = c["images"]
        assert a["size"] != b["size"] and a["source"] != b["source"], c
    for m in range(3):  # consecutive cases of a modality get different prompts
        prompts = [c["prompt"] for c in cases[8 * m:8 * m + 8]]
        assert all(p != q for p, q in zip(prompts, prompts[1:])), prompts
    for c in cases:
        for f in c["images"]:
            with Image.open(f["path"]) as im:
                assert (im.height, im.width) == tuple(f["size"]) and "icc_profile" not in im.info
            assert (tmp_path / f["file"]).is_file()
    assert load_cases(tmp_path) == cases
    record = json.loads((tmp_path / "cases.json").read_text())
    assert record["per_modality"] == 8 and record["seed"] == 0 and len(record["cases"]) == 24
    assert all("path" not in f for c in record["cases"] for f in c["images"])  # relative in the file
    other = folder_cases(parity_refs, tmp_path / "seed1", per_modality=8, seed=1)
    assert [c["prompt"] for c in other] != [c["prompt"] for c in cases]


def test_folder_cases_with_one_photo_and_bad_settings(parity_refs, tmp_path):
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.cases import folder_cases

    cases = folder_cases(parity_refs[:1], tmp_path / "one", per_modality=2)
    assert len(cases) == 6
    for c in cases[4:]:
        a, b = c["images"]
        assert a["source"] == b["source"] and a["size"] != b["size"]
    with pytest.raises(VlsensError, match=r"224x230.*28"):
        folder_cases(parity_refs, tmp_path / "bad", sizes=((224, 224), (224, 230)))
    with pytest.raises(VlsensError, match="per_modality=1"):
        folder_cases(parity_refs, tmp_path / "bad", per_modality=1)
    assert not (tmp_path / "bad" / "cases.json").exists()


def test_pricing_cases_are_stratified_and_spread():
    """A subset to price on: an equal share per modality (the first modalities one more where the count
    does not divide), evenly spaced through each modality's cases, in the cases' order."""
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.cases import pricing_cases

    cases = [{"name": f"{m}-{k + 1:02d}", "modality": m} for m in ("text", "image", "images") for k in range(8)]
    assert pricing_cases(cases, "all") == [c["name"] for c in cases]
    assert pricing_cases(cases, 3) == ["text-01", "image-01", "images-01"]
    assert pricing_cases(cases, 6) == ["text-01", "text-05", "image-01", "image-05", "images-01", "images-05"]
    eight = pricing_cases(cases, 8)
    assert len(eight) == 8 and [n.split("-")[0] for n in eight].count("images") == 2
    assert pricing_cases(cases, 24) == [c["name"] for c in cases]
    for bad in (2, 25, "some", 3.0, True):
        with pytest.raises(VlsensError, match=r"cases to price on.*valid: 'all', or an integer from 3"):
            pricing_cases(cases, bad)


# ----------------------------------------------------------------------------------------------
# Statistics


def test_kl_steps_is_the_kl_of_the_distributions():
    from vlsens.deploy.measure import kl_steps

    rng = np.random.default_rng(0)
    p_logits, q_logits = rng.standard_normal((5, 40)) * 3, rng.standard_normal((5, 40)) * 3
    p = np.exp(p_logits) / np.exp(p_logits).sum(-1, keepdims=True)
    q = np.exp(q_logits) / np.exp(q_logits).sum(-1, keepdims=True)
    want = (p * np.log(p / q)).sum(-1)
    got = kl_steps(np.log(p).astype(np.float32), q_logits.astype(np.float32))
    assert got.shape == (5,) and np.allclose(got, want, rtol=1e-5, atol=1e-7)
    assert np.all(got > 0)
    same = kl_steps(np.log(q), q_logits + 7.0)  # logits are shift-invariant
    assert np.allclose(same, 0.0, atol=1e-12)


def _rows(kls: dict[str, list[float]], top1: float = 1.0) -> list[dict]:
    return [{"name": f"{m}-{i + 1:02d}", "modality": m, "kl": k, "top1": top1}
            for m, ks in kls.items() for i, k in enumerate(ks)]


def test_summarize_per_modality():
    from vlsens.deploy.measure import summarize

    rows = _rows({"images": [3.0, 5.0], "text": [1.0, 2.0, 3.0], "image": [0.5, 0.5]})
    rows[0]["top1"] = 0.5
    s = summarize(rows)
    assert list(s["modalities"]) == ["text", "image", "images"]
    assert s["cases"] == 7 and s["mean_kl"] == pytest.approx(15.0 / 7)
    assert s["top1"] == pytest.approx(6.5 / 7)
    t = s["modalities"]["text"]
    assert t == {"cases": 3, "mean_kl": 2.0, "std": pytest.approx(1.0), "min": 1.0, "max": 3.0, "median": 2.0,
                 "top1": 1.0}
    i2 = s["modalities"]["images"]
    assert i2["mean_kl"] == 4.0 and i2["std"] == pytest.approx(np.sqrt(2.0)) and i2["top1"] == 0.75
    assert s["modalities"]["image"]["std"] == 0.0


def _random_rows(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return _rows({m: list(rng.lognormal(-4, 1.5, 8)) for m in ("text", "image", "images")})


def test_paired_identical_folders():
    from vlsens.deploy.measure import paired

    b = _random_rows()
    out = paired(b, b)
    assert out["ratio"] == pytest.approx(1.0)
    lo, hi = out["interval"]
    assert lo <= 1.0 <= hi
    assert out["better"] is False and out["worse"] is False and out["wins"] == 0.0
    assert out["n_boot"] == 2000 and out["level"] == 0.95
    assert set(out["modalities"]) == {"text", "image", "images"}


def test_paired_half_the_kl_is_better_everywhere():
    from vlsens.deploy.measure import paired

    b = _random_rows()
    a = [dict(r, kl=0.5 * r["kl"]) for r in reversed(b)]  # matched by name, not by position
    out = paired(a, b)
    assert out["ratio"] == pytest.approx(0.5)
    assert 0.49 <= out["interval"][0] <= out["interval"][1] <= 0.51
    assert out["better"] is True and out["worse"] is False and out["wins"] == 1.0
    assert all(v["ratio"] == pytest.approx(0.5) for v in out["modalities"].values())


def test_paired_sides_per_modality_and_bootstrap_width():
    from vlsens.deploy.measure import paired

    b = _random_rows()
    scale = {"text": 0.3, "image": 1.0, "images": 3.0}
    rng = np.random.default_rng(1)
    a = [dict(r, kl=r["kl"] * scale[r["modality"]] * rng.uniform(0.8, 1.25)) for r in b]
    out = paired(a, b, n_boot=1000, seed=3)
    text, images = out["modalities"]["text"], out["modalities"]["images"]
    assert text["ratio"] < 1 and text["interval"][1] < 1 and text["wins"] == 1.0
    assert images["ratio"] > 1 and images["interval"][0] > 1 and images["wins"] == 0.0
    img = out["modalities"]["image"]
    assert img["interval"][0] < img["ratio"] < img["interval"][1]  # a real spread, not a point
    assert paired(a, b, n_boot=1000, seed=3) == out  # seeded
    wide = paired(a, b, n_boot=1000, seed=3, level=0.99)["interval"]
    assert wide[0] <= out["interval"][0] and wide[1] >= out["interval"][1]


def test_paired_rejects_other_cases_and_explains_a_zero_reference():
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.measure import paired

    b = _random_rows()
    with pytest.raises(VlsensError, match="same cases"):
        paired(b[1:], b)
    renamed = [dict(r, name="x" + r["name"]) if i == 0 else r for i, r in enumerate(b)]
    with pytest.raises(VlsensError, match="text-01"):
        paired(renamed, b)
    zero = [dict(r, kl=0.0) for r in b]
    out = paired(b, zero)
    assert out["ratio"] is None and "0" in out["note"] and out["better"] is False and out["worse"] is False
    assert paired(zero, b)["ratio"] == 0.0 and paired(zero, b)["better"] is True


# ----------------------------------------------------------------------------------------------
# Real folders through onnxruntime-genai


@pytest.fixture(scope="module")
def float_folders(graph_builder, parity_refs, tmp_path_factory):
    """The fp32 and fp16 folders of the tiny preset (the decoder tower and the dynamic vision
    graph built like the DAG builds them)."""
    from vlsens import variants
    from vlsens.deploy.build import build_folder
    from vlsens.deploy.genai.evaluate import Checks

    root = tmp_path_factory.mktemp("measure")
    dec, vis = graph_builder("decoder"), graph_builder("vision/dynamic")
    for b in (dec, vis):
        if not b.folder("fp16").exists():
            variants.fp16(b.folder("fp32"), b.reference, b.folder("fp16"), TOL_FP16, 512, 65504)
    common = dict(checkpoint=dec.ckpt, images=parity_refs)
    out = {p: root / p for p in ("fp32", "fp16")}
    build_folder("fp32", out["fp32"], decoder=dec.model("fp32"), embedding=dec.folder("fp32") / "embedding.onnx",
                 vision=vis.model("fp32"), checks=Checks(8, TOL_FP32), **common)
    build_folder("fp16", out["fp16"], decoder=dec.model("fp16"), embedding=dec.folder("fp16") / "embedding.onnx",
                 vision=vis.model("fp16"), checks=Checks(8, TOL_FP16, fp32_folder=out["fp32"]), **common)
    return out


@pytest.fixture(scope="module")
def measured(float_folders, parity_refs, tmp_path_factory):
    from vlsens.deploy.cases import folder_cases
    from vlsens.deploy.genai.measure import reference

    work = tmp_path_factory.mktemp("measure-cases")
    cases = folder_cases(parity_refs, work / "cases", per_modality=3)
    index = reference(float_folders["fp32"], cases, 8, work / "reference.npz")
    return {"cases": cases, "index": index, "npz": work / "reference.npz"}


def test_reference_file_holds_tokens_and_log_probabilities(measured, float_folders):
    from vlsens.deploy.genai.measure import load_reference

    index, logps = load_reference(measured["npz"])
    assert index == measured["index"] and index["max_new_tokens"] == 8
    assert index["folder"] == str(float_folders["fp32"])
    assert [c["name"] for c in index["cases"]] == [c["name"] for c in measured["cases"]]
    for case, logp in zip(index["cases"], logps):
        assert logp.dtype == np.float32 and logp.shape[0] == len(case["tokens"]) >= 1
        assert np.allclose(np.exp(logp.astype(np.float64)).sum(-1), 1.0, atol=1e-4)
        assert np.array_equal(logp.argmax(-1), case["tokens"])  # greedy: the reference's own argmax


def test_fp32_folder_against_its_own_reference_is_exact(measured, float_folders):
    from vlsens.deploy.genai.measure import measure_folder

    rec = measure_folder(float_folders["fp32"], measured["npz"], measured["cases"], "fp32", prepack=False)
    assert rec["folder"] == "fp32" and rec["cases"] and len(rec["cases"]) == 9
    for row in rec["cases"]:
        assert abs(row["kl"]) < 1e-9 and abs(row["max_kl"]) < 1e-9 and row["top1"] == 1.0, row
        assert row["steps"] == len(next(c for c in measured["index"]["cases"] if c["name"] == row["name"])["tokens"])
    assert rec["bytes"] > 0 and rec["seconds"] > 0 and rec["max_new_tokens"] == 8


def test_fp16_folder_is_measured_per_modality(measured, float_folders):
    from vlsens.deploy.genai.measure import measure_folder
    from vlsens.deploy.measure import paired

    rec = measure_folder(float_folders["fp16"], measured["npz"], measured["cases"], "fp16")
    assert len(rec["cases"]) == 9
    assert list(rec["modalities"]) == ["text", "image", "images"]
    assert all(v["cases"] == 3 for v in rec["modalities"].values())
    assert any(r["kl"] > 0 for r in rec["cases"]) and rec["mean_kl"] < 1e-1
    assert all(0.0 <= r["top1"] <= 1.0 for r in rec["cases"])
    fp32 = measure_folder(float_folders["fp32"], measured["npz"], measured["cases"], "fp32", prepack=False)
    assert rec["bytes"] < fp32["bytes"]
    json.dumps(rec)  # a record: plain JSON
    out = paired(fp32["cases"], rec["cases"])
    assert out["ratio"] < 1e-3 and out["better"] is True  # the fp32 folder: rounding only


def test_measure_refuses_other_cases(measured, float_folders, parity_refs, tmp_path):
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.cases import folder_cases
    from vlsens.deploy.genai.measure import measure_folder

    with pytest.raises(VlsensError, match="images-03"):
        measure_folder(float_folders["fp16"], measured["npz"], measured["cases"][:-1], "fp16")
    other = folder_cases(parity_refs, tmp_path, per_modality=3, seed=5)  # same names, other prompts
    with pytest.raises(VlsensError, match="differs from the reference"):
        measure_folder(float_folders["fp16"], measured["npz"], other, "fp16")
