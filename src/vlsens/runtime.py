"""ONNX-only inference: the piece a user imports in their application.

:class:`VisionEncoder` runs the dynamic vision graph on PIL images of any size (several per call),
with the checkpoint's own image processor. :class:`VLM` joins it with the text graph
(``embeds.onnx``): token embeddings (the checkpoint's table, read from safetensors), vision
features written into the image-token slots, 3-D mRoPE positions (:func:`rope_index`, a numpy port
of transformers' ``get_rope_index`` for images), logits, and greedy generation. No PyTorch model
runs; transformers is used for the processor and the vision index helpers only.

    from vlsens.runtime import VLM
    vlm = VLM("results/tiny/vision/dynamic/fp32/model.onnx", "results/tiny/text/fp32/embeds.onnx",
              "results/tiny/checkpoint")
    tokens = vlm.generate([image], "Describe this image.", max_new_tokens=16)
    print(vlm.processor.tokenizer.decode(tokens))
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from vlsens.towers.vision_dynamic import graph_inputs


def _session(path, threads: int = 0, device: str = "auto"):
    from vlsens.onnxutil import make_session

    return make_session(path, threads=threads, device=device)


class VisionEncoder:
    """The dynamic vision graph + the checkpoint's image processor."""

    def __init__(self, model: str | Path, checkpoint: str | Path, threads: int = 0, device: str = "auto"):
        from transformers import AutoConfig

        from vlsens.checkpoint import check_checkpoint_dir, load_image_processor

        check_checkpoint_dir(checkpoint)
        self.config = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False)
        self.vision_config = self.config.vision_config
        self.image_processor = load_image_processor(checkpoint)
        self.session = _session(model, threads, device)

    def preprocess(self, images: Sequence, sizes: Sequence[tuple[int, int]] | None = None) -> dict[str, np.ndarray]:
        """Processor output (``pixel_values`` patches, ``image_grid_thw``) for PIL images, resized
        by the processor itself or, with ``sizes``, to exactly (H, W) each (multiples of 28)."""
        from vlsens.vision import processor_inputs

        if sizes is None:
            out = self.image_processor(images=list(images), return_tensors="np")
            return {"pixel_values": np.asarray(out["pixel_values"], np.float32),
                    "image_grid_thw": np.asarray(out["image_grid_thw"], np.int64)}
        parts = [processor_inputs(self.image_processor, [im], h, w) for im, (h, w) in zip(images, sizes)]
        return {"pixel_values": np.concatenate([p["pixel_values"] for p in parts]),
                "image_grid_thw": np.concatenate([p["image_grid_thw"] for p in parts])}

    def features(self, pixel_values: np.ndarray, image_grid_thw: np.ndarray) -> np.ndarray:
        """All images' merged tokens, concatenated (as ``get_image_features`` concatenates them)."""
        return self.session.run(None, graph_inputs(pixel_values, image_grid_thw, self.vision_config))[0]

    def __call__(self, images: Sequence, sizes: Sequence[tuple[int, int]] | None = None) -> list[np.ndarray]:
        """Features per image: (tokens_i, out_hidden) each."""
        p = self.preprocess(images, sizes)
        feats = self.features(p["pixel_values"], p["image_grid_thw"])
        merge = int(self.vision_config.spatial_merge_size) ** 2
        counts = (p["image_grid_thw"].prod(-1) // merge).tolist()
        return np.split(feats, np.cumsum(counts)[:-1])


def rope_index(input_ids: np.ndarray, mm_token_type_ids: np.ndarray, image_grid_thw: np.ndarray | None,
               attention_mask: np.ndarray | None, spatial_merge_size: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """3-D mRoPE positions (3, B, S) and per-row deltas (B, 1): transformers'
    ``Qwen2_5_VLModel.get_rope_index`` for text and images, in numpy."""
    b, s = input_ids.shape
    pos = np.zeros((3, b, s), dtype=np.int64)
    grids = iter(image_grid_thw if image_grid_thw is not None else [])
    deltas = []
    for i in range(b):
        keep = attention_mask[i].astype(bool) if attention_mask is not None else np.ones(s, bool)
        types = mm_token_type_ids[i][keep]
        parts, cur = [], 0
        for kind, group in itertools.groupby(range(len(types)), key=lambda t: int(types[t])):
            n = len(list(group))
            if kind == 0:
                parts.append(np.broadcast_to(np.arange(n) + cur, (3, n)))
                cur += n
            elif kind == 1:
                t, h, w = (int(x) for x in next(grids))
                gh, gw = h // spatial_merge_size, w // spatial_merge_size
                tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh) + cur, np.arange(gw) + cur, indexing="ij")
                p = np.stack([tt + cur, hh, ww]).reshape(3, -1)
                if p.shape[1] != n:
                    raise ValueError(f"row {i}: {n} image tokens but grid {t}x{h}x{w} makes {p.shape[1]}")
                parts.append(p)
                cur += max(h, w) // spatial_merge_size
            else:
                raise NotImplementedError("video inputs are not supported by the runtime")
        flat = np.concatenate(parts, axis=1)
        pos[:, i, keep] = flat
        deltas.append(int(flat.max()) + 1 - int(keep.sum()))
    return pos, np.array(deltas, dtype=np.int64)[:, None]


