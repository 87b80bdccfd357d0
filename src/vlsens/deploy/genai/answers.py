"""A deploy folder's answers to the task's evaluation questions, through onnxruntime-genai.

Each question is asked as a user would ask it (:class:`~vlsens.deploy.genai.runtime.Chat`: the
folder's own processor, chat template and greedy search, one generator per question); the answer
is the generated text's first word (:func:`vlsens.task.score.normalise`), right when it equals the
question's answer. The deploy job answers them with the runtime it evaluates the folder with
(:func:`answer`) and ships the record in the folder (``answers.json``, :data:`FILE`): every answer
and, per modality and per question kind, the accuracy with its Wilson interval. The folders'
answers are compared pairwise by :mod:`vlsens.deploy.accuracy`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vlsens.task.questions import MODALITIES, read_split
from vlsens.task.score import accuracy, normalise

#: New tokens generated per question: the answer and ``<|im_end|>`` (one more for a model that
#: answers with more).
MAX_NEW_TOKENS = 4
#: The answers record inside a deploy folder.
FILE = "answers.json"


def answer(chat, questions: str | Path, name: str) -> dict:
    """The answers record of the folder ``chat`` runs (reported as ``name``) on the questions of
    ``questions`` (a task split's ``questions.jsonl``)."""
    records = read_split(questions)
    # the task's own PNG files (8-bit RGB, written by vlsens.task): onnxruntime-genai reads them as
    # they are, without the pipeline's decode-and-re-encode guard for outside images
    checking, chat.check_images = chat.check_images, False
    start = time.perf_counter()
    answers = []
    try:
        for r in records:
            tokens = chat.generate(chat.prompt(r["prompt"], len(r["images"])), r["images"], MAX_NEW_TOKENS)
            answers.append(normalise(chat.decode(tokens)))
    finally:
        chat.check_images = checking
    return summarize(name, records, answers, str(questions), time.perf_counter() - start)


def answer_folder(folder: str | Path, questions: str | Path, name: str, prepack: bool = True) -> dict:
    """:func:`answer` on a folder loaded for it."""
    from vlsens.deploy.genai.runtime import Chat

    chat = Chat(folder, prepack=prepack)
    try:
        return answer(chat, questions, name)
    finally:
        chat.close()


def read_answers(path: str | Path) -> dict:
    """A folder's answers record: ``path`` is the deploy folder (its :data:`FILE`) or the file."""
    path = Path(path)
    return json.loads((path / FILE if path.is_dir() else path).read_text())


def summarize(name: str, records: list[dict], answers: list[str], source: str, seconds: float = 0.0) -> dict:
    """The answers record: per question the answer and whether it is right (``correct``: a string
    of ``1`` / ``0`` in question order), accuracy overall, per modality and per kind."""
    right = [a == r["answer"] for a, r in zip(answers, records)]
    kinds = sorted({f"{r['modality']}/{r['kind']}" for r in records})
    return {"folder": name, "questions": source, "count": len(records), "seconds": round(seconds, 2),
            "answers": answers, "correct": "".join("1" if x else "0" for x in right),
            "modality": [r["modality"] for r in records],
            "accuracy": accuracy(right),
            "modalities": {m: accuracy([x for x, r in zip(right, records) if r["modality"] == m])
                           for m in MODALITIES if any(r["modality"] == m for r in records)},
            "kinds": {k: accuracy([x for x, r in zip(right, records) if f"{r['modality']}/{r['kind']}" == k])
                      for k in kinds}}


def right_answers(record: dict) -> list[bool]:
    return [c == "1" for c in record["correct"]]
