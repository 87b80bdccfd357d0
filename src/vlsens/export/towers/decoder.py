"""Tower ``decoder``: the text decoder that ships (graph ``decoder``), with a KV cache.

Two graphs per variant folder ``results/<model>/decoder/<variant>/``, the ones an
onnxruntime-genai folder runs (:mod:`vlsens.deploy.genai.folder`, :mod:`vlsens.deploy`):

``model.onnx``      the decoder from onnxruntime-genai's model builder (GroupQueryAttention with a
                    KV cache, MRotaryEmbedding; ``exclude_embeds``): ``inputs_embeds`` (B, S, H),
                    ``attention_mask`` (B, past + S) i64, ``position_ids`` (3, B, S) i64,
                    ``past_key_values.<i>.key/value`` (B, kv_heads, past, head_dim) ->
                    ``logits`` (B, S, vocab) first, then ``present.<i>.key/value``;
``embedding.onnx``  ``input_ids`` and ``image_features`` -> ``inputs_embeds``
                    (:func:`embedding_model`).

Why the builder and not vlsens' own export (:mod:`vlsens.export.towers.text`, no cache): the runtime
needs its cache layout (a shared past/present buffer, ``GroupQueryAttention``'s sequence lengths
from the mask), the builder writes it in seconds tensor by tensor, and its graph is the one the
runtime's kernels are tuned for. vlsens gates it like every other graph.

Parity (against transformers' ``Qwen2_5_VLForConditionalGeneration``, eager attention, float32):
for each prompt length a **prefill** (empty cache; logits at every position) and a **decode
step** (transformers' own cache of that prefill as ``past_key_values``, the next token; logits),
the same for an image+prompt sequence (merged embeddings, 3-D positions, then the decode step's
position); the embedding graph on text-only ids (no image features) and on an image+prompt
sequence (transformers' merged embeddings).

Calibration, sensitivity and the profile take ``model.onnx`` in prefill form (an empty cache), on
the text tower's calibration sequences; the metric counts the positions a user reads
(:func:`vlsens.export.towers.prompts.text_positions`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from vlsens.config import check_variants
from vlsens.core.errors import ConfigError, VlsensError
from vlsens.core.sizes import parse_size
from vlsens.data.calibration import CalibrationSet
from vlsens.data.cases import Case, Cases
from vlsens.data.prompts import BUILTIN_PROMPTS
from vlsens.data.samples import Samples
from vlsens.export.towers import names
from vlsens.export.towers.prompts import PromptTower

log = logging.getLogger(__name__)

SOURCE = ("transformers Qwen2_5_VLForConditionalGeneration (PyTorch, float32, eager): prefill and decode-step "
          "logits with its own KV cache; merged input embeddings")


# ----------------------------------------------------------------------------------------------
# The builder's decoder and the embedding graph


def builder_version() -> str:
    import onnxruntime_genai

    return onnxruntime_genai.__version__


def build_decoder(checkpoint: str | Path, out_dir: str | Path, log_path: str | Path | None = None,
                  precision: str = "fp32", options: dict | None = None) -> Path:
    """The text decoder with a KV cache from ORT-GenAI's model builder (CPU), taking
    ``inputs_embeds`` (``exclude_embeds``): FP32, or ``precision="int4"`` with the builder's
    weight-only ``options`` (``algo_config``, ``block_size``, ``accuracy_level``, ``is_symmetric``).
    Runs in a child process (the builder loads the checkpoint itself, from safetensors,
    ``trust_remote_code`` off by default); returns the builder's ``model.onnx``. Its genai_config
    and tokenizer files are not used: the folder's own are written by
    :func:`vlsens.deploy.genai.folder.genai_config`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = [f"{k}={v}" for k, v in (options or {}).items()]
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out_dir / "out"),
           "-p", precision, "-e", "cpu", "-c", str(out_dir / "cache"),
           "--extra_options", "exclude_embeds=true", "hf_token=false", "hf_remote=false", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if log_path is not None:
        Path(log_path).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise VlsensError(f"onnxruntime-genai's model builder failed (exit {proc.returncode}) on {checkpoint}:\n{tail}")
    model = out_dir / "out" / "model.onnx"
    if not model.is_file():
        raise VlsensError(f"onnxruntime-genai's model builder wrote no {model}")
    return model


