"""What the towers that read prompts share (``text``, ``decoder``): chat prompts, text batches,
image+prompt and video+prompt inputs through the checkpoint's processor, the embeds graph's inputs
computed with transformers' own functions (``merged_embeds``), the calibration sequences of
``text.calibration``, and :class:`PromptTower` (logits out, layers as blocks, the text plant)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlsens.core.sizes import parse_size
from vlsens.data.calibration import CalibrationSet
from vlsens.data.prompts import PromptSample, load_prompt_samples, stratified_split
from vlsens.data.samples import Samples
from vlsens.export.towers.base import Tower

log = logging.getLogger(__name__)


#: Qwen3-VL's embeds graph also takes the DeepStack maps, dense (K, B, S, D), zero off the visual tokens.
DEEPSTACK = "deepstack_embeds"


def deepstack_of(model) -> int:
    from vlsens.model.family import deepstack_count

    return deepstack_count(model.config.vision_config)


def text_position_ids_np(attention_mask: np.ndarray) -> np.ndarray:
    pos = np.cumsum(attention_mask.astype(np.int64), axis=-1) - 1
    pos[attention_mask == 0] = 1
    return np.broadcast_to(pos[None], (3, *pos.shape)).copy()


def chat_prompt(processor, prompt: str, with_image: bool, media: str = "image", count: int = 1) -> str:
    """The chat template's text for one user turn: ``count`` ``media`` placeholders (with
    ``with_image``) before the prompt."""
    content = ([{"type": media}] * count if with_image else []) + [{"type": "text", "text": prompt}]
    return processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def text_batch(processor, prompts: Sequence[str], repeat: int = 1) -> dict[str, np.ndarray]:
    """Left-padded chat-formatted prompts (``repeat`` lengthens each prompt's text)."""
    tok = processor.tokenizer
    tok.padding_side = "left"
    texts = [chat_prompt(processor, " ".join([p] * repeat), with_image=False) for p in prompts]
    enc = tok(texts, return_tensors="np", padding=True)
    return {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}


def multimodal_inputs(processor, images, prompts: Sequence[str], height: int, width: int, per_prompt: int = 1) -> dict:
    """Processor output for image+prompt pairs at ``height`` x ``width`` (left padded): ``images``
    in prompt order, ``per_prompt`` of them for each prompt."""
    from vlsens.data.images import resize_exact

    processor.tokenizer.padding_side = "left"
    texts = [chat_prompt(processor, p, with_image=True, count=per_prompt) for p in prompts]
    resample = getattr(processor.image_processor, "resample", None)
    pil = [resize_exact(im, height, width, resample) for im in images]
    return processor(text=texts, images=pil, return_tensors="pt", padding=True, do_resize=False)


#: Frames per second the synthetic clips stand for (Qwen2.5-VL's default video sampling rate).
VIDEO_FPS = 2.0


def video_inputs(processor, image, prompt: str, frames: int, height: int, width: int) -> dict:
    """Model inputs for a video+prompt chat: a clip of ``frames`` shifted copies of ``image``
    (:func:`vlsens.data.images.shifted_clip`), each frame through the image processor and laid out as
    the video processor does (:func:`vlsens.model.vision.patchify_frames`: ``grid_t = frames / 2``), the
    chat template's video placeholder expanded to the clip's merged tokens, and -- as the
    Qwen2.5-VL processor computes it -- ``second_per_grid_ts = temporal_patch_size / fps``
    (:data:`VIDEO_FPS`), which sets the temporal rope positions. Torch tensors, batch 1."""
    import torch

    from vlsens.model.vision import Geometry, clip_frames, patchify_frames

    ip = processor.image_processor
    geom = Geometry(int(ip.patch_size), int(ip.merge_size), int(ip.temporal_patch_size))
    pv, grid = patchify_frames(clip_frames(ip, image, frames, height, width), geom)
    n_tokens = int(grid.prod()) // geom.merge_size ** 2
    tok = processor.tokenizer
    text = chat_prompt(processor, prompt, True, media="video").replace(processor.video_token,
                                                                       processor.video_token * n_tokens)
    ids = tok([text], return_tensors="np")["input_ids"].astype(np.int64)
    mm = np.where(ids == processor.video_token_id, 2, np.where(ids == processor.image_token_id, 1, 0))
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.ones(ids.shape, dtype=torch.int64),
           "mm_token_type_ids": torch.from_numpy(mm.astype(np.int64)),
           "pixel_values_videos": torch.from_numpy(pv), "video_grid_thw": torch.from_numpy(grid)}
    if "second_per_grid_ts" in getattr(processor, "model_input_names", []):
        out["second_per_grid_ts"] = torch.tensor([geom.temporal_patch_size / VIDEO_FPS] * len(grid))
    return out