class VLM:
    """ONNX vision (dynamic graph) + ONNX text (``embeds.onnx``), driven from Python."""

    def __init__(self, vision_model: str | Path, text_model: str | Path, checkpoint: str | Path,
                 threads: int = 0, device: str = "auto"):
        from vlsens.checkpoint import load_processor

        self.vision = VisionEncoder(vision_model, checkpoint, threads, device)
        self.processor = load_processor(checkpoint)
        self.text = _session(text_model, threads, device)
        self.config = self.vision.config
        self.embed_table = _embedding_table(checkpoint)

    def inputs(self, images: Sequence, prompts: Sequence[str], sizes=None) -> dict[str, np.ndarray]:
        """Processor output for one image list and prompts (each prompt gets the images in order:
        one prompt with all images, or one image per prompt when the counts match)."""
        from vlsens.images import resize_exact

        tok = self.processor.tokenizer
        tok.padding_side = "left"
        per_prompt = len(prompts) == len(images) and len(prompts) > 1
        texts = []
        for p in prompts:
            n = 1 if per_prompt else len(images)
            content = [{"type": "image"}] * n + [{"type": "text", "text": p}]
            texts.append(self.processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                             add_generation_prompt=True))
        kwargs = {}
        if sizes is not None:
            resample = getattr(self.processor.image_processor, "resample", None)
            images = [resize_exact(im, h, w, resample) for im, (h, w) in zip(images, sizes)]
            kwargs["do_resize"] = False
        out = self.processor(text=texts, images=list(images) or None, return_tensors="np", padding=True, **kwargs)
        return {k: np.asarray(v) for k, v in out.items()}

    def embeds(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(inputs_embeds, position_ids) for the text graph: the vision graph's features in the
        image-token slots, 3-D positions from :func:`rope_index`."""
        ids = inputs["input_ids"].astype(np.int64)
        emb = self.embed_table[ids].astype(np.float32)
        grid = inputs.get("image_grid_thw")
        if grid is not None and len(grid):
            feats = self.vision.features(inputs["pixel_values"], grid)
            slots = ids == int(self.config.image_token_id)
            if slots.sum() != len(feats):
                raise ValueError(f"{int(slots.sum())} image tokens but the vision graph returned {len(feats)} features")
            emb[slots] = feats
        mm = inputs.get("mm_token_type_ids")
        if mm is None:
            mm = (ids == int(self.config.image_token_id)).astype(np.int64)
        pos, _ = rope_index(ids, mm, grid, inputs["attention_mask"],
                                           int(self.config.vision_config.spatial_merge_size))
        return emb, pos

    def logits(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        emb, pos = self.embeds(inputs)
        return self._run(emb, inputs["attention_mask"], pos)

    def _run(self, emb, mask, pos) -> np.ndarray:
        return self.text.run(None, {"inputs_embeds": emb, "attention_mask": mask.astype(np.int64),
                                    "position_ids": pos})[0]

    def generate(self, images: Sequence, prompt: str, max_new_tokens: int = 16, sizes=None) -> list[int]:
        """Greedy decoding of one prompt: the whole sequence is re-run each step (no KV cache in
        the graph); new tokens continue the text positions after the prompt's largest position."""
        inputs = self.inputs(images, [prompt], sizes)
        emb, pos = self.embeds(inputs)
        mask = inputs["attention_mask"].astype(np.int64)
        eos = {int(t) for t in np.atleast_1d(self.config.text_config.eos_token_id or [])}
        out: list[int] = []
        for _ in range(max_new_tokens):
            nxt = int(self._run(emb, mask, pos)[0, -1].argmax())
            out.append(nxt)
            if nxt in eos:
                break
            emb = np.concatenate([emb, self.embed_table[[[nxt]]].astype(np.float32)], axis=1)
            mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
            nxt_pos = pos[:, :, -1:].max() + 1
            pos = np.concatenate([pos, np.full((3, 1, 1), nxt_pos, np.int64)], axis=2)
        return out


def _embedding_table(checkpoint: str | Path) -> np.ndarray:
    """The token embedding table from the checkpoint's safetensors (numpy). Checkpoints name it
    ``model.embed_tokens.weight`` (the published layout, which transformers 5 also writes) or
    ``model.language_model.embed_tokens.weight``."""
    from safetensors import safe_open

    names = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
             "language_model.model.embed_tokens.weight")
    ckpt = Path(checkpoint)
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        files = sorted({ckpt / wm[n] for n in names if n in wm})
    else:
        files = sorted(ckpt.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="numpy") as st:
            for n in names:
                if n in st.keys():
                    return st.get_tensor(n)
    raise KeyError(f"{checkpoint}: none of {names} in its safetensors")
