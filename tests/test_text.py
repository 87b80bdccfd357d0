"""Tower text: both graphs gated at two lengths with left padding, the embeds graph on merged
vision features against the PyTorch model, the exporter fallback, text calibration carrying real
vision features, prompts files, and sensitivity/profile finding a planted text layer. (FP16,
onnxsim, the engine and the profile of every tower: tests/test_stages.py.)"""

import json

import numpy as np
import pytest
from conftest import TOL_FP32, build_graph, run_settings, tower_of

from vlsens.core.errors import ConfigError
from vlsens.data.cases import Cases
from vlsens.data.images import resolve_images
from vlsens.data.prompts import BUILTIN_PROMPTS, load_prompt_samples
from vlsens.data.samples import Samples
from vlsens.export import stages
from vlsens.export.towers.text import causal_padding_mask, text_position_ids
from vlsens.sensitivity.ranking import read_csv

TEXT_PLANT = {"layer": 1, "channels": 2, "scale": 1000.0}


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """The text graph of a checkpoint with a planted text layer: reference, fp32, calibration."""
    from vlsens.model.presets.build import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("text")
    ckpt = build_tiny_checkpoint(root / "ckpt", seed=0, text_outlier=TEXT_PLANT)
    build_graph("text", ckpt, root, resolve_images("builtin")[:2])
    return root


def test_mask_and_positions():
    import torch

    am = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    m = causal_padding_mask(am, torch.float32)
    assert m.shape == (2, 1, 4, 4)
    allowed = (m == 0)[:, 0]
    assert allowed[1].tolist() == torch.ones(4, 4).tril().bool().tolist()  # causal
    assert not allowed[0, :, :2].any()  # padded keys never attended
    assert allowed[0, 3, 2:].all() and not allowed[0, 2, 3]
    assert float(m.min()) == -65504.0  # finite in FP16 too
    pos = text_position_ids(am)
    assert pos.shape == (3, 2, 4) and pos[0, 0].tolist() == [1, 1, 0, 1] and pos[2, 1].tolist() == [0, 1, 2, 3]


def test_parity_at_two_lengths_with_left_padding(text_run):
    rec = json.loads((text_run / "fp32" / "parity.json").read_text())
    assert rec["passed"] and rec["variant"] == "fp32"
    cases = {p["case"]: p for p in rec["per_input"]}
    lengths = {cases[c]["shape"][1] for c in ("text-x1", "text-x4")}
    assert len(lengths) == 2  # two sequence lengths
    ref = {c.name: c.inputs for c in Cases.load(text_run / "reference.npz")}
    for c in ("text-x1", "text-x4"):
        mask = ref[c]["attention_mask"]
        assert (mask == 0).any() and (mask[:, -1] == 1).all()  # left padded
        assert cases[c]["max_rel_error"] <= 1e-4 and cases[c]["top1_agreement"] == 1.0
        assert cases[c]["positions"] == int(mask.sum())  # padded positions excluded
    for g in ("model.onnx", "embeds.onnx"):
        assert (text_run / "fp32" / g).is_file() and (text_run / "fp32" / f"{g}.data").is_file()


def test_left_padding_gives_the_unpadded_logits(text_run):
    """model.onnx computes positions from the mask: a prompt padded on the left has the logits it
    has alone, at every real token."""
    import onnxruntime as ort

    ref = {c.name: c.inputs for c in Cases.load(text_run / "reference.npz")}
    ids, mask = ref["text-x1"]["input_ids"], ref["text-x1"]["attention_mask"]
    short = int(np.argmin(mask.sum(1)))
    assert mask[short].sum() < mask.shape[1]
    s = ort.InferenceSession(str(text_run / "fp32" / "model.onnx"), providers=["CPUExecutionProvider"])
    padded = s.run(None, {"input_ids": ids, "attention_mask": mask})[0][short][mask[short] == 1]
    real = ids[short][mask[short] == 1][None]
    alone = s.run(None, {"input_ids": real, "attention_mask": np.ones_like(real)})[0][0]
    np.testing.assert_allclose(padded, alone, atol=2e-5)


