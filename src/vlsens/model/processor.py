"""A checkpoint's processor (tokenizer, chat template, image processor), local files only,
never ``trust_remote_code``."""

from __future__ import annotations

import logging
from pathlib import Path

from vlsens.model.family import family_of, get
from vlsens.model.presets import MODEL_TYPE

log = logging.getLogger(__name__)


def load_image_processor(path: str | Path):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)



def _image_text_processor_class(family: str = MODEL_TYPE):
    from transformers.processing_utils import ProcessorMixin

    base = get(family).transformers_class("processor_class")

    class ImageTextProcessor(base):
        """The family's processor (``Qwen2_5_VLProcessor`` ...) without its video sub-processor.

        transformers' video processor needs torchvision, which has no CPU build; images and text
        go through the very same ``__call__`` code.
        """

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            for name, token in (("image", "<|image_pad|>"), ("video", "<|video_pad|>"),
                                ("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>")):
                tok = getattr(tokenizer, f"{name}_token", None) or token
                setattr(self, f"{name}_token", tok)
                setattr(self, f"{name}_token_id", tokenizer.convert_tokens_to_ids(tok))
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return ImageTextProcessor



def load_processor(path: str | Path):
    """The checkpoint's processor: ``AutoProcessor`` where it loads, else the image+text processor.

    ``AutoProcessor`` needs torchvision for the video processor; on hosts without it the same
    image processor and tokenizer are combined by :func:`_image_text_processor_class`.
    """
    from transformers import AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (ImportError, ModuleNotFoundError) as e:
        log.info("AutoProcessor unavailable (%s); using image processor + tokenizer", str(e).strip()[:80])
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    cls = _image_text_processor_class(family_of(path).model_type)
    return cls(load_image_processor(path), tokenizer, chat_template=getattr(tokenizer, "chat_template", None))
