"""The other Qwen-VL families, Qwen2-VL and Qwen3-VL: their tiny presets through the whole DAG
(config/tiny-qwen2vl.yaml, config/tiny-qwen3vl.yaml), DeepStack kept, video end to end."""

import json

import numpy as np
import pytest
from conftest import REPO
from test_workflow import smk

FAMILIES = {"tiny-qwen2vl": "qwen2_vl", "tiny-qwen3vl": "qwen3_vl"}
#: Graphs each family config builds, with the variants config.yaml gives them.
EXPECTED = {
    "vision/224x224": ["fp32", "fp16", "fp32-sim", "fp16-sim"],
    "vision/224x224-u8": ["fp32", "fp16"],
    "vision/224x224-t2": ["fp32", "fp16"],
    "vision/dynamic": ["fp32", "fp16", "fp32-sim", "fp16-sim"],
    "text": ["fp32", "fp16", "fp32-sim", "fp16-sim"],
}
PLANTED = {"vision": "/visual/blocks.2/attn/qkv/", "text": "/language_model/layers.1/mlp/down_proj/"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_run(request, tmp_path_factory):
    """The whole DAG on one family's tiny preset, with its shipped config."""
    preset = request.param
    wd = tmp_path_factory.mktemp(preset)
    (wd / "config.yaml").write_text((REPO / "config" / f"{preset}.yaml").read_text())
    r = smk(wd, "--cores", "2", "--resources", "gpu=1", timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return wd / "results" / preset, preset


def _models(family_run):
    """transformers' model (eager) and processor of the run's checkpoint."""
    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    res, _ = family_run
    ckpt = res / "checkpoint"
    return ckpt, load_model(ckpt, attn_implementation="eager"), load_processor(ckpt)


@pytest.mark.slow
def test_every_artifact_is_gated_against_the_family_model(family_run):
    res, preset = family_run
    assert json.loads((res / "checkpoint" / "config.json").read_text())["model_type"] == FAMILIES[preset]
    assert not (res / "deploy").exists()  # deploy is Qwen2.5-VL's (the config turns it off)
    for graph, variants in EXPECTED.items():
        for variant in variants:
            rec = json.loads((res / graph / variant / "parity.json").read_text())
            assert rec["passed"], (graph, variant, rec["metrics"])
            tol = 1e-4 if variant.startswith("fp32") else 2e-2
            assert rec["metrics"]["max_rel_error"] <= tol
        src = json.loads((res / graph / "fp32" / "parity.json").read_text())["reference"]
        assert ("Qwen3VL" if preset == "tiny-qwen3vl" else "Qwen2VL") in src, src
    # every analysed variant has a built, measured profile that meets its target with INT8 ops in it
    evals = sorted((res / "profile").rglob("eval.json"))
    assert {e.relative_to(res / "profile").parent.parent.as_posix() for e in evals} == set(EXPECTED)
    for ev in evals:
        e = json.loads(ev.read_text())
        assert e["status"] == "met" and e["meets_target"] and e["int8_ops"] > 0, (ev, e["measured"])


@pytest.mark.slow
def test_planted_outlier_ranks_first_in_every_family(family_run):
    res, _ = family_run
    csvs = sorted((res / "sensitivity").rglob("ort.csv"))
    assert {c.relative_to(res / "sensitivity").parent.parent.as_posix() for c in csvs} == set(EXPECTED)
    for csv in csvs:
        top = csv.read_text().splitlines()[1].split(",")[1]
        tower = "text" if "/text/" in csv.as_posix() else "vision"
        assert top.startswith(PLANTED[tower]), (csv, top)


@pytest.mark.slow
def test_qwen3vl_text_graph_uses_its_deepstack_inputs(family_run):
    """ONNX only (dynamic vision graph -> embedding table -> text graph) equals transformers'
    logits on an image prompt; the same graph with the DeepStack inputs zeroed does not."""
    import torch

    from vlsens.core.metrics import compare
    from vlsens.data.images import open_rgb, resolve_images
    from vlsens.deploy.genai.runtime import prompt_logits
    from vlsens.export.towers.prompts import multimodal_inputs

    res, preset = family_run
    if preset != "tiny-qwen3vl":
        pytest.skip("DeepStack is Qwen3-VL's")
    ckpt, model, processor = _models(family_run)
    image = open_rgb(resolve_images("builtin")[3])
    inputs = multimodal_inputs(processor, [image], ["Read the text in the image."], 256, 320)
    with torch.no_grad():
        expected = model(**inputs, use_cache=False).logits.numpy()
    feeds = {k: v.numpy() for k, v in inputs.items()}
    graphs = (res / "vision" / "dynamic" / "fp32" / "model.onnx", res / "text" / "fp32" / "embeds.onnx")
    with_ds = compare(prompt_logits(ckpt, *graphs, feeds), expected, None, True)
    without = compare(prompt_logits(ckpt, *graphs, feeds, zero_deepstack=True), expected, None, True)
    assert with_ds["max_rel_error"] < 1e-4 and with_ds["top1_agreement"] == 1.0, with_ds
    assert without["max_rel_error"] > 0.05 and without["cosine"] < 0.99, without


@pytest.mark.slow
def test_video_clip_logits_onnx_only_equal_transformers(family_run):
    """A 4-frame clip: the dynamic vision graph (grid t = 2) and the text graph give transformers'
    video forward logits (Qwen2-VL; Qwen2.5-VL with second_per_grid_ts: test_workflow)."""
    import torch

    from vlsens.core.metrics import compare
    from vlsens.data.images import open_rgb, resolve_images
    from vlsens.deploy.genai.runtime import prompt_logits
    from vlsens.export.towers.prompts import video_inputs

    res, preset = family_run
    if preset != "tiny-qwen2vl":
        pytest.skip("Qwen3-VL's video prompt carries timestamps (not built)")
    ckpt, model, processor = _models(family_run)
    inputs = video_inputs(processor, open_rgb(resolve_images("builtin")[0]), "What moves?", 4, 224, 280)
    assert inputs["video_grid_thw"].tolist() == [[2, 16, 20]]
    with torch.no_grad():
        expected = model(**inputs, use_cache=False).logits.numpy()
    got = prompt_logits(ckpt, res / "vision" / "dynamic" / "fp32" / "model.onnx", res / "text" / "fp32" / "embeds.onnx",
                        {k: v.numpy() for k, v in inputs.items()}, video=True)
    m = compare(got, expected, None, True)
    assert m["max_rel_error"] < 1e-4 and m["top1_agreement"] == 1.0, m


def test_family_presets_preserve_the_function_and_plant_the_outlier(tmp_path):
    """Each family's tiny preset with and without the planted outliers computes the same logits
    (function-preserving), and the planted vision channel is ~1000x the others at qkv's input."""
    import torch

    from vlsens.model.presets.build import make_tiny_model

    for preset, family in FAMILIES.items():
        plain, tok = make_tiny_model(0, family=family)
        planted, _ = make_tiny_model(0, {"block": 2, "channels": 2, "scale": 1000.0},
                                     text_outlier={"layer": 1, "channels": 2, "scale": 1000.0}, family=family)
        assert type(plain).__name__.lower().startswith(family.replace("_", "")), type(plain)
        ids = torch.tensor([tok("Describe this image in detail.")["input_ids"]])
        with torch.no_grad():
            a, b = plain(input_ids=ids).logits, planted(input_ids=ids).logits
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-3, atol=1e-4)
        norm = planted.model.visual.blocks[2].norm1
        w = norm.weight.detach().abs()
        assert w.max() / w.median() > 500, preset


def test_dense_deepstack_and_split_features():
    from vlsens.model.family import dense_deepstack, split_features

    feats = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3 * 4)  # 2 tokens, 1 + 2 maps of width 4
    main, maps = split_features(feats, 2)
    assert main.shape == (2, 4) and [m.shape for m in maps] == [(2, 4), (2, 4)]
    np.testing.assert_array_equal(np.concatenate([main, *maps], -1), feats)
    mask = np.array([[False, True, False, True]])
    dense = dense_deepstack(maps, mask)
    assert dense.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(dense[:, 0, [1, 3]], np.stack(maps))
    assert not dense[:, 0, [0, 2]].any()
    with pytest.raises(ValueError, match="2 rows for 1 visual"):
        dense_deepstack(maps, np.array([[True, False]]))
