"""The text tower (``language_model`` + ``lm_head``): reference, ONNX export and parity.

Two graphs per variant folder ``results/<model>/text/<variant>/``, both with dynamic batch and
sequence axes and ``logits`` (B, S, vocab) as output:

``model.onnx``   ``input_ids`` (B, S) int64, ``attention_mask`` (B, S) int64
``embeds.onnx``  ``inputs_embeds`` (B, S, hidden) float32, ``attention_mask`` (B, S) int64,
                 ``position_ids`` (3, B, S) int64 -- vision features are merged outside (the
                 checkpoint's own placeholder tokens replaced by the vision graph's output),
                 with the matching 3-D mRoPE positions (``get_rope_index``).

Robust to the known export failure: public reports of "blocked upstream" text export trace it to
transformers' mask creation (``_Map_base::at`` / ``unordered_map::at`` in the TorchScript exporter,
"is not tracked with proxy" in dynamo). The wrappers here build the 4-D additive causal+padding
mask themselves (transformers uses a 4-D mask as is) and pass explicit 3-D position ids, so
``masking_utils`` never runs inside the trace. ``model.onnx`` computes text positions from the
mask (cumsum - 1, as ``get_rope_index`` does for text), so left padding gives the same logits at
real tokens as no padding.

Parity: against transformers' full ``Qwen2_5_VLForConditionalGeneration`` forward (its own mask
creation, eager attention) at two sequence lengths with left padding, padded positions excluded;
and the embeds graph on image+prompt inputs whose reference is the model's own multimodal forward
(processor output in, transformers merges and positions itself).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from vlsens.errors import VlsensError
from vlsens.fsutil import publish, staging_dir, write_json
from vlsens.onnxutil import check_model, data_path, make_session, resave
from vlsens.samples import CaseStore

log = logging.getLogger(__name__)

GRAPHS = {"model.onnx": ("input_ids", "attention_mask"),
          "embeds.onnx": ("inputs_embeds", "attention_mask", "position_ids")}

#: Prompts shipped with vlsens (parity and the default text calibration set).
BUILTIN_PROMPTS = [
    "Describe this image in detail.",
    "What is in the picture?",
    "How many objects are there, and what colour are they?",
    "Answer in one short sentence: is it day or night?",
    "Read the text in the image.",
    "Where is the person looking?",
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Describe the scene, the colours and the objects you can see.",
]


# ----------------------------------------------------------------------------------------------
# Mask and positions (the pieces that keep transformers' mask creation out of the trace)


def causal_padding_mask(attention_mask, dtype):
    """(B, S) 0/1 -> (B, 1, S, S) additive mask: 0 where query i may attend key j (j <= i and j
    is a real token), -65504 elsewhere. That is float16's lowest finite value: the same graph
    converts to FP16 without the constant turning into -inf (a fully padded query row would then
    be NaN, and 0 x NaN spreads it to every position), and exp(-65504 + score) is exactly 0 in
    float32 too, so real positions match transformers' own mask (float32's min) exactly."""
    import torch

    s = attention_mask.shape[-1]
    idx = torch.arange(s, device=attention_mask.device)
    causal = idx[None, :] <= idx[:, None]  # (S, S) key <= query
    allowed = causal[None, None, :, :] & (attention_mask[:, None, None, :] > 0)
    zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
    low = torch.full((), torch.finfo(torch.float16).min, dtype=dtype, device=attention_mask.device)
    return torch.where(allowed, zero, low)


def text_position_ids(attention_mask):
    """(B, S) -> (3, B, S): text positions counted over real tokens (padding gets 1), as
    ``get_rope_index`` does for text-only rows."""
    pos = attention_mask.long().cumsum(-1) - 1
    pos = pos.masked_fill(attention_mask == 0, 1)
    return pos.unsqueeze(0).expand(3, -1, -1)


def text_position_ids_np(attention_mask: np.ndarray) -> np.ndarray:
    pos = np.cumsum(attention_mask.astype(np.int64), axis=-1) - 1
    pos[attention_mask == 0] = 1
    return np.broadcast_to(pos[None], (3, *pos.shape)).copy()


def _wrappers(model):
    import torch

    lm, head = model.model.language_model, model.lm_head

    def logits(embeds, attention_mask, position_ids):
        mask = causal_padding_mask(attention_mask, embeds.dtype)
        out = lm(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids, use_cache=False)
        return head(out.last_hidden_state)

    # Attribute names give the exported nodes transformers-like names
    # (/language_model/layers.0/mlp/down_proj/MatMul, /lm_head/MatMul).
    class Ids(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.language_model, self.lm_head = lm, head

        def forward(self, input_ids, attention_mask):
            return logits(lm.embed_tokens(input_ids), attention_mask, text_position_ids(attention_mask))

    class Embeds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.language_model, self.lm_head = lm, head

        def forward(self, inputs_embeds, attention_mask, position_ids):
            return logits(inputs_embeds, attention_mask, position_ids)

    return {"model.onnx": Ids().eval(), "embeds.onnx": Embeds().eval()}


# ----------------------------------------------------------------------------------------------
# Reference


class TextReference(CaseStore):
    """Inputs and transformers' logits for the text graphs (``reference.npz``): per case the
    graph it feeds (``graph``), that graph's inputs and ``logits``."""

    def feeds(self, case: str) -> dict[str, np.ndarray]:
        graph = str(self.cases[case]["graph"])
        return {k: self.cases[case][k] for k in GRAPHS[graph]}