def merged_embeds(model, inputs, video: bool = False) -> dict[str, np.ndarray]:
    """The embeds graph's inputs for processor output ``inputs``: ``inputs_embeds`` with the vision
    features in the image-token slots (``video``: the video-token slots of
    ``pixel_values_videos``), the 3-D mRoPE ``position_ids`` (with ``second_per_grid_ts`` for
    video), the ``attention_mask`` and, for Qwen3-VL, the dense ``deepstack_embeds`` -- computed
    with transformers' own functions (the pieces the embeds graph leaves outside)."""
    import torch

    from vlsens.model.family import dense_deepstack

    m = model.model
    with torch.no_grad():
        embeds = m.get_input_embeddings()(inputs["input_ids"])
        if video:
            feats = m.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"], return_dict=True)
        else:
            feats = m.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True)
        vis = torch.cat(feats.pooler_output, dim=0).to(embeds.dtype)
        masks = m.get_placeholder_mask(inputs["input_ids"], inputs_embeds=embeds,
                                       **({"video_features": vis} if video else {"image_features": vis}))
        mask = masks[1] if video else masks[0]
        embeds = embeds.masked_scatter(mask, vis)
        rope = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in inputs}
        pos, _ = m.get_rope_index(inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                  mm_token_type_ids=inputs["mm_token_type_ids"], **rope)
    out = {"inputs_embeds": embeds.numpy().astype(np.float32),
           "attention_mask": inputs["attention_mask"].numpy().astype(np.int64),
           "position_ids": pos.numpy().astype(np.int64)}
    if deepstack_of(model):
        maps = [torch.cat(list(f), dim=0).numpy() for f in feats.deepstack_features]
        out[DEEPSTACK] = dense_deepstack(maps, mask[..., 0].numpy())
    return out


