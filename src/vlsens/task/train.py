"""Training the tiny preset on the visual question task (``make train-tiny``).

The model is transformers' own class for the family, built from random init with the preset's
config and a tokenizer whose merges are learnt from the task (every answer one token); inputs go
through the real processor and chat template, and the loss is the cross-entropy of the answer
token and ``<|im_end|>`` (the prompt is not predicted). AdamW with a linear warm-up and cosine
decay; every batch is drawn from the ``train`` split by its step, so a run is deterministic for
its seed and thread count, and any step's batch can be rebuilt alone.

The checkpoint it writes is complete (config, safetensors, tokenizer, chat template, image
processor) with ``training.json`` beside it: the settings, the loss every ``log_every`` steps and
the greedy accuracy per modality on the ``eval`` split (transformers' ``generate``).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vlsens.task.questions import MODALITIES, Question, question

log = logging.getLogger(__name__)

#: Changes against the family's tiny preset (``vlsens.model.presets.tables``) the trained preset is
#: built with: a wider LM with 32-dim heads, and a rope base at the scale of its positions. With the
#: published base (1e6) the width section of mRoPE (the lowest frequencies) turns by under 0.01 rad
#: across an image, so the LM could not tell left from right; with 50 its six frequencies are
#: 0.087 to 0.026 rad a position. 4 heads of 32 dims learn the text questions faster than 8 of 16
#: (text alone, 600 steps: 88 % against 78 % greedy on 200 held-out questions). The base of 50 has
#: a cost: its lowest frequency turns by 1 rad over 40 positions, so a look-up by content across a
#: varying distance is hard to learn (docs/limits.md has the measurements); base 1e4 with
#: mrope_section [1, 3, 12] learnt more of the look-ups but lost arithmetic and position.
TRAINED_TEXT = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                "rope_parameters": {"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 50.0}}
TRAINED_VISION = {"hidden_size": 64, "intermediate_size": 128, "out_hidden_size": 128}


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    steps: int = 2500
    batch: int = 16
    lr: float = 1.5e-3
    warmup: int = 60
    weight_decay: float = 0.01
    threads: int = 2
    log_every: int = 25
    turns: int = 4
    first_steps: int = 150
    easy_steps: int = 400
    eval_per_modality: int = 200
    family: str = "qwen2_5_vl"
    text: dict = field(default_factory=lambda: dict(TRAINED_TEXT))
    vision: dict = field(default_factory=lambda: dict(TRAINED_VISION))


def build_untrained(settings: TrainSettings, out_dir: Path):
    """(model, processor) at random init: the preset's config with ``settings``' widths and the
    task tokenizer; the tokenizer and processor files are written to ``out_dir`` and loaded back,
    so training sees exactly what the checkpoint's users load."""
    import torch

    from vlsens.model.family import get
    from vlsens.model.presets.build import init_weights_numpy, save_processor, tiny_config
    from vlsens.model.presets.tables import TINY_TEXT
    from vlsens.model.presets.tokenizer import build_tiny_tokenizer
    from vlsens.model.processor import load_processor
    from vlsens.task.vocabulary import corpus

    tokenizer = build_tiny_tokenizer(512, TINY_TEXT["max_position_embeddings"], corpus=corpus(settings.seed))
    config = tiny_config(tokenizer, settings.vision, settings.family)
    for k, v in settings.text.items():
        setattr(config.text_config, k, v)
    torch.manual_seed(settings.seed)
    model = get(settings.family).transformers_class()(config)
    init_weights_numpy(model, settings.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_processor(out_dir, tokenizer, settings.family)
    model.config.save_pretrained(out_dir)
    return model, load_processor(out_dir)


def messages(chat: list[Question], answers: bool = False) -> list[dict]:
    """The chat of one or more questions on the same images: the images in the first user turn,
    then each prompt (and, with ``answers``, each answer as the assistant's turn)."""
    out = []
    for k, q in enumerate(chat):
        images = [{"type": "image"} for _ in q.images] if k == 0 else []
        out.append({"role": "user", "content": [*images, {"type": "text", "text": q.prompt}]})
        if answers:
            out.append({"role": "assistant", "content": [{"type": "text", "text": q.answer}]})
    return out


def encode(processor, chats: list[list[Question]], answers: bool = True) -> dict:
    """Model inputs of ``chats`` (right-padded when ``answers``, with ``labels`` on every answer and
    its ``<|im_end|>``; left-padded single-question prompts for generation otherwise)."""
    from PIL import Image

    texts = [processor.apply_chat_template(messages(c, answers), add_generation_prompt=not answers, tokenize=False)
             for c in chats]
    images = [Image.fromarray(img) for c in chats for img in c[0].images]
    processor.tokenizer.padding_side = "right" if answers else "left"
    inputs = dict(processor(text=texts, images=images or None, padding=True, return_tensors="pt"))
    if answers:
        inputs["labels"] = _answer_labels(processor.tokenizer, inputs["input_ids"])
    return inputs


def _answer_labels(tokenizer, ids):
    """``ids`` where they are an assistant turn's tokens (after ``<|im_start|>assistant\\n``, up to
    and including its ``<|im_end|>``), -100 elsewhere."""
    prefix = tokenizer.encode("<|im_start|>assistant\n")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    labels = ids.clone().fill_(-100)
    rows = ids.tolist()
    for b, row in enumerate(rows):
        k = 0
        while k < len(row):
            if row[k:k + len(prefix)] == prefix:
                k += len(prefix)
                while k < len(row):
                    labels[b, k] = row[k]
                    k += 1
                    if row[k - 1] == end:
                        break
            else:
                k += 1
    return labels


def train_batch(settings: TrainSettings, step: int) -> list[list[Question]]:
    """Step ``step``'s chats: questions of the ``train`` split, each with ``turns - 1`` follow-ups."""
    import numpy as np

    from vlsens.task.questions import follow_ups

    out = []
    for i in range(step * settings.batch, (step + 1) * settings.batch):
        q = question(settings.seed, "train", i, easy=step < settings.easy_steps, first=step < settings.first_steps)
        turns = 1 if step < settings.first_steps else settings.turns
        out.append([q, *follow_ups(np.random.default_rng((settings.seed, 0, i, 1)), q, turns - 1)])
    return out


def lr_at(settings: TrainSettings, step: int) -> float:
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    t = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))


