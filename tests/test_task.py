"""The visual question task, the trained preset and the scoring of answers (vlsens.task)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vlsens.model.presets import trained_dir
from vlsens.task.questions import ANSWERS, MODALITIES, question, questions, read_split, write_split
from vlsens.task.score import accuracy, mcnemar, normalise, wilson

SHIPPED = trained_dir("tiny")


def _same(a, b) -> bool:
    return (a.prompt, a.answer, a.kind) == (b.prompt, b.answer, b.kind) and len(a.images) == len(b.images) and all(
        np.array_equal(x, y) for x, y in zip(a.images, b.images))


def test_a_question_is_drawn_again_alone_from_its_seed():
    assert _same(question(0, "eval", 7), question(0, "eval", 7))
    assert [q.prompt for q in questions(0, "eval", 5, start=3)] == [question(0, "eval", i).prompt for i in range(3, 8)]


def test_modalities_take_turns_and_every_answer_is_in_the_closed_set():
    qs = list(questions(0, "eval", 90))
    assert [q.modality for q in qs[:3]] == list(MODALITIES)
    assert {q.modality for q in qs[::3]} == {"text"} and all(len(q.images) == 2 for q in qs[2::3])
    assert all(q.answer in ANSWERS for q in qs)
    assert len({q.kind for q in qs}) >= 10  # colour, shape, count, position, size, two-image kinds, text kinds


def test_the_splits_are_disjoint_by_seed():
    train = {q.images[0].tobytes() for q in questions(0, "train", 150) if q.images}
    ev = [q for q in questions(0, "eval", 150) if q.images]
    assert ev and not any(q.images[0].tobytes() in train for q in ev)


def test_image_answers_follow_from_what_is_drawn():
    """Counts match the shapes drawn: a count question's answer is the number of distinct shape
    colours in the image (each shape has its own colour)."""
    from vlsens.task.questions import COLORS

    n = 0
    for q in questions(0, "eval", 300):
        if q.modality == "image" and q.kind == "count":
            img = q.images[0].astype(int)
            present = sum(int((np.abs(img - np.array(rgb)).sum(-1) < 12).sum() > 30) for rgb in COLORS.values())
            assert str(present) == q.answer, q.prompt
            n += 1
    assert n >= 5


def test_a_split_written_as_files_reads_back(tmp_path):
    path = write_split(tmp_path, 0, "calib", 6)
    recs = read_split(path)
    assert [r["answer"] for r in recs] == [q.answer for q in questions(0, "calib", 6)]
    assert all((tmp_path / f).is_file() for r in recs for f in r["images"])
    # load_prompt_samples reads the same file as a prompts JSONL (text.calibration.prompts)
    from vlsens.data.prompts import load_prompt_samples

    assert [s.modality for s in load_prompt_samples(str(path))] == [r["modality"] for r in recs]


def test_normalise_takes_the_first_word():
    assert normalise(" Red.") == "red" and normalise("7<|im_end|>") == "7" and normalise("...") == ""


def test_wilson_interval_and_accuracy():
    lo, hi = wilson(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson(180, 200)
    assert lo == pytest.approx(0.8506, abs=1e-3) and hi == pytest.approx(0.9343, abs=1e-3)
    a = accuracy([True, False, True, True])
    assert a["correct"] == 3 and a["accuracy"] == 0.75 and a["low"] < 0.75 < a["high"]


def test_mcnemar_pairs_the_discordant_questions():
    ref = [True] * 20
    worse = [False] * 6 + [True] * 14
    r = mcnemar(ref, worse)
    assert r["lost"] == 6 and r["gained"] == 0 and r["p"] == pytest.approx(2 / 64) and r["resolved"] == "worse"
    assert r["difference"] == pytest.approx(-0.3) and r["high"] < 0
    even = mcnemar([True, False] * 10, [False, True] * 10)
    assert even["resolved"] == "not resolved" and even["p"] == 1.0
    with pytest.raises(ValueError):
        mcnemar([True], [True, False])


def test_the_shipped_tokenizer_makes_every_answer_one_token():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(SHIPPED), local_files_only=True)
    assert all(len(tok.encode(a)) == 1 for a in ANSWERS)


def test_the_shipped_checkpoint_answers_its_evaluation_questions():
    """The record counts at least 200 evaluation questions per modality, and each modality's
    accuracy is resolved above what the questions alone give (each kind's most frequent answer,
    :func:`prior_baseline`): the model reads the images and the facts. transformers' greedy answers
    to the first questions, counted afresh, are the record's, question by question."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlsens.model.processor import load_processor
    from vlsens.task.score import prior_baseline
    from vlsens.task.train import evaluate

    record = json.loads((SHIPPED / "training.json").read_text())
    acc, seed = record["accuracy"], record["settings"]["seed"]
    baseline = prior_baseline([(q.modality, q.kind, q.answer) for q in questions(seed, "eval", len(acc["correct"]))])
    for m in MODALITIES:
        k, n = acc["modalities"][m]["correct"], acc["modalities"][m]["questions"]
        assert n >= 200 and wilson(k, n)[0] > baseline[m], (m, k, n, baseline[m])
    torch.set_num_threads(2)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(SHIPPED), local_files_only=True).eval()
    got = evaluate(model, load_processor(SHIPPED), seed, 24)  # the record's first three batches of 24
    assert got["correct"] == acc["correct"][:72]