def text_only_feeds(model, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The embeds graph's inputs for a text-only batch (DeepStack maps all zero: no visual token)."""
    import torch

    with torch.no_grad():
        embeds = model.model.language_model.embed_tokens(torch.from_numpy(ids)).numpy().astype(np.float32)
    out = {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": text_position_ids_np(mask)}
    if k := deepstack_of(model):
        out[DEEPSTACK] = np.zeros((k, *embeds.shape), dtype=np.float32)
    return out


#: The config's ids of the tokens that stand for media (placeholders and their delimiters).
MEDIA_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def text_positions(input_ids: np.ndarray, attention_mask: np.ndarray, media_ids) -> np.ndarray:
    """The positions whose logits a user reads: real tokens whose next token is text (not an image
    or video placeholder or delimiter), and every sequence's last position (the answer's first
    token). Teacher-forced logits at an image's placeholders are never sampled; counted, they would
    dilute a per-token error with positions no answer depends on."""
    ids = np.asarray(input_ids)
    nxt_media = np.zeros(ids.shape, dtype=bool)
    nxt_media[..., :-1] = np.isin(ids[..., 1:], np.asarray(list(media_ids), dtype=ids.dtype))
    return np.asarray(attention_mask).astype(bool) & ~nxt_media


def text_calibration(checkpoint: str | Path, samples: Sequence[PromptSample], height: int, width: int,
                     n_calib: int, n_eval: int, seed: int = 0) -> CalibrationSet:
    """Feeds for ``embeds.onnx``, one sequence per sample: merged ``inputs_embeds`` (real vision
    features for image+prompt samples), ``attention_mask``, 3-D ``position_ids``; the positions
    that count are those a user reads (:func:`text_positions`). The splits are stratified by
    modality (:func:`vlsens.data.prompts.stratified_split`): each holds text, one-image and
    two-image prompts. Manifest entries: prompt, modality, images (+ sha256), tokens."""

    from vlsens.core.job import Progress
    from vlsens.data.images import header, open_rgb
    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    split = stratified_split(samples, n_calib, n_eval, seed)
    model = load_model(checkpoint, attn_implementation="eager")
    processor = load_processor(checkpoint)
    media = [int(getattr(model.config, k)) for k in MEDIA_TOKEN_KEYS if getattr(model.config, k, None) is not None]
    splits, entries = {}, []
    progress = Progress("calibration", n_calib + n_eval, "samples")
    for name, idx in split.items():
        feeds, names, valid = [], [], []
        for j, i in enumerate(idx):
            s = samples[i]
            if s.images:
                inputs = multimodal_inputs(processor, [open_rgb(x) for x in s.images], [s.prompt], height, width,
                                           per_prompt=len(s.images))
                feed = merged_embeds(model, inputs)
            else:
                batch = text_batch(processor, [s.prompt])
                feed = text_only_feeds(model, batch["input_ids"], batch["attention_mask"])
            mask = feed["attention_mask"]
            ids = np.asarray(inputs["input_ids"] if s.images else batch["input_ids"])
            valid.append(text_positions(ids, mask, media))
            feeds.append(feed)
            names.append(s.name)
            progress.step()
            entries.append({
                "name": s.name, "prompt": s.prompt, "split": name, "index": j, "tokens": int(mask.sum()),
                "measured": int(valid[-1].sum()),
                "modality": s.modality,
                "image": None if s.image is None else {"source": str(s.image.path), "sha256": s.image.sha256(),
                                                      **header(s.image)},
                "images": [{"source": str(x.path), "sha256": x.sha256(), **header(x)} for x in s.images],
            })
        splits[name] = Samples(feeds, valid, names)
    return CalibrationSet(splits, entries, {"image_size": [height, width], "seed": seed})


# ----------------------------------------------------------------------------------------------
# The tower


class PromptTower(Tower):
    """What the language-model towers (``text``, ``decoder``) share: logits out, layers as blocks,
    the text plant, and the calibration sequences of ``text.calibration`` (the decoder's in prefill
    form)."""

    logits = True
    block_label = "layer"

    def planted_site(self, preset: dict) -> tuple[int, str] | None:
        o = preset.get("text_outlier")  # up_proj rows x scale, down_proj columns / scale: down_proj reads it
        return (int(o["layer"]), "mlp.down_proj") if o else None

    def calibration_settings(self) -> dict:
        c = self.config["text"]["calibration"]
        return {**{k: c[k] for k in ("prompts", "image_size", "num_calib", "num_eval", "seed")},
                "skip_unreadable": self.config["calibration"]["skip_unreadable"]}

    def outside_inputs(self, plan) -> dict:
        """``text.calibration.prompts`` when it is a JSONL (not ``builtin``), with the images it names."""
        spec = str(self.config["text"]["calibration"]["prompts"])
        if spec == "builtin":
            return {}
        samples = load_prompt_samples(spec, plan.calib_images, key="text.calibration.prompts")
        found = {str(x.path): x for s in samples for x in s.images}
        return {"text_prompts": (spec, [found[k] for k in sorted(found)])}

    def calibration_inputs(self, model, manifests) -> dict:
        out = {"images": manifests["calibration_images"]}
        if "text_prompts" in manifests:  # a JSONL and the images it names
            out["prompts"] = manifests["text_prompts"]
        return out

    def prompt_calibration(self, checkpoint, inputs: dict, settings: dict) -> CalibrationSet:
        """The prompt samples through the text graph's inputs."""
        from vlsens.data.calibration import load_images
        from vlsens.data.inputs import image_refs

        images = load_images(image_refs(inputs["images"]), settings["skip_unreadable"])[0]
        samples = load_prompt_samples(str(settings["prompts"]), images)
        h, w = parse_size(settings["image_size"], key="text.calibration.image_size", **self.size_rule)
        return text_calibration(checkpoint, samples, h, w, settings["num_calib"], settings["num_eval"],
                                settings["seed"])