def chat_prompt(processor, prompt: str, with_image: bool) -> str:
    content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": prompt}]
    return processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def text_batch(processor, prompts: Sequence[str], repeat: int = 1) -> dict[str, np.ndarray]:
    """Left-padded chat-formatted prompts (``repeat`` lengthens each prompt's text)."""
    tok = processor.tokenizer
    tok.padding_side = "left"
    texts = [chat_prompt(processor, " ".join([p] * repeat), with_image=False) for p in prompts]
    enc = tok(texts, return_tensors="np", padding=True)
    return {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}


def multimodal_inputs(processor, images, prompts: Sequence[str], height: int, width: int) -> dict:
    """Processor output for image+prompt pairs at ``height`` x ``width`` (left padded)."""
    from vlsens.images import resize_exact

    processor.tokenizer.padding_side = "left"
    texts = [chat_prompt(processor, p, with_image=True) for p in prompts]
    resample = getattr(processor.image_processor, "resample", None)
    pil = [resize_exact(im, height, width, resample) for im in images]
    return processor(text=texts, images=pil, return_tensors="pt", padding=True, do_resize=False)


def merged_embeds(model, inputs) -> tuple[np.ndarray, np.ndarray]:
    """``inputs_embeds`` with the vision features in the image-token slots and the 3-D mRoPE
    position ids, computed with transformers' own functions (the pieces the embeds graph leaves
    outside)."""
    import torch

    m = model.model
    with torch.no_grad():
        embeds = m.get_input_embeddings()(inputs["input_ids"])
        feats = m.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True)
        image_embeds = torch.cat(feats.pooler_output, dim=0).to(embeds.dtype)
        mask, _ = m.get_placeholder_mask(inputs["input_ids"], inputs_embeds=embeds, image_features=image_embeds)
        embeds = embeds.masked_scatter(mask, image_embeds)
        pos, _ = m.get_rope_index(inputs["input_ids"], image_grid_thw=inputs["image_grid_thw"],
                                  attention_mask=inputs["attention_mask"],
                                  mm_token_type_ids=inputs["mm_token_type_ids"])
    return embeds.numpy().astype(np.float32), pos.numpy().astype(np.int64)


def compute_text_reference(checkpoint: str | Path, image_refs, prompts: Sequence[str], lengths: Sequence[int],
                           height: int = 224, width: int = 224) -> TextReference:
    """transformers' logits for: text-only batches at each of ``lengths`` (prompt repeats, left
    padded, two prompts of different lengths per batch) and an image+prompt batch (two images)."""
    import torch

    from vlsens.checkpoint import load_model, load_processor
    from vlsens.images import open_rgb

    model = load_model(checkpoint, attn_implementation="eager")
    processor = load_processor(checkpoint)
    ref = TextReference()
    for n in lengths:
        batch = text_batch(processor, prompts[:2], repeat=n)
        ids, mask = (torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask"))
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=text_position_ids(mask),
                           use_cache=False).logits
        ref.cases[f"text-x{n}"] = {"graph": np.array("model.onnx"), **batch, "logits": logits.numpy()}
    if image_refs:
        images = [open_rgb(r) for r in image_refs[:2]]
        inputs = multimodal_inputs(processor, images, prompts[:len(images)], height, width)
        with torch.no_grad():  # the model's own multimodal forward: it merges and positions itself
            logits = model(**inputs, use_cache=False).logits
        embeds, pos = merged_embeds(model, inputs)
        ref.cases["image+prompt"] = {"graph": np.array("embeds.onnx"), "inputs_embeds": embeds,
                                     "attention_mask": inputs["attention_mask"].numpy().astype(np.int64),
                                     "position_ids": pos, "logits": logits.numpy()}
    return ref


