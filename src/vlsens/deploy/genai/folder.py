"""The pieces of an onnxruntime-genai (ORT-GenAI) model folder for ``type: qwen2_5_vl``.

ORT-GenAI runs three sessions for this model type, each with a contract of its own:

``vision.onnx``     ``pixel_values`` (N, C*T*P*P) f32 and ``image_grid_thw`` (1, 3) i64 -- exactly
                    what its own image processor produces, one image per call -- to
                    ``image_features`` (N/4, out_hidden). Windowing happens inside the graph.
``embedding.onnx``  ``input_ids`` (B, S) i64 and ``image_features`` (n, hidden) to
                    ``inputs_embeds`` (B, S, hidden): token embeddings with the image-token rows
                    replaced, in order, by the image features (called with n = 0 while decoding).
``decoder.onnx``    ``inputs_embeds``, ``attention_mask`` (B, total), ``position_ids`` (3, B, S) and
                    the KV cache ``past_key_values.<i>.key/value`` to ``logits`` and
                    ``present.<i>.key/value``. The runtime builds the 3-D mRoPE positions itself.

The decoder and the embedding graph are the decoder tower's (:mod:`vlsens.export.towers.decoder`:
ORT-GenAI's model builder, GroupQueryAttention with a KV cache, without its embedding layer; a
small graph over the checkpoint's embedding table). This module writes the rest:

* :func:`wrap_vision`: vlsens' dynamic vision graph (any variant, the INT8 profile too) behind a
  preamble (:func:`vision_preamble`) that computes its index inputs (rotary positions, window
  order, image and window boundaries) from ``image_grid_thw`` in the graph;
* :func:`genai_config` and :func:`processor_config`: the runtime's configuration and its image
  preprocessing (onnxruntime-extensions' format, built from the checkpoint's
  ``preprocessor_config.json``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from vlsens.core.errors import VlsensError
from vlsens.model.family import get as get_family

log = logging.getLogger(__name__)

#: Files of a deploy folder besides the three graphs (and their data files).
CONFIG_FILES = ("genai_config.json", "processor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
GRAPHS = {"vision": "vision.onnx", "embedding": "embedding.onnx", "decoder": "decoder.onnx"}


# ----------------------------------------------------------------------------------------------
# Vision: the dynamic graph behind an index preamble


def _preamble_module(merge: int, window: int):
    """A torch module: ``image_grid_thw`` (1, 3) -> the dynamic graph's index inputs, as
    transformers' ``get_vision_position_ids``, ``get_vision_window_index`` and
    ``get_vision_cu_seqlens`` compute them; every value from elementwise arithmetic on one
    running index (``window`` = window side in merged tokens)."""
    import torch

    class Preamble(torch.nn.Module):
        def forward(self, grid):
            m, w_ = merge, window
            t, h, w = grid[0, 0], grid[0, 1], grid[0, 2]
            k = torch.ones_like(t).expand(t * h * w).cumsum(0) - 1  # 0 .. N-1
            # 2-D rotary positions: patches in merge x merge groups, groups row-major
            j, i = k % m, (k // m) % m
            wb, hb = (k // (m * m)) % (w // m), (k // (m * m * (w // m))) % (h // m)
            position_ids = torch.stack([hb * m + i, wb * m + j], -1)
            # window order of the merged tokens: windows row-major, tokens row-major inside
            lh, lw = h // m, w // m
            per = lh * lw
            u = k[: t * per]
            frame, r, c = u // per, (u % per) // lw, u % lw
            nwr, nwc = (lh + w_ - 1) // w_, (lw + w_ - 1) // w_
            nwin = nwr * nwc
            window_id = frame * nwin + (r // w_) * nwc + c // w_
            window_index = torch.argsort(window_id * per + u % per)
            # window boundaries (in patches), window order
            wk = k[: t * nwin] % nwin
            wr, wc = wk // nwc, wk % nwc
            full = torch.full_like(wr, w_)
            count = torch.minimum(lh - wr * w_, full) * torch.minimum(lw - wc * w_, full) * (m * m)
            cu_window_seqlens = torch.cat([torch.zeros_like(k[:1]), count.cumsum(0)])
            cu_seqlens = k[: t + 1] * (h * w)  # one segment per frame
            return position_ids, window_index, cu_seqlens, cu_window_seqlens

    return Preamble().eval()


PREAMBLE_OUTPUTS = ("position_ids", "window_index", "cu_seqlens", "cu_window_seqlens")


def vision_preamble(vision_config, workdir: str | Path, opset: int = 19):
    """The preamble as an ONNX model (exported with torch's TorchScript exporter, shapes dynamic)."""
    import warnings

    import onnx
    import torch

    merge = int(vision_config.spatial_merge_size)
    window = int(vision_config.window_size) // merge // int(vision_config.patch_size)
    path = Path(workdir) / "preamble.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_preamble_module(merge, window), (torch.tensor([[1, 16, 16]]),), str(path), dynamo=False,
                          opset_version=opset, input_names=["image_grid_thw"], output_names=list(PREAMBLE_OUTPUTS))
    return onnx.load(str(path))