# ----------------------------------------------------------------------------------------------
# Embedding


def embedding_model(table: np.ndarray, image_token_id: int, opset: int = 19):
    """``input_ids`` (B, S), ``image_features`` (n, H) -> ``inputs_embeds`` (B, S, H): rows of
    ``table``, the k-th image token's row replaced by feature row k (row-major over the batch, as
    transformers' ``masked_scatter``). A zero row is appended to the features so that n = 0 (the
    decode steps) needs no special case."""
    from onnx import TensorProto, helper, numpy_helper

    h = int(table.shape[1])
    n = helper.make_node
    nodes = [
        n("Gather", ["embed_tokens.weight", "input_ids"], ["token_embeds"], name="/embed_tokens/Gather"),
        n("Equal", ["input_ids", "image_token_id"], ["is_image"], name="/merge/Equal"),
        n("Shape", ["input_ids"], ["ids_shape"], name="/merge/Shape"),
        n("Reshape", ["is_image", "minus_one"], ["is_image_flat"], name="/merge/Flatten"),
        n("Cast", ["is_image_flat"], ["is_image_i64"], to=TensorProto.INT64, name="/merge/Cast"),
        n("CumSum", ["is_image_i64", "zero"], ["image_rank"], name="/merge/CumSum"),
        n("Sub", ["image_rank", "one"], ["image_row"], name="/merge/Sub"),
        n("Shape", ["image_features"], ["feat_shape"], name="/merge/FeatShape"),
        n("Gather", ["feat_shape", "zero"], ["num_features"], axis=0, name="/merge/NumFeatures"),
        n("Where", ["is_image_flat", "image_row", "num_features"], ["row"], name="/merge/Row"),
        n("ConstantOfShape", ["zero_row_shape"], ["zero_row"],
          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]), name="/merge/ZeroRow"),
        n("Concat", ["image_features", "zero_row"], ["features_padded"], axis=0, name="/merge/Concat"),
        n("Gather", ["features_padded", "row"], ["image_rows"], axis=0, name="/merge/GatherRows"),
        n("Concat", ["ids_shape", "hidden"], ["out_shape"], axis=0, name="/merge/OutShape"),
        n("Reshape", ["image_rows", "out_shape"], ["image_embeds"], name="/merge/Reshape"),
        n("Unsqueeze", ["is_image", "minus_one"], ["is_image_3d"], name="/merge/Unsqueeze"),
        n("Where", ["is_image_3d", "image_embeds", "token_embeds"], ["inputs_embeds"], name="/merge/Where"),
    ]
    inits = [
        numpy_helper.from_array(np.ascontiguousarray(table, dtype=np.float32), "embed_tokens.weight"),
        numpy_helper.from_array(np.array(image_token_id, np.int64), "image_token_id"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([1, h], np.int64), "zero_row_shape"),
        numpy_helper.from_array(np.array([h], np.int64), "hidden"),
    ]
    graph = helper.make_graph(
        nodes, "embedding",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("image_features", TensorProto.FLOAT, ["num_image_tokens", h])],
        [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", h])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="vlsens")
    model.ir_version = 10
    return model


# ----------------------------------------------------------------------------------------------
# Reference


def empty_cache(text_config, batch: int = 1) -> dict[str, np.ndarray]:
    """``past_key_values.<i>.key/value`` of length 0 (a prefill)."""
    kv = int(text_config.num_key_value_heads)
    hd = int(text_config.hidden_size) // int(text_config.num_attention_heads)
    z = np.zeros((batch, kv, 0, hd), np.float32)
    return {f"past_key_values.{i}.{k}": z for i in range(int(text_config.num_hidden_layers)) for k in ("key", "value")}


def cache_arrays(cache) -> dict[str, np.ndarray]:
    """transformers' cache (``DynamicCache``) as the decoder's ``past_key_values.<i>.*`` inputs."""
    out = {}
    for i, layer in enumerate(cache.layers):
        out[f"past_key_values.{i}.key"] = layer.keys.numpy().astype(np.float32)
        out[f"past_key_values.{i}.value"] = layer.values.numpy().astype(np.float32)
    return out


def _prefill_and_step(model, embeds, mask, pos, name: str, meta: dict) -> list[Case]:
    """A prefill case (empty cache) and one decode step (the greedy next token, transformers'
    cache as the past) for one sequence (batch 1, no padding)."""
    import torch

    tc = model.config.text_config
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(embeds), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(pos), use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        past = cache_arrays(out.past_key_values)
        step_embeds = model.model.get_input_embeddings()(nxt)
        step_pos = torch.from_numpy(pos).amax(dim=(0, 2), keepdim=True).expand(3, -1, 1) + 1
        step_mask = torch.ones((1, mask.shape[1] + 1), dtype=torch.long)
        out2 = model(inputs_embeds=step_embeds, attention_mask=step_mask, position_ids=step_pos,
                     past_key_values=out.past_key_values, use_cache=True)
    prefill = Case(f"{name}-prefill", "model.onnx",
                   {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": pos, **empty_cache(tc)},
                   out.logits.numpy(), mask.astype(bool), logits=True, meta={**meta, "tokens": int(mask.shape[1])})
    step = Case(f"{name}-decode", "model.onnx",
                {"inputs_embeds": step_embeds.numpy().astype(np.float32), "attention_mask": step_mask.numpy(),
                 "position_ids": step_pos.numpy().astype(np.int64), **past},
                out2.logits.numpy(), None, logits=True, meta={**meta, "past": int(mask.shape[1])})
    return [prefill, step]


def compute_decoder_reference(checkpoint, image_refs, prompts, repeats, height: int, width: int) -> Cases:
    import torch

    from vlsens.data.images import open_rgb
    from vlsens.export.towers.prompts import merged_embeds, multimodal_inputs, text_batch, text_position_ids_np
    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    model = load_model(checkpoint, attn_implementation="eager", part=None if image_refs else "text")
    processor = load_processor(checkpoint)
    embed = model.model.get_input_embeddings()
    cases, embedding_cases = Cases(source=SOURCE), []
    for n in repeats:
        batch = text_batch(processor, prompts[:1], repeat=n)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            embeds = embed(torch.from_numpy(ids)).numpy().astype(np.float32)
        for c in _prefill_and_step(model, embeds, mask, text_position_ids_np(mask), f"text-x{n}", {"repeat": n}):
            cases.add(c)
        if n == repeats[0]:  # the embedding graph on text only: no image features
            hidden = embeds.shape[-1]
            embedding_cases.append(Case("embedding-text", "embedding.onnx",
                           {"input_ids": ids, "image_features": np.zeros((0, hidden), np.float32)}, embeds))
    if image_refs:
        image = open_rgb(image_refs[0])
        inputs = multimodal_inputs(processor, [image], prompts[1:2], height, width)
        feeds = merged_embeds(model, inputs)
        embeds, pos, mask = feeds["inputs_embeds"], feeds["position_ids"], feeds["attention_mask"]
        meta = {"image": image_refs[0].name, "image_size": [height, width]}
        for c in _prefill_and_step(model, embeds, mask, pos, "image+prompt", meta):
            cases.add(c)
        with torch.no_grad():
            feats = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True)
            feats = torch.cat(feats.pooler_output, dim=0).numpy().astype(np.float32)
        embedding_cases.append(Case("embedding-image", "embedding.onnx",
                                    {"input_ids": inputs["input_ids"].numpy().astype(np.int64), "image_features": feats},
                                    embeds, meta=meta))
    for c in embedding_cases:  # after the decoder's: cases are listed graph by graph
        cases.add(c)
    return cases


# ----------------------------------------------------------------------------------------------
# The reference of a decoder with quantized weights

_LAYER_MATMUL = r"^/model/layers\.(\d+)/(attn|mlp)/(\w+_proj)/MatMul$"
WEIGHT_SOURCE = ("transformers Qwen2_5_VLForConditionalGeneration (PyTorch, float32, eager) with the graph's own "
                 "weights: every MatMulNBits weight dequantized into its Linear (vlsens.core.onnxgraph.dequantize_matmulnbits)")


def linear_of(matmul: str) -> str:
    """transformers' Linear (module path) that the builder's decoder MatMul ``matmul`` computes."""
    import re

    if matmul == "/lm_head/MatMul":
        return "lm_head"
    m = re.match(_LAYER_MATMUL, matmul)
    if m is None:
        raise VlsensError(f"{matmul}: not a MatMul of onnxruntime-genai's decoder layout "
                          "(/model/layers.<i>/attn|mlp/<x>_proj/MatMul or /lm_head/MatMul)")
    i, block, proj = m.groups()
    return f"model.language_model.layers.{i}.{'self_attn' if block == 'attn' else 'mlp'}.{proj}"


def forward_case(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """transformers' logits for a decoder case's inputs (``past_key_values.<i>.*`` as its cache)."""
    import torch
    from transformers import DynamicCache

    tc = model.config.text_config
    cache = None
    if inputs["past_key_values.0.key"].shape[2]:
        cache = DynamicCache(config=model.config)
        for i in range(int(tc.num_hidden_layers)):
            cache.update(torch.from_numpy(inputs[f"past_key_values.{i}.key"]),
                         torch.from_numpy(inputs[f"past_key_values.{i}.value"]), i)
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(inputs["inputs_embeds"]),
                    attention_mask=torch.from_numpy(inputs["attention_mask"]),
                    position_ids=torch.from_numpy(inputs["position_ids"]), past_key_values=cache, use_cache=True)
    return out.logits.numpy()


def weight_reference(checkpoint, graph: str | Path, cases: Cases) -> Cases:
    """``cases`` with the decoder's expected logits recomputed by transformers after each Linear
    that ``graph`` quantized (``MatMulNBits``) is given the dequantized weight the graph multiplies
    by; the other cases (the embedding graph's) unchanged. The parity reference of a weight-only
    INT4 decoder: the graph's own weights, so the gate checks the export, the packing and the
    kernels, while the quantization error (against the checkpoint's model) is measured apart.
    Memory: the language model in float32 (4 bytes per text parameter; 12.4 GB at 3B), one
    dequantized weight at a time."""
    import torch

    from vlsens.core.onnxgraph import dequantize_matmulnbits as dequantize
    from vlsens.model.loading import load_model

    model = load_model(checkpoint, attn_implementation="eager", part="text")
    replaced = 0
    for name, w in dequantize(graph):
        linear = model.get_submodule(linear_of(name))
        if tuple(linear.weight.shape) != (w.shape[1], w.shape[0]):
            raise VlsensError(f"{graph}: {name} is {w.shape[0]}x{w.shape[1]}; {linear_of(name)} holds "
                              f"{tuple(linear.weight.shape)} (transposed)")
        linear.weight = torch.nn.Parameter(torch.from_numpy(w.T.copy()), requires_grad=False)  # unties lm_head
        replaced += 1
    log.info("%s: %d quantized weights in transformers' model; recomputing %d decoder cases", graph, replaced,
             len(cases.for_graph("model.onnx")))
    out = Cases(source=f"{WEIGHT_SOURCE} ({replaced} weights)")
    for c in cases:
        if c.graph == "model.onnx":
            c = Case(c.name, c.graph, c.inputs, forward_case(model, c.inputs), c.valid, c.logits, c.meta)
        out.add(c)
    del model
    return out


def weight_reference_for(checkpoint):
    """:func:`weight_reference` of ``checkpoint`` for a staged decoder variant folder (the
    ``reference_for`` of :class:`vlsens.variants.Gate`)."""
    return lambda staged, cases: weight_reference(checkpoint, staged["model.onnx"], cases)


class Decoder(PromptTower):
    kind = "decoder"
    #: the one graph of this tower (the deploy folders' decoder)
    GRAPH = names.DECODER
    pattern = r"decoder"
    #: the embedding graph beside the decoder (the deploy folder's, onnxruntime-genai's name)
    EMBEDDING = names.DECODER_EMBEDDING
    files = ("model.onnx", EMBEDDING)
    analysed = "model.onnx"
    section_key = "deploy.decoder"
    libraries = {"export": ("onnxruntime-genai", "torch", "transformers", "onnx", "safetensors"),
                 "calibration": ("torch", "transformers", "pillow", "numpy")}

    @classmethod
    def graphs(cls, config, spec=None) -> list[str]:
        d = config["deploy"]
        return [cls.GRAPH] if d["enabled"] else []

    def check(self, plan) -> None:
        from vlsens.model.family import for_config

        fam = for_config(self.config)
        if not fam.deploy:
            raise ConfigError(
                f"deploy.enabled: the deploy folder (onnxruntime-genai type qwen2_5_vl) is built for Qwen2.5-VL only; "
                f"model.checkpoint is {fam.title} ({fam.model_type}). Set deploy.enabled: false; the ONNX graphs, "
                "sensitivity and profiles of this family are built without it.")
        check_variants(self.variants(), self.analysed_variants(), self.key("variants"), self.key("sensitivity_variants"))

    def profile_settings(self) -> dict:
        return dict(self.config["text"]["profile"])

    def reference_settings(self) -> dict:
        p = self.config["text"]["parity"]
        return {"repeats": list(p["repeats"]), "image_size": p["image_size"]}

    def export_settings(self) -> dict:
        return {"opset": self.config["export"]["opset"]}

    def reference(self, checkpoint, images, settings, device="cpu") -> Cases:
        h, w = parse_size(settings["image_size"], key="text.parity.image_size", **self.size_rule)
        return compute_decoder_reference(checkpoint, images, BUILTIN_PROMPTS, settings["repeats"], h, w)

    def export(self, checkpoint, cases, workdir, settings):
        import json

        from vlsens.core.onnxutil import resave, save_with_external_data
        from vlsens.model.loading import embedding_table

        workdir = Path(workdir)
        raw = build_decoder(checkpoint, workdir / "builder", workdir / "builder.log")
        staged = {"model.onnx": resave(raw, workdir / "model.onnx")}
        cfg = json.loads((Path(checkpoint) / "config.json").read_text())
        emb = embedding_model(embedding_table(checkpoint), int(cfg["image_token_id"]), settings["opset"])
        staged["embedding.onnx"] = save_with_external_data(emb, workdir / "embedding.onnx")
        return staged, {"exporter": f"onnxruntime-genai {builder_version()} model builder "
                                    "(-p fp32 -e cpu, exclude_embeds=true)",
                        "embedding": "vlsens.export.towers.decoder.embedding_model over the checkpoint's embed_tokens.weight"}

    def calibration(self, checkpoint, inputs, settings) -> CalibrationSet:
        from transformers import AutoConfig

        base = self.prompt_calibration(checkpoint, inputs, settings)  # in prefill form below
        tc = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False).text_config
        past = empty_cache(tc)
        splits = {}
        for name, s in base.splits.items():
            splits[name] = Samples([{**f, **past} for f in s.feeds], s.valid, s.names)
        return CalibrationSet(splits, base.samples, {**base.facts, "cache": "empty (prefill)"})
