"""The tiny preset is a complete checkpoint; loading is safetensors-only."""

import hashlib
import json

import pytest
import torch

from vlsens.core.errors import CheckpointError
from vlsens.model.checkpoint import check_checkpoint_dir
from vlsens.model.loading import load_model
from vlsens.model.presets.build import build_tiny_checkpoint, make_tiny_model
from vlsens.model.processor import load_processor


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_tiny_checkpoint_is_complete(tiny_ckpt):
    names = {p.name for p in tiny_ckpt.iterdir()}
    for required in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "preprocessor_config.json", "generation_config.json"):
        assert required in names, f"{required} missing from {sorted(names)}"
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_vl"
    v = cfg["vision_config"]
    assert v["depth"] >= 4
    full = set(v["fullatt_block_indexes"])
    assert full and full != set(range(v["depth"])), "needs windowed and full-attention blocks"
    assert cfg["text_config"]["num_hidden_layers"] >= 2
    assert json.loads((tiny_ckpt / "preprocessor_config.json").read_text())["processor_class"] == "Qwen2_5_VLProcessor"
    assert not any(p.suffix == ".bin" for p in tiny_ckpt.iterdir())


def test_tiny_checkpoint_is_deterministic_and_reloads_bit_identically(tiny_ckpt, tmp_path):
    again = build_tiny_checkpoint(tmp_path / "again", seed=0)
    assert _sha(again / "model.safetensors") == _sha(tiny_ckpt / "model.safetensors")
    assert (again / "tokenizer.json").read_text() == (tiny_ckpt / "tokenizer.json").read_text()
    other = build_tiny_checkpoint(tmp_path / "other", seed=1)
    assert _sha(other / "model.safetensors") != _sha(tiny_ckpt / "model.safetensors")

    built = make_tiny_model(seed=0)[0].state_dict()
    loaded = load_model(tiny_ckpt).state_dict()
    assert set(built) == set(loaded)
    for k, v in built.items():
        assert torch.equal(loaded[k], v), k


def test_multimodal_forward_through_the_processor(tiny_ckpt, parity_refs):
    from vlsens.data.images import open_rgb, resize_exact

    proc = load_processor(tiny_ckpt)
    model = load_model(tiny_ckpt)
    images = [resize_exact(open_rgb(parity_refs[0]), 224, 224), resize_exact(open_rgb(parity_refs[1]), 224, 336)]
    messages = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]] * 2
    text = [proc.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    inputs = proc(images=[[images[0]], [images[1]]], text=text, return_tensors="pt", padding=True)
    assert "mm_token_type_ids" in inputs
    n_image_tokens = (inputs["input_ids"] == model.config.image_token_id).sum(dim=1).tolist()
    assert n_image_tokens == [64, 96]  # (224/28)^2 and (224/28)*(336/28)
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape == (*inputs["input_ids"].shape, model.config.text_config.vocab_size)
    assert torch.isfinite(out.logits).all()


def test_pickle_only_checkpoint_is_refused(pickle_only_ckpt):
    with pytest.raises(CheckpointError, match="only pickle weights.*safetensors only"):
        check_checkpoint_dir(pickle_only_ckpt)
    with pytest.raises(CheckpointError, match="pickle"):
        load_model(pickle_only_ckpt)


def test_missing_and_foreign_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist.*tiny"):
        check_checkpoint_dir(tmp_path / "nope")
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(CheckpointError, match="model_type 'llama'.*qwen2_5_vl"):
        check_checkpoint_dir(d)


@pytest.mark.parametrize("name, text, says", [
    ("config.json", "[1, 2]", "holds a JSON list, not an object of keys"),
    ("config.json", '{"model_type": "qwen2_5_vl", "vision_config": "big"}', "vision_config is a JSON str"),
    ("config.json", '{"model_type": ', "is not valid JSON"),
    ("preprocessor_config.json", "7", "holds a JSON int"),
    ("tokenizer_config.json", b'{"x": "caf\xe9"}', "is not valid JSON"),  # not UTF-8
    ("tokenizer.json", "{oops", "is not valid JSON"),
    ("tokenizer.json", '{"model": {"vocab": {}}}', "holds no token ids"),
])
def test_a_checkpoint_json_file_of_the_wrong_shape_is_named(tiny_ckpt, tmp_path, name, text, says):
    """Every JSON file vlsens or transformers reads from a checkpoint must be a JSON object (and
    config.json's vision_config / text_config too): otherwise one line naming the file when the
    DAG is built, not an AttributeError in a job."""
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, d)
    (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointError, match=f"model.checkpoint: '{d / name}'.*") as e:
        check_checkpoint_dir(d)
    assert says in str(e.value) and "\n" not in str(e.value)