def test_training_reproduces_the_records_first_steps():
    """The script's first steps give the record's losses (a deterministic run for its seed)."""
    from vlsens.task.train import TrainSettings, train

    record = json.loads((SHIPPED / "training.json").read_text())
    s = record["settings"]
    settings = TrainSettings(**{k: v for k, v in s.items()})
    n = settings.log_every
    got = train(settings, None, steps=n)["loss"]
    want = [r for r in record["loss"] if r["step"] <= n]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), (g, w)


def _answers_record(name, correct, modality):
    from vlsens.deploy.genai.answers import summarize

    records = [{"modality": m, "kind": "k", "answer": "red"} for m in modality]
    return summarize(name, records, ["red" if c else "blue" for c in correct], "questions.jsonl")


def test_every_folder_is_paired_with_fp32_and_plans_with_their_anchor():
    from vlsens.deploy.accuracy import markdown, table

    mods = ["text", "image", "images"] * 20
    fp32 = _answers_record("fp32", [True] * 60, mods)
    worse = _answers_record("int4-rtn", [i % 3 != 1 for i in range(60)], mods)  # loses every image question
    plan = _answers_record("plan-p1", [i != 1 for i in range(60)], mods)
    t = table({"fp32": fp32, "int4-rtn": worse, "plan-p1": plan}, {"plan-p1": "int4-rtn"})
    assert t["rows"]["int4-rtn"]["below_fp32"] and t["rows"]["int4-rtn"]["vs_fp32"]["modalities"]["image"]["lost"] == 20
    assert not t["rows"]["plan-p1"]["below_fp32"]  # one question lost: not resolved
    p = t["plans_vs_anchors"]["plan-p1"]
    assert p["anchor"] == "int4-rtn" and p["all"]["gained"] == 19 and p["all"]["resolved"] == "better"
    md = markdown(t)
    assert "| int4-rtn |" in md and "worse" in md and "Plans against the anchor" in md
    with pytest.raises(ValueError, match="fp32"):
        table({"int4-rtn": worse})


def test_the_recommendation_skips_a_folder_resolved_below_fp32():
    from vlsens.deploy.accuracy import table
    from vlsens.report.recommend import add_accuracy, pick

    mods = ["text", "image", "images"] * 20
    t = table({"fp32": _answers_record("fp32", [True] * 60, mods),
               "int4-rtn": _answers_record("int4-rtn", [i % 3 != 1 for i in range(60)], mods),
               "int8-mixed": _answers_record("int8-mixed", [i != 5 for i in range(60)], mods)})
    facts = [{"folder": n, "path": n, "provider": "cpu", "bytes": b, "gate": "passed", "kl": 1e-5,
              "tokens_per_second": 1.0, "source": "measure", "cases": 24}
             for n, b in (("fp32", 100), ("int8-mixed", 40), ("int4-rtn", 20))]
    add_accuracy(facts, t)
    got = pick(facts, "cpu", 1e-4)
    assert got["folder"] == "int8-mixed" and "not resolved below fp32" in got["why"], got