PREAMBLE_PREFIX = "/preamble/"


def _prefixed_preamble(vision_config, workdir, opset: int) -> tuple[list, list]:
    """The preamble's nodes and initializers (:func:`vision_preamble`), named under
    :data:`PREAMBLE_PREFIX` but for its input and outputs."""
    pre = vision_preamble(vision_config, workdir, opset=opset)
    nodes = []
    for node in pre.graph.node:
        node.name = PREAMBLE_PREFIX + (node.name or node.op_type)
        for seq in (node.input, node.output):
            for i, x in enumerate(seq):
                if x and x != "image_grid_thw" and x not in PREAMBLE_OUTPUTS:
                    seq[i] = PREAMBLE_PREFIX + x
        nodes.append(node)
    for init in pre.graph.initializer:
        init.name = PREAMBLE_PREFIX + init.name
    return nodes, list(pre.graph.initializer)


def preamble_of(folder_vision: str | Path, opset: int) -> tuple[list, list]:
    """The preamble's nodes and initializers as a deploy folder's ``vision.onnx`` holds them (the
    fp32 folder's: built from the same checkpoint, its vision parity passed), for a graph of
    ``opset``; a VlsensError when it holds none or was written at another opset. Reading it
    saves a job torch and transformers (the preamble is exported with torch from the config)."""
    import onnx
    from onnx import numpy_helper

    from vlsens.core.onnxutil import tensor_array

    folder_vision = Path(folder_vision)
    model = onnx.load(str(folder_vision), load_external_data=False)
    nodes = [n for n in model.graph.node if n.name.startswith(PREAMBLE_PREFIX)]
    if not nodes:
        raise VlsensError(f"{folder_vision}: no preamble nodes ({PREAMBLE_PREFIX}*) to reuse")
    if _opset(model) != opset:
        raise VlsensError(f"{folder_vision}: its preamble is at opset {_opset(model)}, the graph to wrap at {opset}")
    inits = [numpy_helper.from_array(tensor_array(t, folder_vision.parent), t.name) for t in model.graph.initializer
             if t.name.startswith(PREAMBLE_PREFIX)]
    return nodes, inits


def wrap_vision(src: str | Path, dst: str | Path, vision_config, workdir: str | Path,
                preamble_from: str | Path | None = None) -> Path:
    """``dst`` (+ ``dst.data``): the dynamic vision graph ``src`` (vlsens layout, any variant)
    with the preamble in front: inputs ``pixel_values`` and ``image_grid_thw`` (1, 3), output
    ``image_features``. The weights are copied as bytes, never loaded. ``preamble_from``: a deploy
    folder's ``vision.onnx`` whose preamble is reused (:func:`preamble_of`; ``vision_config`` is
    then not read), else it is exported from ``vision_config``."""
    import onnx
    from onnx import helper

    from vlsens.core.onnxutil import copy_model
    from vlsens.export.towers.vision_dynamic import INPUTS, OUTPUT

    src, dst = Path(src), Path(dst)
    model = onnx.load(str(src), load_external_data=False)
    have = [i.name for i in model.graph.input]
    if have != list(INPUTS) or model.graph.output[0].name != OUTPUT:
        raise VlsensError(f"{src}: not a dynamic vision graph (inputs {have}, expected {list(INPUTS)})")
    nodes, inits = preamble_of(preamble_from, _opset(model)) if preamble_from is not None else \
        _prefixed_preamble(vision_config, workdir, _opset(model))
    patches = model.graph.input[0]
    for node in model.graph.node:
        for i, x in enumerate(node.input):
            if x == INPUTS[0]:
                node.input[i] = "pixel_values"
    grid = helper.make_tensor_value_info("image_grid_thw", onnx.TensorProto.INT64, [1, 3])
    pixels = helper.make_tensor_value_info("pixel_values", onnx.TensorProto.FLOAT,
                                           [d.dim_param or d.dim_value for d in patches.type.tensor_type.shape.dim])
    del model.graph.input[:]
    model.graph.input.extend([pixels, grid])
    old_nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes + old_nodes)
    model.graph.initializer.extend(inits)
    model.graph.node.append(helper.make_node("Identity", [OUTPUT], ["image_features"], name="/image_features/Identity"))
    model.graph.output[0].name = "image_features"
    return copy_model(src, dst, model)


def _opset(model) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


# ----------------------------------------------------------------------------------------------
# Configuration files


#: What onnxruntime-genai's model builder writes into a session's ``provider_options`` for each
#: execution provider it builds for (its ``ep_attrs``; builder 0.18): the folders' graphs use
#: GroupQueryAttention, for which the builder writes ``past_present_share_buffer: true`` on every
#: one of these (tests/test_deploy.py checks both against the builder's own genai_config).
PROVIDERS = {"cpu": {}, "cuda": {"enable_cuda_graph": "0"}, "dml": {"enable_graph_capture": "1"}}


