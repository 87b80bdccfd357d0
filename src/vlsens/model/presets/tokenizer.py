"""The presets' tokenizer: a byte-level BPE with the Qwen special tokens and chat template,
trained offline on a shipped text (no download)."""

from __future__ import annotations

#: Qwen2.5-VL special tokens, in the order the real tokenizer lists them.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


#: Qwen2-VL's chat template (image/video placeholders expand in the processor).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


#: Text the tiny tokenizer's BPE merges are learnt from (shipped, so no download is needed).
_TOKENIZER_CORPUS = """
You are a helpful assistant. Describe this image in detail. What is in the picture?
An astronaut in a white suit stands in front of a flag. A cat with green eyes lies on a blanket.
A cup of coffee on a saucer, seen from above. A rocket on the launch pad before take-off.
Two motorcycles parked side by side. Stars and galaxies of the deep field. How many objects
are there, and what colour are they? Answer in one short sentence. The quick brown fox jumps
over the lazy dog. Read the text in the image. Where is the person looking? Is it day or night?
"""


def build_tiny_tokenizer(vocab_size: int = 512, model_max_length: int = 4096, corpus: str | None = None):
    """A byte-level BPE tokenizer with the Qwen special tokens, trained offline on a shipped text
    (``corpus``: another text to learn the merges from; the trained preset's is the task's,
    :func:`vlsens.task.vocabulary.corpus`, so that every answer is one token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TOKENIZER_CORPUS] * 4 if corpus is None else [corpus], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
