"""Tower ``text``: the language model (``language_model`` + ``lm_head``), graph ``text``.

Two graphs per variant folder ``results/<model>/text/<variant>/``, both with dynamic batch and
sequence axes and ``logits`` (B, S, vocab) as output:

``model.onnx``   ``input_ids`` (B, S) int64, ``attention_mask`` (B, S) int64
``embeds.onnx``  ``inputs_embeds`` (B, S, hidden) float32, ``attention_mask`` (B, S) int64,
                 ``position_ids`` (3, B, S) int64 -- vision features are merged outside (the
                 checkpoint's own placeholder tokens replaced by the vision graph's output),
                 with the matching 3-D mRoPE positions (``get_rope_index``). Qwen3-VL's also
                 takes ``deepstack_embeds`` (K, B, S, hidden) float32: its vision tower's DeepStack
                 maps at the visual token positions, zero elsewhere (:mod:`vlsens.model.family`); the
                 wrapper adds map i after decoder layer i, as transformers does at those positions.

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
(processor output in, transformers merges and positions itself), and on video+prompt inputs
(``text.parity.video_cases``: a synthetic clip, :func:`video_inputs`, Qwen2.5-VL's
``second_per_grid_ts`` in the temporal positions).

Calibration (``embeds.onnx``, which the sensitivity engine and the profile take): one sequence
per prompt sample (:mod:`vlsens.data.prompts`) through the checkpoint's processor and chat template;
image+prompt samples carry the real vision features in the image-token slots and their 3-D
positions. Only real tokens count in every comparison.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from vlsens.config import check_variants
from vlsens.core.errors import ConfigError, VlsensError
from vlsens.core.sizes import parse_size
from vlsens.data.calibration import CalibrationSet
from vlsens.data.cases import Case, Cases
from vlsens.data.prompts import BUILTIN_PROMPTS, load_prompt_samples, stratified_split
from vlsens.export.towers.prompts import (
    DEEPSTACK,
    PromptTower,
    deepstack_of,
    merged_embeds,
    multimodal_inputs,
    text_batch,
    video_inputs,
)

log = logging.getLogger(__name__)

GRAPHS = {"model.onnx": ("input_ids", "attention_mask"),
          "embeds.onnx": ("inputs_embeds", "attention_mask", "position_ids")}
SOURCE = "transformers {cls} logits (PyTorch, float32, eager), real tokens only"


def graph_inputs(deepstack: int) -> dict[str, tuple[str, ...]]:
    """Input names of each graph file (``deepstack``: the number of DeepStack maps, 0 but Qwen3-VL)."""
    return {**GRAPHS, "embeds.onnx": GRAPHS["embeds.onnx"] + ((DEEPSTACK,) if deepstack else ())}


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


def _wrappers(model):
    import torch

    lm, head = model.model.language_model, model.lm_head
    k = deepstack_of(model)
    if k:
        # DeepStack as a dense add: transformers adds map i at the visual positions after layer i
        # (hidden[mask] += map); the graph's input is zero elsewhere, so adding it everywhere is the same.
        lm._deepstack_process = lambda hidden, _mask, embeds: hidden + embeds

    def logits(embeds, attention_mask, position_ids, deepstack=None):
        mask = causal_padding_mask(attention_mask, embeds.dtype)
        extra = {} if deepstack is None else {"deepstack_visual_embeds": [deepstack[i] for i in range(k)]}
        out = lm(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids, use_cache=False, **extra)
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

    class EmbedsDeepStack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.language_model, self.lm_head = lm, head

        def forward(self, inputs_embeds, attention_mask, position_ids, deepstack_embeds):
            return logits(inputs_embeds, attention_mask, position_ids, deepstack_embeds)

    return {"model.onnx": Ids().eval(), "embeds.onnx": (EmbedsDeepStack() if k else Embeds()).eval()}


# ----------------------------------------------------------------------------------------------
# Reference


def compute_text_reference(checkpoint: str | Path, image_refs, prompts: Sequence[str], lengths: Sequence[int],
                           height: int = 224, width: int = 224, clips: Sequence = ()) -> Cases:
    """transformers' logits for: text-only batches at each of ``lengths`` (prompt repeats, left
    padded, two prompts of different lengths per batch; ``model.onnx``), an image+prompt batch
    (two images; ``embeds.onnx``) and, per clip ``(frames, (H, W))``, a video+prompt sequence
    (:func:`video_inputs`; ``embeds.onnx``). Only real tokens count."""
    import torch

    from vlsens.data.images import open_rgb
    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    # Without images the vision tower is not needed: it is not loaded (4 bytes a parameter saved).
    model = load_model(checkpoint, attn_implementation="eager", part=None if image_refs else "text")
    processor = load_processor(checkpoint)
    cases = Cases(source=SOURCE.format(cls=type(model).__name__))
    for n in lengths:
        batch = text_batch(processor, prompts[:2], repeat=n)
        ids, mask = (torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask"))
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=text_position_ids(mask),
                           use_cache=False).logits
        cases.add(Case(f"text-x{n}", "model.onnx", batch, logits.numpy(), batch["attention_mask"].astype(bool),
                       logits=True))
    if image_refs:
        images = [open_rgb(r) for r in image_refs[:2]]
        inputs = multimodal_inputs(processor, images, prompts[:len(images)], height, width)
        with torch.no_grad():  # the model's own multimodal forward: it merges and positions itself
            logits = model(**inputs, use_cache=False).logits
        feeds = merged_embeds(model, inputs)
        cases.add(Case("image+prompt", "embeds.onnx", feeds, logits.numpy(), feeds["attention_mask"].astype(bool),
                       logits=True, meta={"images": [r.name for r in image_refs[:2]], "image_size": [height, width]}))
    for n_frames, (h, w) in clips:
        inputs = video_inputs(processor, open_rgb(image_refs[0]), prompts[0], n_frames, h, w)
        with torch.no_grad():
            logits = model(**inputs, use_cache=False).logits
        feeds = merged_embeds(model, inputs, video=True)
        cases.add(Case(f"video{n_frames}+prompt", "embeds.onnx", feeds, logits.numpy(),
                       feeds["attention_mask"].astype(bool), logits=True,
                       meta={"images": [image_refs[0].name], "frames": n_frames, "image_size": [h, w],
                             "second_per_grid_ts": [float(x) for x in inputs.get("second_per_grid_ts", [])]}))
    return cases


# ----------------------------------------------------------------------------------------------
# Export


def _export_one(module, example: tuple, names: Sequence[str], path: Path, exporter: str, opset: int) -> None:
    import torch

    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
           "inputs_embeds": {0: "batch", 1: "sequence"}, "position_ids": {1: "batch", 2: "sequence"},
           DEEPSTACK: {1: "batch", 2: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if exporter == "legacy":
            torch.onnx.export(module, example, str(path), dynamo=False, opset_version=opset,
                              input_names=list(names), output_names=["logits"],
                              dynamic_axes={k: dyn[k] for k in (*names, "logits")}, do_constant_folding=True)
        elif exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
            shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
                      "inputs_embeds": {0: batch, 1: seq}, "position_ids": {1: batch, 2: seq},
                      DEEPSTACK: {1: batch, 2: seq}}
            prog = torch.onnx.export(module, example, dynamo=True, opset_version=opset, input_names=list(names),
                                     output_names=["logits"], dynamic_shapes={k: shapes[k] for k in names},
                                     external_data=True)
            prog.save(str(path), external_data=True)
        else:
            raise VlsensError(f"text.exporter: '{exporter}' unknown (legacy, dynamo)")


# ----------------------------------------------------------------------------------------------
# Calibration


class Text(PromptTower):
    kind = "text"
    pattern = r"text"
    files = ("model.onnx", "embeds.onnx")
    analysed = "embeds.onnx"
    section_key = "text"
    libraries = {"calibration": ("torch", "transformers", "pillow", "numpy")}  # runs the model

    @classmethod
    def graphs(cls, config, spec=None) -> list[str]:
        return ["text"] if config["text"]["enabled"] else []

    def check(self, plan) -> None:
        for sub in ("parity", "calibration"):
            parse_size(str(self.section[sub]["image_size"]), key=f"text.{sub}.image_size", **self.size_rule)
        from vlsens.model.family import for_config

        clips = self.section["parity"]["video_cases"]
        for i, clip in enumerate(clips):
            parse_size(str(clip["size"]), key=f"text.parity.video_cases[{i}].size", **self.size_rule)
        family = for_config(self.config)
        if clips and not family.video_prompt:
            raise ConfigError(f"text.parity.video_cases: video+prompt parity is not built for {family.title}: its "
                              "prompt carries frame timestamps its processor writes; "
                              "set text.parity.video_cases: [] for this checkpoint.")
        check_variants(self.variants(), self.analysed_variants(), self.key("variants"), self.key("sensitivity_variants"))
        cal = self.section["calibration"]
        samples = load_prompt_samples(str(cal["prompts"]), plan.calib_images, key="text.calibration.prompts")
        stratified_split(samples, int(cal["num_calib"]), int(cal["num_eval"]), int(cal["seed"]))

    def profile_settings(self) -> dict:
        return dict(self.section["profile"])

    def reference_settings(self) -> dict:
        p = self.section["parity"]
        return {"repeats": list(p["repeats"]), "image_size": p["image_size"],
                "clips": [[int(c["frames"]), str(c["size"])] for c in p["video_cases"]]}

    def export_settings(self) -> dict:
        return {"exporter": self.exporter(), "fallback": self.section["fallback"],
                "opset": self.config["export"]["opset"]}

    #: ``text.exporter: auto`` takes the legacy exporter up to this many FP32 bytes of language
    #: model and dynamo above: the legacy exporter builds the whole proto in memory (0.7x the
    #: weights on top of the loaded model: about 21 GB at Qwen2.5-VL-3B's 36 layers), dynamo writes
    #: the weights from torch's tensors (the model plus 3.4 GB; docs/real-size.md).
    LEGACY_MAX_BYTES = 6_000_000_000
    lm_fp32_bytes: int | None = None

    def configure(self, facts: dict) -> None:
        self.lm_fp32_bytes = int(facts["lm_fp32_bytes"])

    def exporter(self) -> str:
        """``text.exporter``, ``auto`` resolved by the language model's FP32 size (the plan's
        :func:`~vlsens.dag.plan.model_facts`, when the DAG is built)."""
        choice = self.section["exporter"]
        if choice != "auto":
            return choice
        if self.lm_fp32_bytes is None:
            from vlsens.core.errors import ConfigError

            raise ConfigError("text.exporter: 'auto' needs the model's size, which vlsens.dag.plan.configure gives "
                              "the tower when the DAG is built")
        return "legacy" if self.lm_fp32_bytes <= self.LEGACY_MAX_BYTES else "dynamo"

    def reference(self, checkpoint, images, settings, device="cpu") -> Cases:
        h, w = parse_size(settings["image_size"], key="text.parity.image_size", **self.size_rule)
        clips = [(n, parse_size(s, key="text.parity.video_cases", **self.size_rule))
                 for n, s in settings.get("clips", [])]
        return compute_text_reference(checkpoint, images, BUILTIN_PROMPTS, settings["repeats"], h, w, clips)

    def export(self, checkpoint, cases, workdir, settings):
        """Both graphs with ``exporter``; the other exporter is tried when it fails (``fallback``)
        and the record says which one ran and why the other failed."""
        import torch

        from vlsens.core.onnxutil import resave
        from vlsens.model.loading import load_model

        exporter, opset = settings["exporter"], settings["opset"]
        model = load_model(checkpoint, attn_implementation="eager", part="text")
        wrappers = _wrappers(model)
        names = graph_inputs(deepstack_of(model))
        examples = {}
        for c in cases:
            examples.setdefault(c.graph, tuple(torch.from_numpy(c.inputs[k]) for k in names[c.graph]))
        order = [exporter] + ([e for e in ("legacy", "dynamo") if e != exporter] if settings["fallback"] else [])
        staged, used = {}, {}
        for graph, module in wrappers.items():
            errors = []
            for exp in order:
                raw = workdir / f"raw-{exp}" / graph
                try:
                    _export_one(module, examples[graph], names[graph], raw, exp, opset)
                    staged[graph] = resave(raw, workdir / graph)
                    used[graph] = {"exporter": exp, "failed": errors}
                    break
                except Exception as e:  # noqa: BLE001  (exporters raise many types)
                    log.warning("text export of %s with %s failed: %s", graph, exp, str(e)[:300])
                    errors.append({"exporter": exp, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            else:
                raise VlsensError(f"text export of {graph} failed with every exporter: {errors}")
        return staged, {"exporters": used, "opset": opset, "attn_implementation": "eager",
                        "mask": "4-D additive causal+padding mask built in the wrapper; explicit 3-D position ids"}

    def calibration(self, checkpoint, inputs, settings) -> CalibrationSet:
        return self.prompt_calibration(checkpoint, inputs, settings)