def provider_options(provider: str) -> list[dict]:
    """A session's ``provider_options`` for ``provider`` (``cpu``: none, ONNX Runtime's default)."""
    if provider not in PROVIDERS:
        raise VlsensError(f"deploy.provider: '{provider}' is not one of {', '.join(PROVIDERS)}")
    return [] if provider == "cpu" else [{provider: dict(PROVIDERS[provider])}]


def set_provider(folder: str | Path, provider: str) -> dict:
    """Write the execution provider into a folder's ``genai_config.json``: every session's
    ``provider_options`` as the model builder writes the decoder's for that provider."""
    import json

    from vlsens.core.fsutil import write_json

    path = Path(folder) / "genai_config.json"
    cfg = json.loads(path.read_text())
    for part in cfg["model"].values():
        if isinstance(part, dict) and "session_options" in part:
            part["session_options"]["provider_options"] = provider_options(provider)
    cfg["search"]["past_present_share_buffer"] = True
    write_json(path, cfg)
    return cfg


def genai_config(hf_config: dict, generation_config: dict, max_length: int | None = None) -> dict:
    """``genai_config.json`` for the checkpoint's family (its ``genai_type`` in
    :data:`vlsens.model.family.FAMILIES`): the three sessions and greedy search."""
    family = get_family(hf_config["model_type"], "config.json model_type")
    if not family.genai_type:
        raise VlsensError(f"onnxruntime-genai has no model type for {family.title} (model_type '{family.model_type}')")
    text = hf_config.get("text_config", hf_config)
    vision = hf_config["vision_config"]
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    eos = generation_config.get("eos_token_id", text.get("eos_token_id"))
    ctx = int(text.get("max_position_embeddings", 4096))
    session = {"log_id": "onnxruntime-genai", "provider_options": []}
    return {
        "model": {
            "type": family.genai_type,
            "bos_token_id": int(text.get("bos_token_id") or generation_config.get("bos_token_id") or 0),
            "eos_token_id": eos,
            "pad_token_id": int(generation_config.get("pad_token_id", text.get("pad_token_id", 0))),
            "vocab_size": int(text["vocab_size"]),
            "context_length": ctx,
            "image_token_id": int(hf_config["image_token_id"]),
            "video_token_id": int(hf_config["video_token_id"]),
            "vision_start_token_id": int(hf_config["vision_start_token_id"]),
            "decoder": {
                "filename": GRAPHS["decoder"],
                "session_options": session,
                "head_size": hidden // heads,
                "hidden_size": hidden,
                "num_attention_heads": heads,
                "num_hidden_layers": int(text["num_hidden_layers"]),
                "num_key_value_heads": int(text["num_key_value_heads"]),
                "inputs": {"inputs_embeds": "inputs_embeds", "attention_mask": "attention_mask",
                           "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
            "embedding": {
                "filename": GRAPHS["embedding"],
                "session_options": session,
                "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                "outputs": {"inputs_embeds": "inputs_embeds"},
            },
            "vision": {
                "filename": GRAPHS["vision"],
                "session_options": session,
                "spatial_merge_size": int(vision["spatial_merge_size"]),
                "tokens_per_second": float(vision.get("tokens_per_second", 2)),
                "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
                "outputs": {"image_features": "image_features"},
            },
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
            "max_length": int(max_length or ctx), "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 1, "top_p": 1.0,
        },
    }


def processor_config(preprocessor: dict, model_type: str) -> dict:
    """ORT-GenAI's image preprocessing (onnxruntime-extensions) from the checkpoint's
    ``preprocessor_config.json``: decode, RGB, ``smart_resize`` within the checkpoint's pixel
    bounds, rescale, normalize, patchify; names from the family table (``model_type``: config.json's)."""
    family = get_family(model_type, "config.json model_type")
    size = preprocessor.get("size") or {}
    min_pixels = int(preprocessor.get("min_pixels") or size.get("shortest_edge") or 56 * 56)
    max_pixels = int(preprocessor.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280)
    patch, merge = int(preprocessor["patch_size"]), int(preprocessor["merge_size"])
    temporal = int(preprocessor.get("temporal_patch_size", 2))

    def op(name, kind, **attrs):
        return {"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}

    return {"processor": {"name": family.genai_processor, "transforms": [
        op("decode_image", "DecodeImage", color_space="RGB"),
        op("convert_to_rgb", "ConvertRGB"),
        op("resize", "Resize", width=540, height=360, smart_resize=1, min_pixels=min_pixels, max_pixels=max_pixels,
           patch_size=patch, merge_size=merge),
        op("rescale", "Rescale", rescale_factor=float(preprocessor.get("rescale_factor", 1 / 255))),
        op("normalize", "Normalize", mean=[float(x) for x in preprocessor["image_mean"]],
           std=[float(x) for x in preprocessor["image_std"]],
           **{family.genai_type: 1}),  # the decoded image is BGR inside the runtime: this swaps it back
        op("patch_image", "PatchImage", patch_size=patch, temporal_patch_size=temporal, merge_size=merge),
    ]}}
