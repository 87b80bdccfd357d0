"""The folders side by side on the end-to-end measure (vlsens.deploy.peers) and the peers' place in
the DAG (vlsens.deploy: sources, config checks)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import default_config

from vlsens.core.errors import ConfigError


def _measure(name: str, kls: dict[str, list[float]], nbytes: int) -> dict:
    rows = [{"name": f"{m}-{i:02d}", "modality": m, "kl": k, "max_kl": k, "top1": 1.0, "steps": 8}
            for m, ks in kls.items() for i, k in enumerate(ks)]
    from vlsens.deploy.measure import summarize

    return {**summarize(rows), "folder": name, "bytes": nbytes, "cases": rows}


def _write(tmp_path, measures: dict[str, dict]) -> dict[str, str]:
    out = {}
    for n, m in measures.items():
        f = tmp_path / f"{n}.json"
        f.write_text(json.dumps(m))
        out[n] = str(f)
    return out


def test_goal_is_judged_against_the_best_anchor_with_its_interval(tmp_path):
    """int4-mixed at a third of the best anchor's KL on every case: better, goal met; against a
    smaller folder no goal is judged (equal or fewer bytes); a worse anchor is not the best."""
    from vlsens.deploy.peers import markdown, table

    rng = np.random.default_rng(0)
    base = {m: list(rng.uniform(1e-4, 5e-3, 6)) for m in ("text", "image", "images")}
    scaled = lambda f: {m: [k * f for k in ks] for m, ks in base.items()}  # noqa: E731
    measures = {"int4-mixed": _measure("int4-mixed", scaled(1 / 3), 1000),
                "int4-k_quant_mixed": _measure("int4-k_quant_mixed", scaled(1.0), 1010),
                "peer-olive": _measure("peer-olive", scaled(4.0), 1200),
                "peer-small": _measure("peer-small", scaled(0.1), 500),
                "fp16": _measure("fp16", scaled(0.01), 2000)}
    result = table(_write(tmp_path, measures))
    assert set(result["paired"]) == {"int4-k_quant_mixed", "peer-olive", "peer-small"}  # fp16 is no anchor
    goals = result["goals"]
    assert [g["anchor"] for g in goals] == ["int4-k_quant_mixed", "int4-k_quant_mixed"]
    assert all(g["met"] and abs(g["ratio"] - 1 / 3) < 1e-9 and g["interval"][1] < 0.5 for g in goals)
    small = result["paired"]["peer-small"]["all"]
    assert small["worse"] and not small["better"]
    md = markdown(result)
    assert "met" in md and "peer-olive" in md and "not separated" not in md


def test_a_ratio_whose_interval_straddles_one_is_not_called_better(tmp_path):
    from vlsens.deploy.peers import table

    rng = np.random.default_rng(1)
    a = {m: list(rng.uniform(1e-4, 5e-3, 8)) for m in ("text", "image", "images")}
    b = {m: list(np.array(ks)[::-1]) for m, ks in a.items()}  # the same values, other cases
    result = table(_write(tmp_path, {"int4-mixed": _measure("int4-mixed", a, 1000),
                                     "int4-rtn": _measure("int4-rtn", b, 1000)}))
    p = result["paired"]["int4-rtn"]["all"]
    assert p["interval"][0] < 1 < p["interval"][1] and not p["better"] and not p["worse"]
    assert not any(g["met"] for g in result["goals"])


def test_peer_folders_take_their_recipes_graphs():
    from vlsens.deploy import sources

    olive = sources("peer-olive")
    assert "builder-rtn" in olive["decoder"] and "vision/dynamic/int4-rtn128" in olive["vision"]
    assert "embedding-int4" in olive["embedding"]
    opt = sources("peer-optimum")
    assert "nncf-optimum" in opt["decoder"] and "int8-wo" in opt["vision"] and "embedding-int8" in opt["embedding"]
    builder = sources("peer-builder")
    assert "builder-k_quant_mixed" in builder["decoder"] and "vision/dynamic/fp16" in builder["vision"]
    assert "embedding" not in builder  # the decoder folder's fp32 table
    ratio = sources("peer-nncf-ratio", "int4", "int4")  # the int4 folders' vision and embedding
    assert "nncf-ratio" in ratio["decoder"] and "vision/dynamic/int4/" in ratio["vision"]


def test_peer_config_checks_name_the_key():
    from vlsens.deploy import check_config

    cfg = default_config()
    cfg["deploy"]["precisions"] = ["fp32"]
    cfg["vision"]["dynamic"]["variants"] = ["fp32"]  # no fp16: the builder peer's (and a plan's) vision graph
    with pytest.raises(ConfigError, match=r"deploy.peers has 'builder'.*vision.dynamic.variants"):
        check_config(cfg)
    cfg["deploy"]["peers"] = ["olive", "optimum", "nncf-awq"]  # weight-only vision: from fp32
    with pytest.raises(ConfigError, match=r"plan.vision has 'fp16'.*vision.dynamic.variants"):
        check_config(cfg)
    cfg["plan"]["vision"] = ["int8-mixed", "int4", "int4-rtn128", "int8-wo"]
    check_config(cfg)
    cfg = default_config()
    cfg["deploy"]["measure"]["sizes"] = ["224x224", "100x224"]
    with pytest.raises(ConfigError, match=r"deploy.measure.sizes\[1\]"):
        check_config(cfg)


def test_an_nncf_peer_takes_the_int4_table_where_ours_is_tied():
    """The tied table gathers lm_head's MatMulNBits bytes; NNCF keeps lm_head INT8 as
    DequantizeLinear + MatMul, so its folder carries the INT4 table."""
    from vlsens.deploy import peer_parts, sources

    assert peer_parts("peer-nncf-ratio", "int4", "tied") == ("nncf-ratio", "int4", "int4")
    assert peer_parts("peer-builder", "int4", "tied")[2] == "fp32"
    assert "embedding-int4" in sources("peer-nncf-awq", "int4", "tied")["embedding"]


def test_the_measured_front_holds_each_anchor_against_the_best_plan_within_its_bytes(tmp_path):
    """Per anchor, the lowest-KL plan at or below its bytes, with the paired interval; the estimate
    against the built KL per plan; the recommendation: the smallest plan meeting the KL budget."""
    from vlsens.budget.report import figure, markdown, table

    rng = np.random.default_rng(2)
    base = {m: list(rng.uniform(1e-4, 5e-3, 6)) for m in ("text", "image", "images")}
    scaled = lambda f: {m: [k * f for k in ks] for m, ks in base.items()}  # noqa: E731
    measures = {"plan-p1": _measure("plan-p1", scaled(2.0), 800), "plan-p2": _measure("plan-p2", scaled(0.3), 1000),
                "plan-p3": _measure("plan-p3", scaled(0.01), 3000),
                "int4-k_quant_mixed": _measure("int4-k_quant_mixed", scaled(1.0), 1010),
                "peer-small": _measure("peer-small", scaled(1.0), 500)}
    mean = lambda f: float(np.mean([k * f for ks in base.values() for k in ks]))  # noqa: E731
    picked = [{"name": n, "vision": "int4", "embedding": "int4", "int4": 15, "int8": 0, "float": 0, "bytes": b,
               "kl": mean(f) * e} for n, b, f, e in (("p1", 800, 2.0, 1.05), ("p2", 1000, 0.3, 1.5),
                                                      ("p3", 3000, 0.01, 1.0))]
    result = table({"picked": picked}, _write(tmp_path, measures), kl_budget=mean(0.5))
    by = {v["anchor"]: v for v in result["versus"]}
    assert by["int4-k_quant_mixed"]["plan"] == "p2" and by["int4-k_quant_mixed"]["met"]
    assert abs(by["int4-k_quant_mixed"]["all"]["ratio"] - 0.3) < 1e-9
    assert by["peer-small"]["plan"] is None  # no plan that small: not claimed either way
    assert result["estimate"] == {"goal": 0.1, "within": 2, "of": 3}  # p2's estimate is 50 % off
    assert result["recommended"]["folder"] == "plan-p2"
    assert "not met" not in markdown(result).split("peer-small")[0].split("int4-k_quant_mixed")[-1]
    figure(result, tmp_path / "front.png")
    assert (tmp_path / "front.png").stat().st_size > 10_000


def _answers(tmp_path, right: dict[str, list[bool]]) -> dict[str, str]:
    """Answers records of 60 questions (text, one image, two images in turn) per folder."""
    from vlsens.deploy.genai.answers import summarize

    mods = ["text", "image", "images"] * 20
    questions = [{"modality": m, "kind": "k", "answer": "red"} for m in mods]
    records = {n: summarize(n, questions, ["red" if c else "blue" for c in r], "questions.jsonl")
               for n, r in right.items()}
    (tmp_path / "answers").mkdir(exist_ok=True)
    return _write(tmp_path / "answers", records)


def test_compare_md_shows_each_folders_accuracy_first_paired_with_fp32(tmp_path):
    """With the task's answers, measure/compare.md opens every row on the folder's accuracy and its
    paired drop against fp32 (the numbers measure/accuracy.md prints), before the KL columns."""
    from vlsens.deploy.accuracy import table as accuracy_table
    from vlsens.deploy.peers import markdown, table

    rng = np.random.default_rng(3)
    base = {m: list(rng.uniform(1e-4, 5e-3, 6)) for m in ("text", "image", "images")}
    measures = {"int4-mixed": _measure("int4-mixed", base, 1000), "int4-rtn": _measure("int4-rtn", base, 1000)}
    answers = _answers(tmp_path, {"fp32": [True] * 60, "int4-mixed": [i != 4 for i in range(60)],
                                  "int4-rtn": [i % 3 != 1 for i in range(60)]})
    result = table(_write(tmp_path, measures), answers)
    md = markdown(result)
    head, fp32, *_ = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert head.startswith("| folder | accuracy % [95 %] | against fp32, points | MB |")
    assert fp32.startswith("| fp32 | 100.0 [") and "| reference |" in fp32
    rtn = next(line for line in md.splitlines() if line.startswith("| int4-rtn |"))
    ref = accuracy_table({n: json.loads(open(p).read()) for n, p in answers.items()})["rows"]["int4-rtn"]
    assert rtn.split(" | ")[1] == f"{100 * ref['accuracy']['accuracy']:.1f} [{100 * ref['accuracy']['low']:.1f}, " \
                                  f"{100 * ref['accuracy']['high']:.1f}]"
    assert "-33.3 [" in rtn and "worse" in rtn  # every one-image question lost: resolved
    assert "not resolved" in next(line for line in md.splitlines() if line.startswith("| int4-mixed |"))
    assert "McNemar" in md
    assert "accuracy" not in markdown(table(_write(tmp_path, measures)))  # no answers: KL alone, as before


def test_measured_md_takes_accuracy_and_the_recommendation_skips_a_plan_below_fp32(tmp_path):
    """The measured front with the task's answers: accuracy first for plans and anchors, each plan
    paired with its anchor on the same questions; the smallest plan meeting the KL budget is passed
    over when its accuracy is resolved below fp32's."""
    from vlsens.budget.report import markdown, table

    rng = np.random.default_rng(4)
    base = {m: list(rng.uniform(1e-4, 5e-3, 6)) for m in ("text", "image", "images")}
    scaled = lambda f: {m: [k * f for k in ks] for m, ks in base.items()}  # noqa: E731
    measures = {"plan-p1": _measure("plan-p1", scaled(0.2), 800), "plan-p2": _measure("plan-p2", scaled(0.3), 1000),
                "int4-rtn": _measure("int4-rtn", scaled(1.0), 1010)}
    mean = lambda f: float(np.mean([k * f for ks in base.values() for k in ks]))  # noqa: E731
    picked = [{"name": n, "vision": "int4", "embedding": "int4", "int4": 15, "int8": 0, "float": 0, "bytes": b,
               "kl": mean(f)} for n, b, f in (("p1", 800, 0.2), ("p2", 1000, 0.3))]
    right = {"fp32": [True] * 60, "plan-p1": [i % 3 != 2 for i in range(60)],  # loses every two-image question
             "plan-p2": [True] * 60, "int4-rtn": [i % 3 != 1 for i in range(60)]}
    files = _write(tmp_path, measures)
    plain = table({"picked": picked}, files, kl_budget=mean(0.5))
    assert plain["recommended"]["folder"] == "plan-p1"  # KL alone: the smallest within the budget
    requested = {"within-1": {"request": {"accuracy_drop": 1.0}, "byte_limit": None, "plan": None},
                 "small": {"request": {"accuracy_drop": 50, "bytes": 900}, "byte_limit": 900, "plan": None},
                 "none": {"request": {"accuracy_drop": 0.5, "bytes": 900}, "byte_limit": 900, "plan": None}}
    unscored = table({"picked": picked, "requested": requested}, files, kl_budget=mean(0.5))
    assert not any(q["met"] for q in unscored["requested"].values())  # no answers: no accuracy request is met
    result = table({"picked": picked, "requested": requested}, files, kl_budget=mean(0.5),
                   answers=_answers(tmp_path, right))
    got = result["requested"]
    assert (got["within-1"]["plan"], got["within-1"]["drop"], got["within-1"]["met"]) == ("p2", 0.0, True)
    assert got["small"]["plan"] == "p1" and abs(got["small"]["drop"] - 100 / 3) < 1e-9 and got["small"]["met"]
    assert got["none"]["met"] is False and got["none"]["plan"] is None
    assert result["recommended"]["folder"] == "plan-p2" and "not resolved below fp32" in result["recommended"]["why"]
    assert result["recommended"]["accuracy"]["accuracy"] == 1.0
    v = next(v for v in result["versus"] if v["anchor"] == "int4-rtn")
    assert v["plan"] == "p1" and v["accuracy"]["all"]["gained"] == 20 == v["accuracy"]["all"]["lost"]  # lowest KL
    md = markdown(result)
    assert md.startswith("| plan | accuracy % [95 %] | against fp32, points | vision |")
    assert "| anchor | accuracy % [95 %] | against fp32, points | MB |" in md
    anchor_row = next(line for line in md.split("| anchor |")[1].splitlines() if line.startswith("| int4-rtn |"))
    assert "-33.3 [" in anchor_row and "| +0.0 [" in anchor_row  # its drop; the plan against it, paired
    assert "accuracy 100.0 %" in md.split("Recommended:")[1]
    assert "Requested `within-1` (accuracy_drop 1): `plan-p2`" in md and "(a drop of 0.0 points against fp32): met" in md
    from matplotlib import image

    from vlsens.budget.report import figure

    figure(result, tmp_path / "front.png")  # accuracy above the KL: a taller figure than the KL's alone
    figure(plain, tmp_path / "plain.png")
    assert image.imread(tmp_path / "front.png").shape[0] > 1.5 * image.imread(tmp_path / "plain.png").shape[0]


def test_an_accuracy_budget_needs_the_task_answers():
    """plan.budgets' accuracy_drop is refused at DAG-build time where the run scores no answers."""
    from vlsens.config import schema_errors
    from vlsens.deploy import check_config

    cfg = default_config(**{"plan.budgets": [{"name": "within-1", "accuracy_drop": 1.0}]})
    assert not schema_errors(cfg)
    assert cfg["deploy"]["measure"]["prompts"] == "builtin"  # the random preset: auto is builtin
    with pytest.raises(ConfigError, match=r"plan.budgets \['within-1'\]: accuracy_drop .* deploy.measure.prompts"):
        check_config(cfg)
    assert schema_errors(default_config(**{"plan.budgets": [{"name": "x", "accuracy_drop": 101}]}))
