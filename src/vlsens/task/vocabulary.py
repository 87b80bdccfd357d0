"""The text the trained preset's tokenizer learns its merges from: the task's prompts, and each
answer alone on a line many times, so that every answer (and the words before it) is one token."""

from __future__ import annotations

from vlsens.task.questions import ANSWERS, questions


def corpus(seed: int = 0, prompts: int = 300, answer_repeats: int = 60) -> str:
    """The BPE corpus: ``prompts`` questions of the train split (their words as the prompts have
    them) and every answer word ``answer_repeats`` times on a line of its own, as it follows the
    chat template's ``assistant\\n``."""
    lines = [q.prompt for q in questions(seed, "train", prompts, sizes=((112, 112),))]
    lines += [a for a in ANSWERS if not a.isdigit()] * answer_repeats
    return "\n".join(lines) + "\n"