# ----------------------------------------------------------------------------------------------
# Export


def _export_one(module, example: tuple, names: Sequence[str], path: Path, exporter: str, opset: int) -> None:
    import torch

    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
           "inputs_embeds": {0: "batch", 1: "sequence"}, "position_ids": {1: "batch", 2: "sequence"},
           "logits": {0: "batch", 1: "sequence"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if exporter == "legacy":
            torch.onnx.export(module, example, str(path), dynamo=False, opset_version=opset,
                              input_names=list(names), output_names=["logits"],
                              dynamic_axes={k: dyn[k] for k in (*names, "logits")}, do_constant_folding=True)
        elif exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
            shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
                      "inputs_embeds": {0: batch, 1: seq}, "position_ids": {1: batch, 2: seq}}
            prog = torch.onnx.export(module, example, dynamo=True, opset_version=opset, input_names=list(names),
                                     output_names=["logits"], dynamic_shapes={k: shapes[k] for k in names},
                                     external_data=True)
            prog.save(str(path), external_data=True)
        else:
            raise VlsensError(f"text.exporter: '{exporter}' unknown (legacy, dynamo)")


def export_text(checkpoint: str | Path, reference_path: str | Path, out_dir: str | Path, tolerance: dict,
                exporter: str = "legacy", fallback: bool = True, opset: int = 19, threads: int = 0,
                device: str = "auto") -> dict:
    """Export both text graphs (``exporter``, the other one as fallback on failure, recorded),
    gate them against the reference and publish them with one ``parity.json``."""
    import torch

    from vlsens.checkpoint import load_model

    out_dir = Path(out_dir)
    ref = TextReference.load(reference_path)
    model = load_model(checkpoint, attn_implementation="eager")
    wrappers = _wrappers(model)
    examples = {}
    for case, arrays in ref.cases.items():
        graph = str(arrays["graph"])
        examples.setdefault(graph, tuple(torch.from_numpy(arrays[k]) for k in GRAPHS[graph]))
    missing = set(GRAPHS) - set(examples)
    if missing:
        raise VlsensError(f"{reference_path}: no reference case for {sorted(missing)}")
    order = [exporter] + ([e for e in ("legacy", "dynamo") if e != exporter] if fallback else [])
    with staging_dir(out_dir / "model.onnx") as tmp:
        staged, used = {}, {}
        for graph, module in wrappers.items():
            errors = []
            for exp in order:
                raw = tmp / f"raw-{exp}" / graph
                try:
                    _export_one(module, examples[graph], GRAPHS[graph], raw, exp, opset)
                    staged[graph] = resave(raw, tmp / graph)
                    used[graph] = {"exporter": exp, "failed": errors}
                    break
                except Exception as e:  # noqa: BLE001  (exporters raise many types)
                    log.warning("text export of %s with %s failed: %s", graph, exp, str(e)[:300])
                    errors.append({"exporter": exp, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            else:
                raise VlsensError(f"text export of {graph} failed with every exporter: {errors}")
            check_model(staged[graph])
        del model, wrappers
        extra = {"exporters": used, "opset": opset, "attn_implementation": "eager",
                 "mask": "4-D additive causal+padding mask built in the wrapper; explicit 3-D position ids"}
        record = check_text(staged, ref, tolerance, "fp32", threads=threads, device=device, extra=extra,
                            artifact=out_dir)
        publish_text(staged, record, out_dir)
    return record


def publish_text(staged: dict[str, Path], record: dict, out_dir: Path) -> None:
    """Data files, parity.json, embeds.onnx, then model.onnx (the rule's main output) last."""
    from vlsens.artifacts import file_entries

    stage = next(iter(staged.values())).parent
    record["files"] = file_entries(staged.values())
    write_json(stage / "parity.json", record)
    files = {}
    for graph, p in staged.items():
        files[out_dir / data_path(Path(graph)).name] = data_path(p)
    files[out_dir / "parity.json"] = stage / "parity.json"
    for graph, p in staged.items():
        files[out_dir / graph] = p
    publish(files, last=out_dir / "model.onnx")


def _variant_stage(src_dir: str | Path, reference_path: str | Path, out_dir: str | Path, tolerance: dict,
                   variant: str, make, threads: int = 0, device: str = "auto") -> dict:
    """Shared body of the FP16 and simplify stages: ``make(src, feeds, staged) -> extra`` per
    graph, then the parity gate on both graphs and one publish."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    ref = TextReference.load(reference_path)
    with staging_dir(out_dir / "model.onnx") as tmp:
        staged, extras = {}, {}
        for graph in GRAPHS:
            feeds = [ref.feeds(c) for c, a in ref.cases.items() if str(a["graph"]) == graph]
            staged[graph] = tmp / graph
            extras[graph] = make(src_dir / graph, feeds, staged[graph])
        record = check_text(staged, ref, tolerance, variant, threads=threads, device=device,
                            extra={"graphs": extras, "source": str(src_dir)}, artifact=out_dir)
        publish_text(staged, record, out_dir)
    return record


def text_fp16(src_dir: str | Path, reference_path: str | Path, out_dir: str | Path, tolerance: dict,
              max_activation: float, max_initializer: float, threads: int = 0, device: str = "auto") -> dict:
    """FP16 variants of both text graphs (range-based FP32 fallback measured on the parity
    inputs: the additive mask's huge negative values keep the mask arithmetic in FP32)."""
    from vlsens.fp16 import convert_fp16

    return _variant_stage(src_dir, reference_path, out_dir, tolerance, "fp16",
                          lambda src, feeds, staged: convert_fp16(src, feeds, staged, max_activation, max_initializer,
                                                                  threads, device), threads, device)


def text_simplify(src_dir: str | Path, reference_path: str | Path, out_dir: str | Path, tolerance: dict,
                  variant: str, check_max_bytes: int, threads: int = 0, device: str = "auto") -> dict:
    from vlsens.simplify import simplify_model

    return _variant_stage(src_dir, reference_path, out_dir, tolerance, variant,
                          lambda src, feeds, staged: simplify_model(src, feeds[0], staged, check_max_bytes),
                          threads, device)


# ----------------------------------------------------------------------------------------------
# Parity


def compare_logits(actual: np.ndarray, expected: np.ndarray, attention_mask: np.ndarray) -> dict:
    """Metrics over real (non-padded) positions only: padded query rows attend to nothing and are
    implementation-defined."""
    from vlsens.parity import compare

    keep = attention_mask.astype(bool)
    a, b = actual[keep], expected[keep]
    m = compare(a, b)
    m["top1_agreement"] = float(np.mean(a.argmax(-1) == b.argmax(-1))) if len(a) else 1.0
    m["positions"] = int(keep.sum())
    return m


def check_text(models: dict[str, Path], ref: TextReference, tolerance: dict, variant: str, threads: int = 0,
               device: str = "auto", extra: dict | None = None, artifact: str | Path | None = None) -> dict:
    """Parity record of both graphs against the reference; raises :class:`ParityError` on a miss."""
    from vlsens.parity import gate, make_record

    per_input, providers = [], []
    for case, arrays in ref.cases.items():
        graph = str(arrays["graph"])
        sess = make_session(models[graph], threads=threads, device=device)
        providers = sess.get_providers()
        out = sess.run(["logits"], ref.feeds(case))[0]
        m = compare_logits(out, arrays["logits"], arrays["attention_mask"])
        per_input.append({"image": case, "graph": graph, "sha256": "",
                          "shape": list(arrays["attention_mask"].shape), **m})
        del sess
    record = make_record(
        artifact or next(iter(models.values())), variant, per_input, tolerance,
        reference="transformers Qwen2_5_VLForConditionalGeneration logits (PyTorch, float32, eager), real tokens only",
        inputs=[{"case": p["image"], "graph": p["graph"], "shape": p["shape"]} for p in per_input],
        input_shape=[p["shape"] for p in per_input], providers=providers, extra=extra,
    )
    record["metrics"]["min_top1_agreement"] = min(p["top1_agreement"] for p in per_input)
    gate(record)
    return record



# ----------------------------------------------------------------------------------------------
# Text calibration: prompts (and images) through the checkpoint's processor


@dataclass
class PromptSample:
    prompt: str
    image: object | None  # ImageRef
    name: str


def builtin_samples(images: Sequence) -> list[PromptSample]:
    """Every builtin prompt twice: with an image (cycled through ``images``) and text-only, so
    the text tower sees multimodal and plain activations."""
    out = []
    for i, p in enumerate(BUILTIN_PROMPTS):
        if images:
            out.append(PromptSample(p, images[i % len(images)], f"image-{i:02d}"))
        out.append(PromptSample(p, None, f"text-{i:02d}"))
    return out


def load_prompt_samples(spec: str, images: Sequence = (), key: str = "text.calibration.prompts") -> list[PromptSample]:
    """``builtin`` or a JSONL file of ``{"image": <path or null>, "prompt": "..."}`` (image paths
    relative to the file). Errors name the file and line."""
    import json

    from vlsens.errors import ConfigError
    from vlsens.images import ImageRef

    if spec == "builtin":
        return builtin_samples(images)
    path = Path(spec)
    if path.suffix != ".jsonl" or not path.is_file():
        raise ConfigError(f"{key}: '{spec}' is neither 'builtin' nor an existing .jsonl file of "
                          '{"image": <path or null>, "prompt": "..."} lines.')
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{key}: {path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg}); each line is "
                              '{"image": <path or null>, "prompt": "..."}') from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise ConfigError(f'{where}: needs a non-empty "prompt" string (and optionally "image": <path or null>)')
        img = obj.get("image")
        ref = None
        if img:
            p = Path(img) if Path(img).is_absolute() else path.parent / img
            if not p.is_file():
                raise ConfigError(f"{where}: image {img} not found (paths are relative to {path.parent})")
            ref = ImageRef(p, p.stem)
        out.append(PromptSample(obj["prompt"], ref, f"line-{n:04d}"))
    if not out:
        raise ConfigError(f"{key}: {path} has no samples")
    return out


def build_text_calibration(checkpoint: str | Path, samples: Sequence[PromptSample], height: int, width: int,
                           out_dir: str | Path, n_calib: int, n_eval: int, seed: int = 0) -> dict:
    """``calib.npz`` / ``eval.npz`` for ``embeds.onnx`` (one sequence per sample: merged
    ``inputs_embeds`` with real vision features for image+prompt samples, ``attention_mask``,
    3-D ``position_ids``) and ``manifest.json`` (prompt, image + sha256, tokens, split)."""
    import random

    import torch

    from vlsens.checkpoint import load_model, load_processor
    from vlsens.errors import ImageError
    from vlsens.images import header, open_rgb
    from vlsens.samples import Samples

    if len(samples) < n_calib + n_eval:
        raise ImageError(f"text calibration: {n_calib} + {n_eval} samples requested but only {len(samples)} given; "
                         "lower text.calibration.num_calib / num_eval or add prompts.")
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    split = {"calib": sorted(order[:n_calib]), "eval": sorted(order[n_calib:n_calib + n_eval])}
    model = load_model(checkpoint, attn_implementation="eager")
    processor = load_processor(checkpoint)
    lm = model.model.language_model
    out_dir = Path(out_dir)
    manifest = {"image_size": [height, width], "seed": seed, "samples": [],
                "counts": {k: len(v) for k, v in split.items()}}
    with staging_dir(out_dir / "manifest.json") as tmp:
        for name, idx in split.items():
            feeds, names = [], []
            for j, i in enumerate(idx):
                s = samples[i]
                if s.image is not None:
                    inputs = multimodal_inputs(processor, [open_rgb(s.image)], [s.prompt], height, width)
                    embeds, pos = merged_embeds(model, inputs)
                    mask = inputs["attention_mask"].numpy().astype(np.int64)
                else:
                    batch = text_batch(processor, [s.prompt])
                    mask = batch["attention_mask"]
                    with torch.no_grad():
                        embeds = lm.embed_tokens(torch.from_numpy(batch["input_ids"])).numpy().astype(np.float32)
                    pos = text_position_ids_np(mask)
                feeds.append({"inputs_embeds": embeds, "attention_mask": mask, "position_ids": pos})
                names.append(s.name)
                manifest["samples"].append({
                    "name": s.name, "prompt": s.prompt, "split": name, "index": j, "tokens": int(mask.sum()),
                    "image": None if s.image is None else {"source": str(s.image.path), "sha256": s.image.sha256(),
                                                          **header(s.image)},
                })
            Samples(feeds, [f["attention_mask"].astype(bool) for f in feeds], names).save_feeds(tmp / f"{name}.npz")
        write_json(tmp / "manifest.json", manifest)
        publish({out_dir / f: tmp / f for f in ("calib.npz", "eval.npz", "manifest.json")},
                last=out_dir / "manifest.json")
    if not any(s["image"] for s in manifest["samples"]):
        log.warning("text calibration has no image+prompt sample: the text tower sees text activations only")
    log.info("text calibration: %s", manifest["counts"])
    return manifest