def _edit_config(d, **changes):
    import json

    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        node, *path = k.split("__")
        target = cfg[node] if path else cfg
        target[path[0] if path else node] = v
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("change, says", [
    ({"vision_config__num_heads": 7}, "vision_config.hidden_size 64 is not divisible by vision_config.num_heads 7"),
    ({"text_config__num_key_value_heads": 3}, "text_config.num_attention_heads 4 is not a multiple of"),
    ({"text_config__num_attention_heads": 3, "text_config__num_key_value_heads": 3},
     "text_config.hidden_size 64 is not divisible by text_config.num_attention_heads 3"),
    ({"image_token_id": 10**7}, "image_token_id 10000000 outside the embedding table"),
    ({"text_config__vocab_size": 100}, "vocab_size 100 is smaller than the tokenizer's"),
])
def test_config_values_a_graph_is_built_from_are_checked_when_the_dag_is_built(tiny_ckpt, tmp_path, change, says):
    """Inconsistent widths or token ids outside the table were accepted and failed later inside a
    job (or indexed past the table): one line naming config.json and the keys, at DAG build."""
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, d)
    _edit_config(d, **change)
    with pytest.raises(CheckpointError, match=f"'{d / 'config.json'}'") as e:
        check_checkpoint_dir(d)
    assert says in str(e.value), str(e.value)


@pytest.mark.parametrize("remove, says", [
    (("preprocessor_config.json",), "has no preprocessor_config.json"),
    (("tokenizer.json",), "has no tokenizer"),
])
def test_the_processor_files_are_required(tiny_ckpt, tmp_path, remove, says):
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, d)
    for name in remove:
        (d / name).unlink()
    with pytest.raises(CheckpointError, match=says):
        check_checkpoint_dir(d)


def test_unexpected_tensor_and_bad_index_are_named(tiny_ckpt, tmp_path):
    import json
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, d)
    t = load_file(d / "model.safetensors")
    t["model.visual.blocks.9.extra.weight"] = np.zeros((2, 2), np.float32)
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"unexpected keys \(1\): .*blocks\.9\.extra\.weight"):
        load_model(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="model-00002.safetensors"):
        check_checkpoint_dir(d)


def test_3b_preset_is_the_published_architecture():
    """The 3b preset's config gives Qwen2.5-VL-3B's parameter counts (built on torch's meta
    device: no memory): vision tower 668.7 M, 3.75 B in all with 36 text layers, tied embeddings."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlsens.model.presets.build import real_3b_config
    from vlsens.model.presets.tokenizer import build_tiny_tokenizer

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(real_3b_config(build_tiny_tokenizer(), 36))
    vision = sum(p.numel() for p in model.model.visual.parameters())
    total = sum(p.numel() for p in model.parameters())  # tied: lm_head is the embedding
    assert round(vision / 1e6, 1) == 668.7
    assert round(total / 1e9, 2) == 3.75
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    assert model.config.text_config.vocab_size == 151936


def test_vision_only_loading_equals_the_full_model(tiny_ckpt):
    import torch

    from vlsens.model.loading import load_model

    full = load_model(tiny_ckpt)
    vision = load_model(tiny_ckpt, part="vision")
    assert next(vision.model.language_model.parameters()).device.type == "meta"  # never loaded
    pv, grid = torch.randn(256, 1176), torch.tensor([[1, 16, 16]])
    with torch.no_grad():
        a = full.model.get_image_features(pixel_values=pv, image_grid_thw=grid).pooler_output[0]
        b = vision.model.get_image_features(pixel_values=pv, image_grid_thw=grid).pooler_output[0]
    assert torch.equal(a, b)
    text = load_model(tiny_ckpt, part="text")
    assert next(text.model.visual.parameters()).device.type == "meta"
    ids = torch.tensor([[3, 5, 7, 11]])
    with torch.no_grad():
        x = full.lm_head(full.model.language_model(input_ids=ids).last_hidden_state)
        y = text.lm_head(text.model.language_model(input_ids=ids).last_hidden_state)
    assert torch.equal(x, y)


def test_a_tied_config_is_checked_by_value(tmp_path):
    """``deploy.nbits.embedding: tied`` trusts lm_head's rows as the table: a checkpoint whose
    config says tied but which stores an lm_head that differs from its table (one value, or
    another shape) is named at DAG build; equal copies, or the table alone, are tied."""
    import numpy as np
    from safetensors.numpy import save_file

    from vlsens.model.checkpoint import tied_weights_differ

    table = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    name = "model.language_model.embed_tokens.weight"
    save_file({name: table}, str(tmp_path / "model.safetensors"))
    assert tied_weights_differ(tmp_path) is None  # the table alone: nothing to compare
    save_file({name: table, "lm_head.weight": table.copy()}, str(tmp_path / "model.safetensors"))
    assert tied_weights_differ(tmp_path) is None
    other = table.copy()
    other[40, 3] += 1.0
    save_file({name: table, "lm_head.weight": other}, str(tmp_path / "model.safetensors"))
    assert tied_weights_differ(tmp_path).startswith(f"lm_head.weight differs from {name}")
    save_file({name: table, "lm_head.weight": table[:32]}, str(tmp_path / "model.safetensors"))
    assert "[64, 16], lm_head.weight F32 [32, 16]" in tied_weights_differ(tmp_path)