def train(settings: TrainSettings, out_dir: str | Path | None = None, steps: int | None = None) -> dict:
    """Train ``steps`` (all of ``settings.steps`` by default) and return the record; the checkpoint
    and its record are written to ``out_dir`` (atomically) only when every step ran."""
    import tempfile

    import torch

    from vlsens.core.fsutil import atomic_dir

    torch.set_num_threads(settings.threads)
    run = settings.steps if steps is None else steps
    with tempfile.TemporaryDirectory(prefix="vlsens-train-") as work:
        model, processor = build_untrained(settings, Path(work))
        losses, seconds = _optimize(model, processor, settings, run)
        record = {"settings": asdict(settings), "steps_run": run, "seconds": round(seconds, 1), "loss": losses,
                  "torch": torch.__version__}
        if run != settings.steps or out_dir is None:
            return record
        model.eval()
        record["accuracy"] = evaluate(model, processor, settings.seed, settings.eval_per_modality)
        with atomic_dir(out_dir) as tmp:
            for f in Path(work).iterdir():
                shutil.copyfile(f, tmp / f.name)
            model.save_pretrained(tmp, safe_serialization=True)
            (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _optimize(model, processor, settings: TrainSettings, steps: int) -> tuple[list[dict], float]:
    """AdamW over ``steps`` batches; the loss averaged over every ``log_every`` steps (and the
    first step's alone)."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    losses, window, start = [], [], time.perf_counter()
    right = {m: [0, 0] for m in MODALITIES}
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(settings, step)
        chats = train_batch(settings, step)
        inputs = encode(processor, chats)
        out = model(**inputs)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window.append(float(out.loss.detach()))
        _count_right(right, chats, out.logits.detach(), inputs["labels"], end)
        if (step + 1) % settings.log_every == 0 or step == 0:
            losses.append({"step": step + 1, "loss": sum(window) / len(window), "first": window[0],
                           "batch_accuracy": {m: round(r[0] / max(r[1], 1), 4) for m, r in right.items()}})
            log.info("step %d loss %.4f answers right in the batches %s (%.0f s)", step + 1, losses[-1]["loss"],
                     losses[-1]["batch_accuracy"], time.perf_counter() - start)
            window, right = [], {m: [0, 0] for m in MODALITIES}
    return losses, time.perf_counter() - start


def _count_right(right: dict, chats: list[list[Question]], logits, labels, end: int) -> None:
    """Add each chat's answers predicted right (argmax at the answer tokens, teacher-forced) to
    ``right[modality]``: the training batches' accuracy, logged beside the loss."""
    hit = logits[:, :-1].argmax(-1) == labels[:, 1:]
    mask = (labels[:, 1:] != -100) & (labels[:, 1:] != end)
    for b, chat in enumerate(chats):
        r = right[chat[0].modality]
        r[0] += int((hit[b] & mask[b]).sum())
        r[1] += int(mask[b].sum())


def evaluate(model, processor, seed: int, per_modality: int, batch: int = 24) -> dict:
    """Greedy accuracy per modality on the first ``3 x per_modality`` questions of ``eval``."""
    import torch

    from vlsens.task.score import normalise

    qs = [question(seed, "eval", i) for i in range(3 * per_modality)]
    right = {m: 0 for m in MODALITIES}
    kinds: dict[str, list[int]] = {}
    marks = []
    with torch.no_grad():
        for i in range(0, len(qs), batch):
            chunk = qs[i:i + batch]
            inputs = encode(processor, [[q] for q in chunk], answers=False)
            out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
            texts = processor.tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
            for q, t in zip(chunk, texts):
                ok = normalise(t) == q.answer
                marks.append("1" if ok else "0")
                right[q.modality] += ok
                kinds.setdefault(f"{q.modality}/{q.kind}", [0, 0])[0] += ok
                kinds[f"{q.modality}/{q.kind}"][1] += 1
    return {"modalities": {m: {"correct": right[m], "questions": per_modality, "accuracy": right[m] / per_modality}
                           for m in MODALITIES},
            "kinds": {k: {"correct": c, "questions": n} for k, (c, n) in sorted(kinds.items())},
            "correct": "".join(marks)}


def main(argv: list[str] | None = None) -> int:
    """``python -m vlsens.task.train [--out DIR] [--steps N]`` (``make train-tiny``): train the tiny
    preset and write it, with its record, where the ``tiny`` preset's shipped weights live."""
    import argparse

    from vlsens.model.presets import trained_dir

    parser = argparse.ArgumentParser(prog="python -m vlsens.task.train", description=main.__doc__)
    parser.add_argument("--out", default=str(trained_dir("tiny")), help="the checkpoint folder to write")
    parser.add_argument("--steps", type=int, default=TrainSettings.steps, help="optimizer steps")
    parser.add_argument("--seed", type=int, default=TrainSettings.seed)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    record = train(TrainSettings(seed=args.seed, steps=args.steps), args.out)
    print(json.dumps(record["accuracy"]["modalities"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