def test_embeds_graph_on_merged_vision_features_equals_pytorch(text_run):
    """An image+prompt batch (two images at two different sizes): the embeds graph, fed with the
    image features merged into the token embeddings and the 3-D mRoPE positions, gives the logits
    of transformers' own multimodal forward."""
    import onnxruntime as ort
    import torch

    from vlsens.data.images import open_rgb, resize_exact
    from vlsens.export.towers.prompts import chat_prompt, merged_embeds
    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    ckpt = text_run / "ckpt"
    model, processor = load_model(ckpt, attn_implementation="eager"), load_processor(ckpt)
    imgs = resolve_images("builtin")
    pil = [resize_exact(open_rgb(imgs[2]), 224, 224), resize_exact(open_rgb(imgs[3]), 252, 308)]
    processor.tokenizer.padding_side = "left"
    texts = [chat_prompt(processor, p, True) for p in BUILTIN_PROMPTS[2:4]]
    inputs = processor(text=texts, images=pil, return_tensors="pt", padding=True, do_resize=False)
    with torch.no_grad():
        expected = model(**inputs, use_cache=False).logits.numpy()
    feeds = merged_embeds(model, inputs)
    embeds, pos, mask = feeds["inputs_embeds"], feeds["position_ids"], feeds["attention_mask"]
    assert not np.array_equal(pos[0], pos[1])  # real 3-D positions (image rows/cols), not text ones
    s = ort.InferenceSession(str(text_run / "fp32" / "embeds.onnx"), providers=["CPUExecutionProvider"])
    got = s.run(None, {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": pos})[0]
    keep = mask.astype(bool)
    np.testing.assert_allclose(got[keep], expected[keep], atol=1e-4)
    assert (got[keep].argmax(-1) == expected[keep].argmax(-1)).all()


def test_exporter_fallback_is_recorded(text_run, tmp_path, monkeypatch):
    """The legacy exporter failing (as it does on transformers 4.57) falls back to dynamo."""
    import vlsens.export.towers.text as text

    real = text._export_one

    def legacy_breaks(module, example, names, path, exporter, opset):
        if exporter == "legacy":
            raise RuntimeError("unordered_map::at")
        return real(module, example, names, path, exporter, opset)

    monkeypatch.setattr(text, "_export_one", legacy_breaks)
    tower = tower_of("text")
    rec = stages.export(tower, text_run / "ckpt", text_run / "reference.npz", tmp_path / "fp32", TOL_FP32,
                        tower.export_settings())
    used = rec["extra"]["exporters"]
    assert rec["passed"]
    for g in ("model.onnx", "embeds.onnx"):
        assert used[g]["exporter"] == "dynamo"
        assert "unordered_map::at" in used[g]["failed"][0]["error"]


# --- calibration, sensitivity, profile ----------------------------------------------------------

@pytest.fixture(scope="module")
def text_cal(text_run):
    return text_run / "calib"


def test_text_calibration_carries_vision_features(text_cal, text_run):
    import torch

    from vlsens.model.loading import load_model

    man = json.loads((text_cal / "manifest.json").read_text())
    assert man["counts"] == {"calib": 6, "eval": 3}
    for split in ("calib", "eval"):  # every split holds every modality (stratified)
        shown = sorted(s["modality"] for s in man["samples"] if s["split"] == split)
        assert set(shown) == {"text", "image", "images"}, (split, shown)
        assert all(len(s["images"]) == {"text": 0, "image": 1, "images": 2}[s["modality"]]
                   for s in man["samples"] if s["split"] == split)
    cal = Samples.load(text_cal / "calib.npz")
    model = load_model(text_run / "ckpt")
    emb = model.model.language_model.embed_tokens.weight.detach().numpy()
    for s, feed in zip([s for s in man["samples"] if s["split"] == "calib"], cal.feeds):
        e = feed["inputs_embeds"][0]
        # rows equal to a token embedding: all of them for text, not the image-token slots
        is_token = np.array([np.isclose(emb, row, atol=1e-6).all(1).any() for row in e])
        assert is_token.all() != bool(s["image"]), s["name"]
        if s["image"]:
            assert not np.array_equal(feed["position_ids"][0], feed["position_ids"][1])
        assert feed["attention_mask"].sum() == s["tokens"]
    del torch


def test_jsonl_prompts_and_their_errors(tmp_path):
    from PIL import Image

    Image.new("RGB", (40, 30), "red").save(tmp_path / "red.png")
    good = tmp_path / "p.jsonl"
    good.write_text('{"image": "red.png", "prompt": "What colour?"}\n\n{"image": null, "prompt": "Hi"}\n')
    s = load_prompt_samples(str(good))
    assert [x.prompt for x in s] == ["What colour?", "Hi"] and s[0].image.path == tmp_path / "red.png"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not JSON"):
        load_prompt_samples(str(bad))
    bad.write_text('{"image": "missing.png", "prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: image missing.png not found"):
        load_prompt_samples(str(bad))
    with pytest.raises(ConfigError, match="neither 'builtin'"):
        load_prompt_samples(str(tmp_path / "nope.txt"))
    Image.new("RGB", (40, 30), "blue").save(tmp_path / "blue.png")
    good.write_text('{"images": ["red.png", "blue.png"], "prompt": "Which differs?"}\n')
    two = load_prompt_samples(str(good))[0]
    assert two.modality == "images" and [x.path.name for x in two.images] == ["red.png", "blue.png"]
    bad.write_text('{"images": "red.png", "prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: \"images\" is a list"):
        load_prompt_samples(str(bad))
    bad.write_text('{"prompt": "x"}\n{"image": 5, "prompt": "y"}\n')  # a wrong-typed image field
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: \"image\" is an image path or null, got 5"):
        load_prompt_samples(str(bad))
    bad.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf' + b"\xe9" + b'"}\n')  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not UTF-8 \(byte 0xe9\)"):
        load_prompt_samples(str(bad))


def test_splits_are_stratified_by_modality(tmp_path):
    """Every split holds text, one-image and two-image prompts; prompts without an image, a split
    smaller than the modalities, or a modality too rare for both splits are refused (naming the key)."""
    from vlsens.data.images import ImageRef
    from vlsens.data.prompts import builtin_samples, stratified_split

    imgs = [ImageRef(tmp_path / f"{k}.png", k) for k in "abc"]
    samples = builtin_samples(imgs)
    assert [sum(s.modality == m for s in samples) for m in ("text", "image", "images")] == [8, 8, 8]
    for n_calib, n_eval, seed in ((6, 3, 0), (6, 3, 1), (10, 5, 7), (3, 3, 2)):
        split = stratified_split(samples, n_calib, n_eval, seed)
        assert len(split["calib"]) == n_calib and len(split["eval"]) == n_eval
        assert not set(split["calib"]) & set(split["eval"])
        for idx in split.values():
            counts = [sum(samples[i].modality == m for i in idx) for m in ("text", "image", "images")]
            assert min(counts) >= 1 and max(counts) - min(counts) <= 1, counts  # as equal as the count allows
    assert stratified_split(samples, 6, 3, 0) == stratified_split(samples, 6, 3, 0)
    assert stratified_split(samples, 6, 3, 0) != stratified_split(samples, 6, 3, 1)
    with pytest.raises(ConfigError, match="text.calibration.prompts: no prompt shows an image"):
        stratified_split(builtin_samples([]), 6, 3)  # text only: a split without an image fails
    with pytest.raises(ConfigError, match="text.calibration.num_eval: 2, .* at least 3"):
        stratified_split(samples, 6, 2)
    with pytest.raises(ConfigError, match="too few images prompts"):
        stratified_split([s for s in samples if s.modality != "images"] + samples[2:3], 3, 3)
    one = builtin_samples(imgs[:1])  # one image: no two-image prompt, two modalities
    assert {samples_m for samples_m in (s.modality for s in one)} == {"text", "image"}
    assert len(stratified_split(one, 2, 2)["eval"]) == 2


def test_measured_positions_are_those_a_user_reads():
    """Padding and the positions that predict an image placeholder or delimiter do not count; the
    position after the image (predicting text) and the last one (the answer's first token) do."""
    from vlsens.export.towers.prompts import text_positions

    S, E, P = 90, 91, 92  # vision start / end, image pad
    ids = np.array([[0, 0, 5, S, P, P, P, E, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10])
    got = text_positions(ids, mask, [S, E, P])
    assert got[0].tolist() == [False] * 7 + [True] * 3
    assert got[1].all()  # a text prompt: every real token


@pytest.fixture(scope="module")
def text_sens(text_run, text_cal):
    from vlsens.sensitivity.stages import gather, prepare, run_shard

    eng = text_run / "engine"
    prepare(text_run / "fp32" / "embeds.onnx", text_cal / "calib.npz", text_cal / "eval.npz", eng, run_settings(),
            logits=True)
    shards = [text_run / "shards" / f"ort.{i}-of-2.csv" for i in range(2)]
    for i, p in enumerate(shards):
        run_shard(eng, text_cal / "eval.npz", i, 2, p)
    gather(eng, text_cal / "eval.npz", shards, text_run / "ort.csv", text_run / "ort.json")
    return text_run


def test_planted_text_layer_ranks_first(text_sens):
    rows = read_csv(text_sens / "ort.csv")
    assert list(rows[0])[-2:] == ["kl", "top1"]  # logits columns
    assert (rows[0]["block"], rows[0]["role"]) == (TEXT_PLANT["layer"], "mlp.down_proj"), rows[:3]
    assert (rows[1]["block"], rows[1]["role"]) == (TEXT_PLANT["layer"], "mlp.up_proj"), rows[:3]
    # the next op, 5.4x below (measured): an attention A.V MatMul, INT8 in both inputs, which the
    # image prompts of the stratified evaluation split make count (hundreds of image tokens attended)
    assert rows[0]["mse"] > 4 * rows[2]["mse"], rows[:4]
    # every op in INT8 at once: above the text profile's KL target (1e-4, which is why the profile
    # below keeps ops float; measured 1.8e-4 at the positions a user reads, about the planted op's
    # alone), and still a small perturbation of a 2-layer LM (top-1 0.74), well under 1e-3
    all_int8 = json.loads((text_sens / "ort.json").read_text())["all_int8"]
    assert 1e-4 < all_int8["kl"] < 1e-3, all_int8


def test_text_profile_meets_kl_target_and_keeps_the_planted_layer_float(text_sens, text_cal):
    import onnxruntime as ort

    from vlsens.precision.int8 import ProfileSettings, build_profile

    rec = build_profile(text_sens / "engine", text_sens / "ort.csv", text_cal / "eval.npz",
                        {"fp32": text_sens / "fp32" / "embeds.onnx"}, text_sens / "profile", ProfileSettings("kl", 1e-4))
    assert rec["status"] == "met" and rec["meets_target"] and rec["measured"]["kl"] <= 1e-4
    excluded = json.loads((text_sens / "profile" / "nodes_to_exclude.json").read_text())["nodes_to_exclude"]
    assert any(f"layers.{TEXT_PLANT['layer']}/mlp/down_proj" in n for n in excluded)
    assert rec["int8_op_share"] >= 0.5
    # re-measured here, independently, at real tokens
    from vlsens.core.metrics import Metrics

    ev = Samples.load(text_cal / "eval.npz")
    q = ort.InferenceSession(str(text_sens / "profile" / "model.onnx"), providers=["CPUExecutionProvider"])
    f = ort.InferenceSession(str(text_sens / "fp32" / "embeds.onnx"), providers=["CPUExecutionProvider"])
    acc = Metrics(logits=True)
    for feed, valid in zip(ev.feeds, ev.valid):
        acc.add(q.run(None, feed)[0], f.run(None, feed)[0], valid)
    assert acc.result()["kl"] == pytest.approx(rec["measured"]["kl"], rel=1e-3, abs=1e-9)
