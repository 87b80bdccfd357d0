"""Deploy folders (onnxruntime-genai, ``type: qwen2_5_vl``): the pieces vlsens writes, checked
against transformers' own helpers, and whole folders run by onnxruntime-genai itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import TOL_FP16, TOL_FP32, run_settings


@pytest.fixture(scope="module")
def vision_config(tiny_ckpt):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(tiny_ckpt)).vision_config


def test_preamble_equals_transformers_index_helpers(vision_config, tmp_path):
    """The in-graph preamble computes what transformers' get_vision_position_ids /
    get_vision_window_index / get_vision_cu_seqlens compute, for square, wide, tall, partial-window,
    one-window and large grids (one image; a video grid with t = 2 too)."""
    from vlsens.core.onnxutil import save_with_external_data
    from vlsens.deploy.genai import folder as genai
    from vlsens.export.towers.vision_dynamic import index_inputs

    path = save_with_external_data(genai.vision_preamble(vision_config, tmp_path), tmp_path / "pre.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for t, h, w in ((1, 16, 16), (1, 18, 22), (1, 24, 32), (1, 32, 16), (1, 34, 46), (1, 2, 2), (1, 4, 4),
                    (1, 96, 96), (2, 8, 12)):
        grid = np.array([[t, h, w]], np.int64)
        got = dict(zip(genai.PREAMBLE_OUTPUTS, sess.run(None, {"image_grid_thw": grid})))
        want = index_inputs(grid, vision_config)
        for k in genai.PREAMBLE_OUTPUTS:
            assert np.array_equal(got[k], want[k]), (t, h, w, k)


def test_embedding_graph_merges_image_features_in_order(tmp_path):
    """Token rows from the table, image-token rows replaced by feature rows in row-major order
    (transformers' masked_scatter), batch of two, and with no features at all (decode steps)."""
    from vlsens.core.onnxutil import save_with_external_data
    from vlsens.export.towers.decoder import embedding_model

    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    path = save_with_external_data(embedding_model(table, image_token_id=7), tmp_path / "embedding.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 7, 7, 3], [7, 2, 7, 5]], np.int64)
    feats = rng.standard_normal((4, 8)).astype(np.float32)
    got = sess.run(None, {"input_ids": ids, "image_features": feats})[0]
    want = table[ids]
    want[ids == 7] = feats
    assert np.array_equal(got, want)
    text = np.array([[4, 5, 6]], np.int64)
    got = sess.run(None, {"input_ids": text, "image_features": np.zeros((0, 8), np.float32)})[0]
    assert np.array_equal(got, table[text][None][0])


def test_configs_name_the_graphs_and_the_checkpoints_values(tiny_ckpt):
    from vlsens.deploy.genai import folder as genai

    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    gen = json.loads((tiny_ckpt / "generation_config.json").read_text())
    g = genai.genai_config(cfg, gen)["model"]
    assert g["type"] == "qwen2_5_vl" and g["image_token_id"] == cfg["image_token_id"]
    assert {g[k]["filename"] for k in ("decoder", "embedding", "vision")} == set(genai.GRAPHS.values())
    assert g["vision"]["inputs"]["image_grid_thw"] == "image_grid_thw"  # it defaults to image_sizes
    assert g["decoder"]["num_hidden_layers"] == cfg["text_config"]["num_hidden_layers"]
    pre = json.loads((tiny_ckpt / "preprocessor_config.json").read_text())
    ops = {t["operation"]["type"]: t["operation"].get("attrs", {})
           for t in genai.processor_config(pre, cfg["model_type"])["processor"]["transforms"]}
    assert ops["Normalize"]["mean"] == pre["image_mean"] and ops["Normalize"]["qwen2_5_vl"] == 1
    assert ops["Resize"]["min_pixels"] == pre["size"]["shortest_edge"]
    assert ops["PatchImage"]["patch_size"] == pre["patch_size"]


def test_config_check_names_the_missing_graph():
    from conftest import default_config

    from vlsens.core.errors import ConfigError
    from vlsens.deploy import check_config

    check_config(default_config())
    with pytest.raises(ConfigError, match=r"int8-mixed.*vision\.dynamic\.sensitivity_variants"):
        check_config(default_config(**{"vision.dynamic.sensitivity_variants": []}))
    with pytest.raises(ConfigError, match=r"fp16.*deploy\.decoder\.variants"):
        check_config(default_config(**{"deploy.decoder.variants": ["fp32"]}))
    with pytest.raises(ConfigError, match="vision.dynamic.enabled"):
        check_config(default_config(**{"vision.dynamic.enabled": False}))
    # the int4 folders' vision graph (deploy.nbits.vision): fp16 needs the dynamic graph's fp16 variant
    fp16_vision = {"deploy.precisions": ["fp32", "int4-mixed"], "deploy.nbits.vision": "fp16",
                   "vision.dynamic.sensitivity_variants": [], "plan.vision": ["fp16", "int4"]}
    check_config(default_config(**fp16_vision))
    with pytest.raises(ConfigError, match=r"int4-mixed.*'fp16' in vision\.dynamic\.variants"):
        check_config(default_config(**fp16_vision, **{"vision.dynamic.variants": ["fp32"]}))
    with pytest.raises(ConfigError, match=r"int4-mixed.*vision\.dynamic\.sensitivity_variants"):
        check_config(default_config(**{**fp16_vision, "deploy.nbits.vision": "int8-mixed"}))


def test_vision_gate_follows_the_vision_graph():
    from conftest import default_config

    from vlsens.config import tolerance_for
    from vlsens.deploy import INT4, vision_tolerance

    cfg = default_config()
    int8 = cfg["deploy"]["int8_tolerance"]
    assert vision_tolerance(cfg, "fp32") == tolerance_for(cfg, "fp32")
    assert vision_tolerance(cfg, "fp16") == tolerance_for(cfg, "fp16")
    assert vision_tolerance(cfg, "int8-mixed") == int8
    for p in INT4:
        assert vision_tolerance(cfg, p) == int8  # deploy.nbits.vision: int8-mixed
        assert vision_tolerance(default_config(**{"deploy.nbits.vision": "fp16"}), p) == tolerance_for(cfg, "fp16")
        int4 = default_config(**{"deploy.nbits.vision": "int4"})
        assert vision_tolerance(int4, p) == int4["deploy"]["nbits"]["vision_tolerance"]


def test_int4_folders_take_the_configured_vision_graph():
    from vlsens.deploy import INT4, sources

    for p in INT4:
        assert sources(p)["vision"] == "results/{model}/profile/vision/dynamic/fp32/model.onnx"
        assert sources(p, "fp16")["vision"] == "results/{model}/vision/dynamic/fp16/model.onnx"
        assert sources(p, "fp16")["vision_record"] == "results/{model}/vision/dynamic/fp16/parity.json"
        assert sources(p, "fp32")["vision"] == "results/{model}/vision/dynamic/fp32/model.onnx"
        assert sources(p, "int4")["vision"] == "results/{model}/vision/dynamic/int4/model.onnx"
        assert sources(p, "int4")["vision_record"] == "results/{model}/vision/dynamic/int4/parity.json"
        assert "embedding" not in sources(p, "int4", "fp32")  # the decoder folder's
        assert sources(p, "int4", "int4")["embedding"] == "results/{model}/decoder/embedding-int4/embedding.onnx"
    # the other folders keep their own
    assert "embedding" not in sources("fp32", "int4", "int4")
    assert sources("fp16", "int4")["vision"] == "results/{model}/vision/dynamic/fp16/model.onnx"
    assert sources("fp16", "fp32")["vision"] == "results/{model}/vision/dynamic/fp16/model.onnx"
    assert sources("int8-mixed", "fp16")["vision"] == "results/{model}/profile/vision/dynamic/fp32/model.onnx"


# ----------------------------------------------------------------------------------------------
# Whole folders


@pytest.fixture(scope="module")
def folders(graph_builder, parity_refs, tmp_path_factory):
    """The fp32, fp16 and INT8-mixed folders of the tiny preset, from the decoder tower and the
    dynamic vision graph built like the DAG builds them (profiles at the default targets)."""
    from conftest import default_config

    from vlsens import variants
    from vlsens.deploy.build import build_folder
    from vlsens.deploy.genai.evaluate import Checks, write_eval_logits, write_vision_features
    from vlsens.precision.int8 import ProfileSettings, build_profile
    from vlsens.sensitivity.stages import gather, prepare, run_shard

    cfg = default_config()
    root = tmp_path_factory.mktemp("deploy")
    dec, vis = graph_builder("decoder"), graph_builder("vision/dynamic")
    profiles = {}
    for b, name, settings in ((dec, "decoder", cfg["text"]["profile"]), (vis, "vision", cfg["profile"])):
        if not b.folder("fp16").exists():
            variants.fp16(b.folder("fp32"), b.reference, b.folder("fp16"), TOL_FP16, 512, 65504)
        eng, work = b.root / "engine-deploy", root / name
        prepare(b.model("fp32", analysed=True), b.calib / "calib.npz", b.calib / "eval.npz", eng, run_settings(),
                logits=b.tower.logits)
        shard = work / "ort.0-of-1.csv"
        run_shard(eng, b.calib / "eval.npz", 0, 1, shard)
        gather(eng, b.calib / "eval.npz", [shard], work / "ort.csv", work / "ort.json")
        build_profile(eng, work / "ort.csv", b.calib / "eval.npz", {"fp32": b.model("fp32", analysed=True)},
                      work / "profile", ProfileSettings(settings["metric"], float(settings["target"])))
        profiles[name] = work / "profile" / "model.onnx"
    out = {}
    common = dict(checkpoint=dec.ckpt, images=parity_refs)
    out["fp32"] = root / "fp32"
    # the fp32 and fp16 folders answer 12 of the task's questions in their deploy job (answers.json)
    from vlsens.task.questions import write_split

    out["questions"] = write_split(root / "task", 0, "eval", 12)  # its questions.jsonl
    build_folder("fp32", out["fp32"], decoder=dec.model("fp32"), embedding=dec.folder("fp32") / "embedding.onnx",
                 vision=vis.model("fp32"), checks=Checks(16, TOL_FP32, questions=out["questions"]), **common)
    out["vision_features"] = root / "vision-features.npz"  # the rule vision_features
    write_vision_features(out["fp32"], dec.ckpt, parity_refs, out["vision_features"])
    out["fp32_logits"] = root / "eval-logits.npz"  # the rule eval_logits
    write_eval_logits(out["fp32"], parity_refs, out["fp32_logits"])
    out["fp16"] = root / "fp16"  # its evaluation runs the fp32 folder (no stored logits)
    build_folder("fp16", out["fp16"], decoder=dec.model("fp16"), embedding=dec.folder("fp16") / "embedding.onnx",
                 vision=vis.model("fp16"), checks=Checks(16, TOL_FP16, fp32_folder=out["fp32"],
                                                         vision_features=out["vision_features"],
                                                         questions=out["questions"]), **common)
    out["int8-mixed"] = root / "int8-mixed"
    build_folder("int8-mixed", out["int8-mixed"], decoder=profiles["decoder"],
                 embedding=dec.folder("fp32") / "embedding.onnx", vision=profiles["vision"],
                 checks=Checks(16, cfg["deploy"]["int8_tolerance"], fp32_folder=out["fp32"],
                               target=cfg["text"]["profile"], vision_features=out["vision_features"],
                               fp32_logits=out["fp32_logits"]), **common)
    return out


def _cases(parity_refs, tmp_path):
    from vlsens.deploy.genai.evaluate import eval_cases

    return eval_cases(parity_refs, tmp_path)


def _chat(processor, case):
    content = [{"type": "image"} for _ in case["images"]] + [{"type": "text", "text": case["prompt"]}]
    return processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def test_vision_parity_reads_transformers_features_computed_once(folders, tiny_ckpt, parity_refs, tmp_path):
    """The folders' vision parity reference (transformers' image features) is computed once, on the
    fp32 folder's preprocessing: a folder's parity read from it equals the one computed in PyTorch
    image by image; an image whose pixel values differ from the stored ones is recomputed, not
    compared with another image's features."""
    import numpy as np

    from vlsens.core.fsutil import savez
    from vlsens.deploy.genai.evaluate import vision_parity

    for name in ("fp16", "int8-mixed"):  # the folders the fixture built read the stored features
        rows = json.loads((folders[name] / "parity.json").read_text())["images"]
        assert rows and all(r["stored_reference"] for r in rows), rows
    cases = _cases(parity_refs, tmp_path / "cases")
    computed = vision_parity(folders["fp16"], tiny_ckpt, cases, None)
    stored = vision_parity(folders["fp16"], tiny_ckpt, cases, None, features=folders["vision_features"])
    assert len(computed["images"]) == 2 and not any(r["stored_reference"] for r in computed["images"])
    assert all(r["stored_reference"] for r in stored["images"]) and "reference_file" in stored
    for a, b in zip(computed["images"], stored["images"], strict=True):
        assert a["image"] == b["image"] and a["grid_thw"] == b["grid_thw"]
        assert b["cosine"] == pytest.approx(a["cosine"], abs=1e-9)
        assert b["max_rel_error"] == pytest.approx(a["max_rel_error"], rel=1e-6, abs=1e-9)
        assert a["cosine"] < 1.0  # fp16 weights: a measured difference, not the graph against itself
    with np.load(folders["vision_features"], allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["pixels_sha256"] = np.array(["0" * 64] * len(arrays["pixels_sha256"]))  # other preprocessing
    arrays["features_0"], arrays["features_1"] = arrays["features_1"], arrays["features_0"]
    savez(tmp_path / "other.npz", arrays)
    other = vision_parity(folders["fp16"], tiny_ckpt, cases, None, features=tmp_path / "other.npz")
    assert not any(r["stored_reference"] for r in other["images"])
    assert [r["cosine"] for r in other["images"]] == pytest.approx([r["cosine"] for r in computed["images"]], abs=1e-9)


def test_every_folder_runs_the_fp32_folders_chat_text(folders, tiny_ckpt, parity_refs, tmp_path):
    """The fp32 folder keeps the chat text (transformers' template) each case was generated from;
    the other folders run exactly those texts, read from its record (no processor of their own),
    and the runtime's own template gives the same text on this checkpoint."""
    from vlsens.deploy.genai.runtime import Chat

    fp32 = json.loads((folders["fp32"] / "eval.json").read_text())
    texts = {r["case"]: r["text"] for r in fp32["cases"]}
    assert set(texts) == {"text", "one-image", "two-images"}
    assert texts["two-images"].count("<|image_pad|>") == 2 and "<|image_pad|>" not in texts["text"]
    chat = Chat(folders["fp16"], prepack=False)
    for case in _cases(parity_refs, tmp_path):
        assert chat.prompt(case["prompt"], len(case["images"])) == texts[case["name"]]
    chat.close()


def test_fp32_folder_generates_what_transformers_generates(folders, tiny_ckpt, parity_refs, tmp_path):
    """onnxruntime-genai loads the folder and its 16 greedy tokens equal transformers' generate
    for a text-only prompt, one image, and two images of different sizes (each image
    preprocessed by the runtime itself, from the folder's processor_config.json)."""
    import onnxruntime_genai as og
    import torch
    from PIL import Image

    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    cases = _cases(parity_refs, tmp_path)
    assert [len(c["images"]) for c in cases] == [0, 1, 2]
    assert cases[2]["images"][0]["size"] != cases[2]["images"][1]["size"]
    model = load_model(tiny_ckpt, attn_implementation="eager")
    processor = load_processor(tiny_ckpt)
    om = og.Model(str(folders["fp32"]))
    op = om.create_multimodal_processor()
    for case in cases:
        text = _chat(processor, case)
        images = [Image.open(f["path"]).convert("RGB") for f in case["images"]] or None
        inputs = processor(text=[text], images=images, return_tensors="pt")
        with torch.no_grad():
            want = model.generate(**inputs, max_new_tokens=16, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        params = og.GeneratorParams(om)
        params.set_search_options(do_sample=False)
        gen = og.Generator(om, params)
        gen.set_inputs(op(text, images=og.Images.open(*[f["path"] for f in case["images"]]) if case["images"] else None))
        got = []
        while not gen.is_done() and len(got) < 16:
            gen.generate_next_token()
            got.append(int(gen.get_next_tokens()[0]))
        assert got == want.tolist(), case["name"]
        assert len(got) == 16, case["name"]  # no early end-of-sequence: the comparison covers 16 steps


def test_every_folder_is_complete_and_recorded(folders):
    from vlsens.core.artifacts import verify

    not_folders = ("vision_features", "fp32_logits", "questions")
    for precision, folder in ((k, v) for k, v in folders.items() if k not in not_folders):
        names = {p.name for p in folder.iterdir()}
        assert {"vision.onnx", "embedding.onnx", "decoder.onnx", "genai_config.json", "processor_config.json",
                "tokenizer.json", "chat_template.jinja", "parity.json", "eval.json"} <= names, precision
        for g in ("vision.onnx", "embedding.onnx", "decoder.onnx"):
            assert f"{g}.data" in names and verify(folder / g) == folder / g  # hashed in parity.json
        rec = json.loads((folder / "parity.json").read_text())
        assert len(rec["images"]) == 2 and rec["passed"] is True  # every folder is gated
        assert all(r["cosine"] >= rec["tolerance"]["min_cosine"] for r in rec["images"])
    fp32 = json.loads((folders["fp32"] / "eval.json").read_text())
    assert fp32["identical"] and [c["case"] for c in fp32["cases"]] == ["text", "one-image", "two-images"]


def test_fp16_and_int8_folders_are_measured_against_fp32_through_the_runtime(folders):
    """eval.json: teacher-forced KL and top-1 agreement against the fp32 folder, through
    onnxruntime-genai; the INT8 folder meets the text profile's target end to end."""
    for precision in ("fp16", "int8-mixed"):
        ev = json.loads((folders[precision] / "eval.json").read_text())
        assert 0 < ev["mean_kl"] < 1e-2 and 0.5 <= ev["top1_agreement"] <= 1.0, ev
        assert len(ev["cases"]) == 3 and all(len(c["tokens"]) == 16 for c in ev["cases"])
    ev = json.loads((folders["int8-mixed"] / "eval.json").read_text())
    assert ev["target"]["metric"] == "kl" and ev["target"]["met"] is True, ev["target"]
    # the INT8 folder really is INT8: its decoder and vision graphs hold quantized weights
    import onnx

    for g in ("decoder.onnx", "vision.onnx"):
        m = onnx.load(str(folders["int8-mixed"] / g), load_external_data=False)
        assert any(n.op_type == "DequantizeLinear" for n in m.graph.node), g


def test_a_folder_of_int4_embedding_and_vision_runs_in_onnxruntime_genai(folders, graph_builder, parity_refs,
                                                                         tmp_path):
    """GatherBlockQuantized (table) and MatMulNBits (vision Linears) behind onnxruntime-genai: the
    folder loads, its vision graph meets deploy.nbits.vision_tolerance against transformers' float
    features, and it generates close to the fp32 folder (the fp32 decoder, so only those two
    graphs differ)."""
    import json

    from conftest import default_config

    from vlsens.deploy.build import build_folder
    from vlsens.deploy.genai.evaluate import Checks
    from vlsens.precision.weight_only import embedding_folder, vision_folder
    from vlsens.quantize.nbits import NBitsSettings

    cfg = default_config(**{"deploy.nbits.vision": "int4"})
    dec, vis = graph_builder("decoder"), graph_builder("vision/dynamic")
    token = int(json.loads((dec.ckpt / "config.json").read_text())["image_token_id"])
    embedding_folder(dec.folder("fp32"), dec.reference, tmp_path / "emb", 32, True, token, TOL_FP32)
    vision_folder(dec.ckpt, vis.folder("fp32"), vis.reference, tmp_path / "vis", NBitsSettings(algorithm="rtn"),
                  cfg["deploy"]["nbits"]["tolerance"], TOL_FP32)
    rec = build_folder("int4-rtn", tmp_path / "folder", dec.ckpt, dec.model("fp32"), tmp_path / "emb" / "embedding.onnx",
                       tmp_path / "vis" / "model.onnx", parity_refs,
                       Checks(16, cfg["deploy"]["nbits"]["vision_tolerance"], fp32_folder=folders["fp32"]))
    parity = json.loads((tmp_path / "folder" / "parity.json").read_text())
    assert parity["passed"] and min(r["cosine"] for r in parity["images"]) < 1 - 1e-6  # INT4 vision, as shipped
    assert 0 < rec["mean_kl"] < 0.05 and rec["top1_agreement"] > 0.7


def test_a_folder_that_misses_its_check_is_not_written(folders, graph_builder, parity_refs, tmp_path, monkeypatch):
    """fp32 tokens that differ from transformers' fail the job and leave no folder behind."""
    from vlsens.core.errors import VlsensError
    from vlsens.deploy import build
    from vlsens.deploy.build import build_folder
    from vlsens.deploy.genai.evaluate import Checks

    real = build.transformers_generate  # the job generates transformers' tokens before loading the folder
    monkeypatch.setattr(build, "transformers_generate",
                        lambda *a, **k: [[t + 1 for t in toks] for toks in real(*a, **k)])
    dec, vis = graph_builder("decoder"), graph_builder("vision/dynamic")
    out = tmp_path / "fp32"
    with pytest.raises(VlsensError, match="differ from transformers"):
        build_folder("fp32", out, dec.ckpt, dec.model("fp32"), dec.folder("fp32") / "embedding.onnx",
                     vis.model("fp32"), parity_refs, Checks(4, TOL_FP32))
    assert not out.exists() and not list(tmp_path.glob(".fp32*"))


def test_chat_runs_a_folder_like_transformers(folders, tiny_ckpt, parity_refs, tmp_path):
    """vlsens.deploy.genai.runtime.Chat (the convenience layer over onnxruntime-genai): the folder's own chat
    template, images as paths or PIL images, the same greedy tokens as transformers."""
    import torch
    from PIL import Image

    from vlsens.deploy.genai.runtime import Chat
    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    case = _cases(parity_refs, tmp_path)[1]
    model, processor = load_model(tiny_ckpt, attn_implementation="eager"), load_processor(tiny_ckpt)
    image = Image.open(case["images"][0]["path"]).convert("RGB")
    inputs = processor(text=[_chat(processor, case)], images=[image], return_tensors="pt")
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=12, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    chat = Chat(folders["fp32"])
    assert chat.prompt(case["prompt"], 1) == _chat(processor, case)
    assert chat.tokens(case["prompt"], [case["images"][0]["path"]], max_new_tokens=12) == want
    assert chat.tokens(case["prompt"], [image], max_new_tokens=12) == want
    # the answer alone, decoded as transformers decodes it: random weights give invalid UTF-8 pieces,
    # where onnxruntime-genai's own decode stops (a test of that fact keeps the reason checked)
    answer = chat(case["prompt"], [image], max_new_tokens=12)
    assert answer == processor.tokenizer.decode(want, skip_special_tokens=True)
    long = chat.tokens(case["prompt"], [image], max_new_tokens=64)
    want_text = processor.tokenizer.decode(long, skip_special_tokens=True)
    assert chat.decode(long) == want_text and "\ufffd" in want_text
    assert len(chat.tokenizer.decode(long)) < len(want_text)


def test_a_generator_holds_the_prompt_and_its_new_tokens_and_answers_the_same(folders, parity_refs, tmp_path):
    """Chat sizes onnxruntime-genai's KV cache to the prompt (every image's tokens in place) and
    the tokens to come (at most the folder's own ``max_length``), not to its context length: the
    same greedy tokens and the same logits, bit for bit, as at the folder's length; and the runtime's memory follows
    that length (a folder whose ``max_length`` is 2 M positions, 1 GB of cache at the tiny
    decoder's 512 bytes a position: a generator at the folder's length raises the process's peak
    address space by the whole cache, 996 MB measured, a fitted one by 26 MB). The address space
    is what the cache reserves; how much of it becomes resident depends on the machine's pages
    (0.17-1.0 GB of this 1 GB were seen), so resident memory is not what is asserted."""
    import subprocess
    import sys

    from conftest import REPO

    from vlsens.deploy.genai.runtime import Chat

    cfg = json.loads((folders["fp32"] / "genai_config.json").read_text())
    case = _cases(parity_refs, tmp_path)[1]
    paths = [case["images"][0]["path"]]
    chat = Chat(folders["fp32"], prepack=False)
    text = chat.prompt(case["prompt"], 1)
    positions = int(chat.inputs(text, paths)["input_ids"].shape()[-1])

    seen = []

    class Params:  # onnxruntime-genai's GeneratorParams, the search options it was given recorded
        def __init__(self, model):
            self.real = real_og.GeneratorParams(model)

        def set_search_options(self, **options):
            seen.append(options)
            self.real.set_search_options(**options)

    class Og:
        GeneratorParams = Params

        def __getattr__(self, name):
            return getattr(real_og, name)

        @staticmethod
        def Generator(model, params):  # noqa: N802 (onnxruntime-genai's name)
            return real_og.Generator(model, params.real)

    real_og = chat.og
    chat.og = Og()
    tokens = chat.generate(text, paths, 6)
    logits = chat.forced_logits(text, paths, tokens)
    chat.generate(text, paths, 10 * cfg["search"]["max_length"])  # more than the folder holds: its own length
    assert [o["max_length"] for o in seen] == [positions + 6, positions + len(tokens), cfg["search"]["max_length"]]
    assert chat.max_length == cfg["search"]["max_length"] == cfg["model"]["context_length"] > positions + 6
    chat.og = real_og
    full = chat._generator(text, paths, 6, max_length=cfg["search"]["max_length"])
    want = []
    while not full.is_done() and len(want) < 6:
        full.generate_next_token()
        want.append(int(full.get_next_tokens()[0]))
    assert tokens == want and len(tokens) == 6
    gen = chat._generator(text, paths, len(tokens), max_length=cfg["search"]["max_length"])
    old = [np.asarray(gen.get_logits(), np.float64).reshape(-1)]
    for t in tokens[:-1]:
        gen.append_tokens(np.array([[t]], dtype=np.int32))
        old.append(np.asarray(gen.get_logits(), np.float64).reshape(-1))
    assert np.array_equal(logits, np.stack(old))
    chat.close()

    big = tmp_path / "long-context"
    big.mkdir()
    for f in folders["fp32"].iterdir():
        if f.is_file() and f.name != "genai_config.json":
            (big / f.name).symlink_to(f.resolve())
    cfg["model"]["context_length"] = cfg["search"]["max_length"] = 2_000_000
    (big / "genai_config.json").write_text(json.dumps(cfg))
    code = f"""
from vlsens.deploy.genai.runtime import Chat
def peak():  # the process's peak address space, MiB
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmPeak:")) / 1024
chat = Chat({str(big)!r}, prepack=False, verify=False)
text = chat.prompt({case["prompt"]!r}, 1)
chat.generate(text, {paths!r}, 2)
before = peak()
chat.generate(text, {paths!r}, 2, **({{}} if {{mode}} == "fitted" else {{"max_length": 2_000_000}}))
print(peak() - before)
"""
    dec = cfg["model"]["decoder"]
    cache = 2_000_000 * dec["num_hidden_layers"] * 2 * dec["num_key_value_heads"] * dec["head_size"] * 4 / 2**20
    grown = {}
    for mode in ("fitted", "folder"):
        r = subprocess.run([sys.executable, "-c", code.replace("{mode}", repr(mode))], capture_output=True,
                           text=True, timeout=300, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
        grown[mode] = float(r.stdout.split()[-1])
    assert grown["fitted"] < 0.1 * cache and grown["folder"] > 0.9 * cache, (grown, cache)  # MiB


def test_a_folders_evaluation_reads_the_fp32_logits_computed_once(folders, tiny_ckpt, parity_refs, tmp_path,
                                                                   monkeypatch):
    """The fp32 folder's logits on the evaluation cases are computed once (the rule eval_logits):
    a lower precision's evaluation that reads them gives the KL and top-1 per case, exactly, of
    the same evaluation running the fp32 folder, without opening the fp32 folder; a case stored
    for other tokens, or a store written for another fp32 folder, is run again, with the same
    result."""
    from vlsens.core.fsutil import open_npz, savez
    from vlsens.deploy.genai import evaluate as ev

    fp32_eval = json.loads((folders["fp32"] / "eval.json").read_text())
    opened = []

    class Counted(ev.Chat):
        def __init__(self, folder, *args, **kwargs):
            opened.append(Path(folder).name)
            super().__init__(folder, *args, **kwargs)

    monkeypatch.setattr(ev, "Chat", Counted)

    def run(logits):
        opened.clear()
        checks = ev.Checks(16, None, fp32_folder=folders["fp32"], fp32_logits=logits)
        rec = ev.evaluate(folders["fp16"], "fp16", tiny_ckpt, ev.eval_cases(parity_refs, tmp_path / "cases"), checks,
                          fp32_eval)
        return {r["case"]: (r["mean_kl"], r["max_kl"], r["top1_agreement"]) for r in rec["cases"]}, rec, list(opened)

    want, rec, seen = run(None)
    assert "fp32_logits" not in rec and seen == ["fp16", "fp32"] and want["two-images"][0] > 0, (want, seen)
    got, rec, seen = run(folders["fp32_logits"])
    assert got == want
    assert rec["fp32_logits"]["stored"] == ["text", "one-image", "two-images"] and not rec["fp32_logits"]["computed"]
    assert seen == ["fp16"], seen  # the fp32 folder was not run
    with open_npz(folders["fp32_logits"]) as z:
        arrays = {k: z[k] for k in z.files}
    index = json.loads(str(arrays["__index__"][()]))
    key = json.loads(index["cases"][1]["key"])
    index["cases"][1]["key"] = json.dumps({**key, "tokens": key["tokens"][:-1]})  # stored for other tokens
    savez(tmp_path / "stale.npz", {**arrays, "__index__": np.array(json.dumps(index))})
    got, rec, seen = run(tmp_path / "stale.npz")
    assert got == want and rec["fp32_logits"]["computed"] == ["one-image"] and seen == ["fp16", "fp32"], \
        (rec["fp32_logits"], seen)
    index = json.loads(str(arrays["__index__"][()]))
    savez(tmp_path / "other.npz", {**arrays, "__index__": np.array(json.dumps({**index, "fp32_eval_sha256": "0" * 64}))})
    got, rec, seen = run(tmp_path / "other.npz")
    assert got == want and rec["fp32_logits"]["stored"] == [] and seen == ["fp16", "fp32"], (rec["fp32_logits"], seen)


def test_chat_refuses_a_bad_image_with_an_error_naming_it(folders, parity_refs, tmp_path):
    """A text file named .png ends a process that hands it to onnxruntime-genai, a truncated JPEG
    hangs it: Chat decodes every image file with the pipeline's reader first and raises an
    ImageError naming the file, which the caller catches and goes on (a good image right after).
    Run in a child process, so a regression cannot take the test session down with it."""
    import subprocess
    import sys

    from conftest import REPO
    from PIL import Image

    (tmp_path / "notes.png").write_text("not an image at all\n")
    jpg = tmp_path / "photo.jpg"
    Image.open(parity_refs[0].path).convert("RGB").save(jpg, quality=90)
    (tmp_path / "cut.jpg").write_bytes(jpg.read_bytes()[: jpg.stat().st_size // 2])
    code = f"""
from vlsens.core.errors import ImageError
from vlsens.deploy.genai.runtime import Chat
chat = Chat({str(folders["fp32"])!r}, prepack=False)
for name in ("notes.png", "cut.jpg", "missing.png"):
    try:
        chat({"Describe."!r}, [{str(tmp_path)!r} + "/" + name], max_new_tokens=2)
        print("accepted", name)
    except ImageError as e:
        print("refused", name, "|", e)
print("good", len(chat.tokens("Describe.", [{str(jpg)!r}], max_new_tokens=2)) > 0)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert [ln.split(" |")[0] for ln in lines] == ["refused notes.png", "refused cut.jpg", "refused missing.png",
                                                    "good True"], r.stdout
    for ln, name in zip(lines, ("notes.png", "cut.jpg", "missing.png")):  # one line each (above), naming the file
        assert f"{tmp_path}/{name}" in ln


def test_the_runtimes_refusals_reach_the_caller_as_vlsens_errors(folders, parity_refs, tmp_path):
    """onnxruntime-genai's RuntimeErrors on a prompt (an image whose sides are too far apart, more
    images than placeholders, a prompt past the context length) come out as vlsens' errors saying
    what is wrong and what would do."""
    import numpy as np
    from PIL import Image

    from vlsens.core.errors import ImageError, VlsensError
    from vlsens.deploy.genai.runtime import Chat

    strip = tmp_path / "strip.png"
    Image.fromarray(np.zeros((1, 3000, 3), np.uint8)).save(strip)
    image = str(parity_refs[0].path)
    chat = Chat(folders["fp32"], prepack=False)
    try:
        with pytest.raises(ImageError, match=f"{strip}: an image's long side is over 200 times"):
            chat("Describe.", [strip], max_new_tokens=2)
        with pytest.raises(VlsensError, match="holds 1 image placeholder.* but 2 image"):
            chat.generate(chat.prompt("Describe.", 1), [image, image], 2)
        with pytest.raises(VlsensError, match=f"past .*context length of {chat.max_length}"):
            chat.generate(chat.prompt("word " * (chat.max_length + 10)), [], 2)
        assert len(chat.tokens("Describe.", [image], max_new_tokens=2)) > 0  # the runtime goes on
    finally:
        chat.close()


def test_chat_reads_every_format_the_pipeline_reads_as_the_pipeline_reads_it(folders, parity_refs, tmp_path):
    """onnxruntime-genai's decoder reads only RGB / grayscale PNG and JPEG (a TIFF or WebP fails
    with "Not a JPEG file", a CMYK JPEG with "Unsupported JPEG color space", naming no file), and a
    decompression bomb reached PIL's own error: Chat hands it the pipeline's decoded pixels, so the
    same pixels in PNG, TIFF, WebP (lossless) or BMP give the same tokens, a CMYK JPEG is answered,
    and a bomb is an ImageError naming the file."""
    import io
    import zlib

    from PIL import Image

    from vlsens.core.errors import ImageError
    from vlsens.deploy.genai.runtime import Chat

    rgb = Image.open(parity_refs[0].path).convert("RGB")
    files = {}
    for ext, kw in (("png", {}), ("tiff", {}), ("webp", {"lossless": True}), ("bmp", {})):
        rgb.save(files.setdefault(ext, tmp_path / f"photo.{ext}"), **kw)
    rgb.convert("CMYK").save(tmp_path / "cmyk.jpg")
    buf = io.BytesIO()
    Image.new("L", (40000, 1)).save(buf, format="PNG")
    raw = bytearray(buf.getvalue())
    raw[20:24] = (40000).to_bytes(4, "big")  # the header claims 40000 x 40000 pixels
    raw[29:33] = zlib.crc32(bytes(raw[12:29])).to_bytes(4, "big")
    (tmp_path / "bomb.png").write_bytes(bytes(raw))
    chat = Chat(folders["fp32"], prepack=False)
    tokens = {ext: chat.tokens("Describe.", [f], max_new_tokens=4) for ext, f in files.items()}
    assert len(set(map(tuple, tokens.values()))) == 1, tokens
    assert tokens["png"] == chat.tokens("Describe.", [rgb], max_new_tokens=4)  # a PIL image: the same pixels
    assert len(chat.tokens("Describe.", [tmp_path / "cmyk.jpg"], max_new_tokens=2)) == 2
    with pytest.raises(ImageError, match=r"bomb\.png.*exceeds limit"):
        chat.tokens("Describe.", [tmp_path / "bomb.png"], max_new_tokens=2)
    chat.close()


def test_chat_checks_a_folder_against_its_record_before_loading_it(folders, tmp_path):
    """A folder whose embedding table was zeroed (same size) answered '' with no error: Chat now
    checks a copied folder's every file against the sizes and SHA-256 its eval.json lists, and
    names the file; ``verify=False`` loads it anyway."""
    import json
    import shutil

    from vlsens.core.errors import VlsensError
    from vlsens.deploy.genai.runtime import Chat, verify_folder

    copy = tmp_path / "fp16"
    shutil.copytree(folders["fp16"], copy)
    listed = json.loads((copy / "eval.json").read_text())["files"]
    assert set(listed) - {"rule"} == {p.name for p in copy.iterdir()} - {"eval.json"}  # configs and tokenizer too
    assert verify_folder(copy) == "eval.json"
    config = copy / "genai_config.json"
    original = config.read_text()
    config.write_text(original.replace('"context_length"', '"context_length" ', 1))  # same meaning, other bytes
    with pytest.raises(VlsensError, match=r"genai_config.json: changed since vlsens wrote it"):
        verify_folder(copy)
    config.write_text(original)
    data = copy / "embedding.onnx.data"
    data.write_bytes(bytes(data.stat().st_size))  # zeroed, same size
    with pytest.raises(VlsensError, match=r"embedding.onnx.data: changed since vlsens wrote it"):
        Chat(copy, prepack=False)
    Chat(copy, prepack=False, verify=False).close()
    (copy / "decoder.onnx.data").write_bytes(b"cut")
    with pytest.raises(VlsensError, match=r"decoder.onnx.data: truncated since vlsens wrote it"):
        verify_folder(copy)


def test_a_folder_ships_its_model_card_and_the_checkpoints_license(folders, tmp_path):
    """README.md in Hugging Face's card format (the front matter huggingface_hub reads), with what
    the folder was built from, its measured numbers (its own eval.json's) and how to run it; the
    files an upload of the folder takes are the files its record lists, none hidden. A checkpoint
    with a license in its card and a LICENSE file passes both on."""
    from huggingface_hub import ModelCard

    from vlsens.deploy.card import write_card

    folder = folders["fp16"]
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == "other" and card.data.library_name == "onnxruntime-genai"
    ev = json.loads((folder / "eval.json").read_text())
    for c in ev["cases"]:
        assert f"| {c['case']} | {len(c['images'])} | {c['mean_kl']:.3g} | {c['top1_agreement']:.2f} |" in card.text
    assert 'Chat("fp16")' in card.text and 'og.Model("fp16")' in card.text
    upload = {p.name for p in folder.rglob("*") if p.is_file()}  # what upload_folder takes (no ignore patterns)
    assert upload == (set(ev["files"]) - {"rule"}) | {"eval.json"} and not any(n.startswith(".") for n in upload)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "README.md").write_text("---\nlicense: apache-2.0\nbase_model: x\n---\n# a model\n")
    (ckpt / "LICENSE").write_text("Apache License 2.0 ...")
    staged = tmp_path / "staged"
    staged.mkdir()
    write_card(staged, "int4-mixed", ev, {"passed": True, "sources": {}}, ckpt, tmp_path / "results" / "m", plan=True)
    card = ModelCard.load(staged / "README.md")
    assert card.data.license == "apache-2.0" and (staged / "LICENSE").read_text().startswith("Apache")
    assert "`plan.yaml` beside this card" in card.text and "(`LICENSE`, the checkpoint's own)" in card.text


def test_a_folder_answers_the_task_in_its_deploy_job_and_its_card_opens_on_the_accuracy(folders):
    """With the task's questions, the deploy job answers them with the runtime it checked the folder
    with: answers.json ships in the folder (listed in eval.json, valid against its schema, the same
    answers a fresh Chat gives), and the model card's first section is its accuracy with the paired
    drop against the fp32 folder's answers."""
    from vlsens.core.records import errors, schema_name
    from vlsens.deploy.accuracy import read, table
    from vlsens.deploy.genai.answers import FILE, answer_folder

    fp16 = folders["fp16"]
    got = json.loads((fp16 / FILE).read_text())
    assert schema_name(fp16 / FILE) == "deploy_answers" and errors(fp16 / FILE) == []
    assert got["folder"] == "fp16" and got["count"] == 12 and len(got["answers"]) == 12
    assert FILE in json.loads((fp16 / "eval.json").read_text())["files"]
    again = answer_folder(fp16, folders["questions"], "fp16")
    assert again["answers"] == got["answers"] and again["correct"] == got["correct"]
    row = table(read({"fp32": folders["fp32"], "fp16": fp16}))["rows"]["fp16"]
    card = (fp16 / "README.md").read_text()
    assert card.index("## Task accuracy") < card.index("## What is in it")
    acc, d = row["accuracy"], row["vs_fp32"]["all"]
    assert (f"| all ({acc['questions']}) | {100 * acc['accuracy']:.1f} [{100 * acc['low']:.1f}, {100 * acc['high']:.1f}] | "
            f"{100 * d['difference']:+.1f} [") in card
    fp32_card = (folders["fp32"] / "README.md").read_text()
    assert "## Task accuracy" in fp32_card and "against fp32" not in fp32_card.split("## What is in it")[0]
    assert not (folders["int8-mixed"] / FILE).exists()  # no questions: no answers, no section


@pytest.mark.parametrize("provider", ["cuda", "dml"])
def test_a_folder_for_another_provider_has_the_genai_config_the_builder_writes(provider, folders, graph_builder,
                                                                                 parity_refs, tmp_path):
    """deploy.provider: the builder's own genai_config for that provider, on a decoder of the same
    kind (its fp16 build: GroupQueryAttention, as every vlsens decoder), has the session options
    and cache sharing the folder gets; the folder is checked on this machine's CPU (built and
    gated here), and Chat names the provider when this onnxruntime-genai cannot load it."""
    import subprocess
    import sys

    import onnxruntime_genai as og

    from vlsens.core.errors import VlsensError
    from vlsens.deploy.build import build_folder
    from vlsens.deploy.genai.evaluate import Checks
    from vlsens.deploy.genai.runtime import Chat
    from vlsens.report.recommend import provider as folder_provider

    dec = graph_builder("decoder")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(dec.ckpt), "-o", str(tmp_path / "b"),
           "-p", "fp16", "-e", provider, "-c", str(tmp_path / "cache"), "--extra_options", "exclude_embeds=true"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    theirs = json.loads((tmp_path / "b" / "genai_config.json").read_text())
    vis = graph_builder("vision/dynamic")
    out = tmp_path / provider
    build_folder("fp16", out, dec.ckpt, dec.model("fp16"), dec.folder("fp16") / "embedding.onnx", vis.model("fp16"),
                 parity_refs, Checks(16, TOL_FP16, fp32_folder=folders["fp32"], vision_features=folders["vision_features"],
                                   provider=provider))
    ours = json.loads((out / "genai_config.json").read_text())
    for part in ("decoder", "vision", "embedding"):
        assert ours["model"][part]["session_options"] == theirs["model"]["decoder"]["session_options"], part
    assert ours["search"]["past_present_share_buffer"] == theirs["search"]["past_present_share_buffer"]
    assert folder_provider(out) == provider
    ev = json.loads((out / "eval.json").read_text())
    assert ev["mean_kl"] < 1e-6  # gated and measured here, on the CPU
    if not getattr(og, f"is_{provider}_available")():
        with pytest.raises(VlsensError, match="written for another execution provider"):
            Chat(out)
    chat = Chat(out, provider="cpu")
    assert chat.tokens("Hello", max_new_tokens=4) == Chat(folders["fp16"]).tokens("Hello", max_new_tokens=4)


def test_a_copied_folder_is_hashed_once_then_checked_by_stat_key(folders, tmp_path, monkeypatch):
    """Loading a copied folder hashed every file on every load (about 1 s per GB): each file's
    hash is now kept in the user's cache by (size, mtime, ctime, inode), so the second check reads
    nothing, and an edit that puts the mtime back is still found (its ctime moved)."""
    import os
    import shutil
    from pathlib import Path

    import vlsens.data.inputs as inputs
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.genai.runtime import verify_folder

    monkeypatch.setenv("VLSENS_CACHE_DIR", str(tmp_path / "cache"))
    hashed = []
    real = inputs.file_sha256
    monkeypatch.setattr(inputs, "file_sha256", lambda p: hashed.append(Path(p).name) or real(p))
    copy = tmp_path / "fp16"
    shutil.copytree(folders["fp16"], copy)
    assert verify_folder(copy) == "eval.json"
    assert "embedding.onnx.data" in hashed and (tmp_path / "cache" / "sha256-cache.json").is_file()
    hashed.clear()
    assert verify_folder(copy) == "eval.json" and hashed == []
    data = copy / "embedding.onnx.data"
    st = data.stat()
    data.write_bytes(bytes(st.st_size))  # zeroed, same size, mtime put back
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(VlsensError, match=r"embedding.onnx.data: changed since vlsens wrote it"):
        verify_folder(copy)
    assert hashed == ["embedding.onnx.data"]
    monkeypatch.setenv("VLSENS_CACHE_DIR", "/proc/no-cache-here")  # a cache that cannot be written costs time only
    shutil.copy2(folders["fp16"] / "embedding.onnx.data", data)
    assert verify_folder(copy) == "eval.json"


def test_a_changed_fp32_folder_fails_the_folders_measured_against_it(folders, graph_builder, parity_refs, tmp_path):
    import shutil

    from vlsens.core.errors import ArtifactError
    from vlsens.deploy.build import build_folder
    from vlsens.deploy.genai.evaluate import Checks

    base = tmp_path / "fp32"
    shutil.copytree(folders["fp32"], base)
    data = base / "decoder.onnx.data"
    data.write_bytes(data.read_bytes()[:-16])
    dec, vis = graph_builder("decoder"), graph_builder("vision/dynamic")
    out = tmp_path / "fp16"
    with pytest.raises(ArtifactError, match=r"decoder\.onnx\.data"):
        build_folder("fp16", out, dec.ckpt, dec.model("fp16"), dec.folder("fp16") / "embedding.onnx",
                     vis.model("fp16"), parity_refs, Checks(4, TOL_FP16, fp32_folder=base))
    assert not out.exists()


def test_evaluation_cases_have_two_sizes_from_one_image(parity_refs, tmp_path):
    from vlsens.deploy.genai.evaluate import eval_cases

    for refs in (parity_refs[:1], [parity_refs[0], parity_refs[0]]):
        cases = eval_cases(refs, tmp_path)
        sizes = [f["size"] for f in cases[2]["images"]]
        assert len(sizes) == 2 and sizes[0] != sizes[1] and sizes[1][1] == sizes[0][1] * 2 // 3


def test_chat_on_a_path_that_is_no_deploy_folder_is_one_error_naming_it(tmp_path):
    """onnxruntime-genai raised 'Error opening <path>/genai_config.json' (a RuntimeError, a
    traceback) for a missing folder and appended genai_config.json to a file's path."""
    from vlsens.core.errors import VlsensError
    from vlsens.deploy.genai.runtime import Chat

    (tmp_path / "file.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    for path, says in ((tmp_path / "nope", "no such folder"), (tmp_path / "file.json", "not a folder"),
                       (tmp_path / "empty", "no genai_config.json in it")):
        with pytest.raises(VlsensError, match=says) as e:
            Chat(path)
        assert str(path) in str(e.value)


def test_a_folder_reuses_the_fp32_folders_preamble_node_for_node(folders, graph_builder, vision_config, tmp_path):
    """Every folder but fp32 takes its vision preamble from the fp32 folder's vision.onnx (no torch
    export, no transformers config in the job): the same nodes and values as the one exported from
    the config, the same features; another opset is refused."""
    import onnx

    from vlsens.core.errors import VlsensError
    from vlsens.deploy.genai import folder as genai

    src = graph_builder("vision/dynamic").model("fp32")
    fp32_vision = folders["fp32"] / genai.GRAPHS["vision"]
    fresh = genai.wrap_vision(src, tmp_path / "fresh" / "vision.onnx", vision_config, tmp_path / "w")
    reused = genai.wrap_vision(src, tmp_path / "reused" / "vision.onnx", None, tmp_path / "w2", fp32_vision)
    a, b = (onnx.load(str(p), load_external_data=False) for p in (fresh, reused))
    assert [(n.name, n.op_type, list(n.input), list(n.output)) for n in a.graph.node] == \
        [(n.name, n.op_type, list(n.input), list(n.output)) for n in b.graph.node]
    grid = np.array([[1, 16, 12]], np.int64)
    pixels = np.random.default_rng(0).standard_normal((16 * 12, 1176)).astype(np.float32)
    run = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
        None, {"pixel_values": pixels, "image_grid_thw": grid})[0] for p in (fresh, reused)]
    assert np.array_equal(run[0], run[1])
    with pytest.raises(VlsensError, match="opset"):
        genai.preamble_of(fp32_vision, 17)
    with pytest.raises(VlsensError, match="no preamble"):
        genai.preamble_of(src, 19)
