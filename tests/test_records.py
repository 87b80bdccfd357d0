"""python -m vlsens.core.records: a summary line per folder, a non-zero exit on a missing or empty
folder and on any record that breaks its schema."""

import json
import subprocess
import sys

import pytest
from conftest import REPO


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "vlsens.core.records", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO)


def test_missing_and_empty_folders_fail(tmp_path):
    r = _cli(tmp_path / "nope")
    assert r.returncode == 2 and "no such folder" in r.stderr
    r = _cli(tmp_path)
    assert r.returncode == 2 and "no vlsens records under it" in r.stderr
    r = _cli("--help")
    assert r.returncode == 0 and "schema" in r.stdout


def test_summary_and_a_broken_record(tmp_path):
    rec = {"parts": "p", "counts": {"calib": 2, "eval": 1}, "inputs": [["pixel_values"]]}
    folder = tmp_path / "calib" / "vision" / "224x224" / "parts-fp32"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(rec))
    r = _cli(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("1 records (1 parts_calibration), 0 recorded outputs: all valid")
    (folder / "manifest.json").write_text(json.dumps({**rec, "counts": {"calib": "two", "eval": 1}}))
    r = _cli(tmp_path)
    assert r.returncode == 1 and "counts.calib: 'two' is not of type 'integer'" in r.stdout
    assert r.stdout.strip().endswith("1 problem(s)")
    (folder / "manifest.json").write_text(json.dumps(rec)[:20])  # cut: one line naming it, no traceback
    r = _cli(tmp_path)
    assert r.returncode == 1 and not r.stderr, r.stderr
    assert f"{folder / 'manifest.json'}: <record>: not JSON (" in r.stdout and "snakemake --forcerun" in r.stdout


# The records of the folders' measure and of the whole-VLM plan: a minimal valid record of each
# schema passes, and the check is real (a key missing, a wrong type, a value out of range fail).

SHA = "0" * 64


def _case(name="text-01", modality="text", kl=1e-4):
    return {"name": name, "modality": modality, "kl": kl, "max_kl": 2 * kl, "top1": 0.75, "steps": 8}


def _summary(kl=1e-4):
    return {"cases": 2, "mean_kl": kl, "std": 0.0, "min": kl, "max": kl, "median": kl, "top1": 0.75}


def _stat():
    return {"ratio": 0.5, "interval": [0.4, None], "wins": 1.0, "ties": 0.0}


def _paired():
    return {**_stat(), "better": False, "worse": False, "modalities": {"text": _stat()}, "n_boot": 2000,
            "level": 0.95}


def _measure():
    return {"folder": "int4-mixed", "reference": "fp32", "positions": "generated steps", "max_new_tokens": 8,
            "bytes": 1000, "mean_kl": 1e-4, "top1": 0.75, "modalities": {"text": _summary()},
            "cases": [_case(), _case("text-02")], "seconds": 0.5}


def _compare():
    row = {k: _measure()[k] for k in ("bytes", "mean_kl", "top1", "modalities", "cases")}
    return {"reference": "fp32", "rows": {"int4-mixed": row, "int4-rtn": row}, "ours": "int4-mixed",
            "paired": {"int4-rtn": {"all": _paired(), "image": _paired()}},
            "goals": [{"statement": "KL <= 0.5x", "anchor": "int4-rtn", "ratio": 0.5, "interval": [0.4, 0.6],
                       "bytes_ratio": 1.0, "met": False}]}


def _cases():
    image = {"file": "00-astronaut-224x224.png", "source": "astronaut.png", "size": [224, 224]}
    return {"per_modality": 2, "seed": 0, "sizes": [[224, 224], [168, 280]],
            "cases": [{"name": "text-01", "modality": "text", "prompt": "Hi.", "images": []},
                      {"name": "image-01", "modality": "image", "prompt": "What?", "images": [image]}]}


def _components():
    measured = {"bytes": 500, "kl": 1e-4, "top1": 0.9, "modalities": {"text": _summary()}, "cases": [_case()],
                "graph": "vision/dynamic/int4/model.onnx"}
    return {"vision": {"fp32": {"bytes": 1000, "kl": 0.0}, "int4": measured},
            "embedding": {"fp32": {"bytes": 100, "kl": 0.0}}, "decoder_other_bytes": 10, "note": "n"}


def _parts():
    return {"decoder": {"bytes": 40, "kl": 1e-4}, "other": {"bytes": 10}, "vision": {"bytes": 500, "kl": 1e-4},
            "embedding": {"bytes": 100, "kl": 0.0}}


def _plan(name="p1"):
    return {"name": name, "digest": SHA, "bytes": 650, "kl": 2e-4, "decoder_budget": 40, "parts": _parts(),
            "int4": 1, "int8": 0, "float": 1, "vision": "int4", "embedding": "fp32"}


def _front():
    point = {"budget": 40, "bytes": 40, "kl": 1e-4, "bits": {"a": 4, "b": 0}, "from": "all int4", "searched": None}
    return {"engine_dir": "budget/nbits-engine", "metric": "kl",
            "settings": {"algorithm": "rtn", "block_size": 32, "symmetric": True, "accuracy_level": 4},
            "budgets": [50], "max_evals": 60, "other_bytes": 10,
            "components": {"vision": {"int4": {"bytes": 500, "kl": 1e-4}}, "embedding": {"fp32": {"bytes": 100,
                                                                                                   "kl": 0.0}}},
            "curve": [point, {**point, "budget": 60, "bytes": 60, "kl": 0.0, "from": "all float"}],
            "front": [{"bytes": 650, "kl": 2e-4, "decoder": 0, "vision": "int4", "embedding": "fp32",
                       "parts": _parts()}],
            "picked": [_plan()], "evaluations": {"measured": 3, "asked": 5}, "seconds": {"curve": 1.0, "total": 1.5},
            "anchors": {"int4-rtn": {"bytes": 700, "plan": "p1"},
                        "peer-olive": {"bytes": 10, "plan": None, "note": "none fits"}},
            "plans": [_plan(), _plan("at-int4-rtn")]}


def _measured():
    plan = {"plan": "p1", "vision": "int4", "embedding": "fp32", "int4": 1, "int8": 0, "float": 1,
            "estimate_bytes": 650, "bytes": 655, "estimate_kl": 2e-4, "kl": 1.9e-4, "estimate_error": 0.05,
            "modalities": {"text": 1.9e-4}, "top1": 0.8}
    return {"reference": "fp32", "plans": [plan],
            "anchors": {"int4-rtn": {"bytes": 700, "kl": 3e-4, "top1": 0.7, "modalities": {"text": 3e-4}}},
            "versus": [{"anchor": "int4-rtn", "plan": "p1", "bytes_ratio": 0.9, "all": _paired(), "image": _paired(),
                        "met": False},
                       {"anchor": "peer-olive", "plan": None, "note": "no plan at or below the anchor's bytes"}],
            "estimate": {"goal": 0.1, "within": 1, "of": 1},
            "recommended": {"folder": "plan-p1", "bytes": 655, "kl": 1.9e-4, "why": "lowest KL"},
            "search": {"evaluations": {"measured": 3, "asked": 5}, "seconds": None, "budgets": [50]}}


def _vision():
    return {"linears": 2, "sum_kl_int4": 3e-4, "top": [{"op": "/v/qkv/MatMul", "kl_int4": 2e-4}], "top1_share": 0.67,
            "points": [{"int4": 1, "kl": 2e-4}], "note": "each Linear alone at INT4",
            "estimate": {"measured": 1, "estimated": 1, "scales": {"qkv": 2.5}, "measured_over_estimate": None,
                         "rank_correlation": None, "method": "INT4 output error"}}


#: schema -> (a path it is found at, a minimal valid record, a required key, a key given a wrong type,
#: a path into the record and a value out of its range)
NEW = {
    "measure": ("measure/int4-mixed.json", _measure, "cases", "bytes", ("cases", 0, "kl"), -1e-3),
    "measure_compare": ("measure/compare.json", _compare, "paired", "goals",
                        ("paired", "int4-rtn", "all", "interval"), [0.4]),
    "measure_cases": ("measure/cases/cases.json", _cases, "sizes", "per_modality", ("cases", 1, "images"), []),
    "budget_components": ("budget/components.json", _components, "decoder_other_bytes", "vision",
                          ("vision", "int4", "top1"), 1.5),
    "budget_front": ("budget/front.json", _front, "curve", "plans", ("curve", 0, "bits", "a"), 3),
    "budget_measured": ("budget/measured.json", _measured, "versus", "recommended",
                        ("versus", 1, "note"), None),
    "budget_vision": ("budget/vision.json", _vision, "top", "linears", ("linears",), 0),
}


def _set(record, where, value):
    cur = record
    for k in where[:-1]:
        cur = cur[k]
    cur[where[-1]] = value
    return record


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_record_schemas(tmp_path, name):
    from vlsens.core import records

    rel, make, required, typed, where, bad = NEW[name]
    path = tmp_path / "results" / "tiny" / rel
    assert records.schema_name(path) == name
    assert records.errors(path, make()) == []
    missing = {k: v for k, v in make().items() if k != required}
    assert any(f"'{required}' is a required property" in e for e in records.errors(path, missing)), name
    assert any(e.startswith(f"{typed}:") for e in records.errors(path, {**make(), typed: "many"})), name
    assert records.errors(path, _set(make(), where, bad)), (name, where, bad)


def test_schema_names_of_the_measure_and_the_plan(tmp_path):
    """compare.json in measure/ is the folders' comparison, beside the CSVs the engines'; the plan's
    nbits records are the sensitivity's; a file the workflow does not write is no record."""
    from vlsens.core import records

    run = tmp_path / "results" / "tiny"
    assert records.schema_name(run / "sensitivity" / "decoder" / "fp32" / "compare.json") == "compare"
    assert records.schema_name(run / "budget" / "nbits.json") == "nbits"
    assert records.schema_name(run / "budget" / "nbits-engine" / "engine.json") == "nbits_engine"
    assert records.schema_name(run / "budget" / "plans" / "front.json") is None
    assert records.schema_name(run / "deploy" / "int4-mixed" / "cases.json") is None
    for rel, make, *_ in NEW.values():
        f = run / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(make()))
    r = _cli(run)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith(f"{len(NEW)} records ({', '.join(f'1 {n}' for n in sorted(NEW))}), "
                                     "0 recorded outputs: all valid")


def test_plan_formats_match_the_schema():
    """The formats the schemas accept are the ones a plan may name."""
    import yaml

    from vlsens.budget.plan import EMBEDDING_FORMATS, VISION_FORMATS
    from vlsens.core.records import SCHEMAS

    defs = yaml.safe_load((SCHEMAS / "budget_components.schema.yaml").read_text())["$defs"]
    assert defs["vision_format"]["anyOf"][0]["enum"] == list(VISION_FORMATS)
    assert defs["embedding_format"]["enum"] == list(EMBEDDING_FORMATS)


def test_a_record_that_contradicts_itself_or_its_csv_is_a_problem(tmp_path):
    """Beyond its schema, a record is checked against its own invariants: a parity record that
    says ``passed`` with a cosine below (or an error above) its own tolerance, an ``ort.json`` whose
    op count is not the rows of the ``ort.csv`` beside it, a measure whose mean is not its cases'."""
    from vlsens.core import records

    run = tmp_path / "results" / "tiny"
    parity = run / "vision" / "224x224" / "fp32" / "parity.json"
    ok = {"passed": True, "metrics": {"min_cosine": 0.999995, "max_rel_error": 5e-5},
          "tolerance": {"min_cosine": 0.99999, "max_rel_error": 1e-4}}
    assert records.invariants(parity, ok) == []
    low = records.invariants(parity, {**ok, "metrics": {"min_cosine": 0.9, "max_rel_error": 5e-5}})
    assert low == ["metrics: passed with cosine 0.9 below its tolerance 0.99999"]
    high = records.invariants(parity, {**ok, "metrics": {"min_cosine": 0.999995, "max_rel_error": 0.2}})
    assert len(high) == 1 and "relative error 0.2 above its tolerance 0.0001" in high[0]
    deploy = run / "deploy" / "fp16" / "parity.json"
    rows = [{"image": "a", "cosine": 0.99999, "max_rel_error": 1e-5}, {"image": "b", "cosine": 0.5, "max_rel_error": 1e-5}]
    gated = {"passed": True, "tolerance": {"min_cosine": 0.9999, "max_rel_error": 1e-3}, "images": rows}
    assert [e.split(":")[0] for e in records.invariants(deploy, gated)] == ["images.1"]
    assert records.invariants(deploy, {**gated, "gated": False}) == []  # measured, not gated: no tolerance to meet

    ort = run / "sensitivity" / "vision" / "224x224" / "fp32" / "ort.json"
    ort.parent.mkdir(parents=True)
    ort.with_suffix(".csv").write_text("op,score\n" + "".join(f"/op{i},0.1\n" for i in range(4)))
    assert records.invariants(ort, {"ops": 4}) == []
    assert records.invariants(ort, {"ops": 51}) == ["ops: 51, but ort.csv beside it has 4 rows"]

    measure = run / "measure" / "int4-mixed.json"
    assert records.invariants(measure, _measure()) == []
    assert records.invariants(measure, {**_measure(), "mean_kl": 1e-9})[0].startswith("mean_kl: 1e-09, but its 2")


def test_every_variant_the_config_accepts_is_one_its_records_accept():
    """A variant the config may name (a graph's ``variants``, its ``sensitivity_variants``, the
    parts' ``variants``) is one the parity, profile and parts records accept: an ``fp32-smooth``
    run's records once failed ``python -m vlsens.core.records`` though every job had passed."""
    import yaml

    from vlsens.config import VARIANTS
    from vlsens.core.records import SCHEMAS

    def enums(node, key=None):
        if isinstance(node, dict):
            if key is not None and isinstance(node.get("items"), dict) and "enum" in node["items"]:
                yield key, set(node["items"]["enum"])
            for k, v in node.items():
                yield from enums(v, k)
        elif isinstance(node, list):
            for v in node:
                yield from enums(v, key)

    config = yaml.safe_load((SCHEMAS.parent / "config.schema.yaml").read_text())
    named = {}
    for key, values in enums(config):
        if values & {"fp32", "fp16"}:
            named.setdefault(key, set()).update(values)
    assert named["variants"] == set(VARIANTS) and "fp32-smooth" in named["sensitivity_variants"]

    def record(kind):
        return set(yaml.safe_load((SCHEMAS / f"{kind}.schema.yaml").read_text())["properties"]["variant"]["enum"])

    assert named["variants"] <= record("parity")
    assert named["variants"] <= record("parts")
    assert named["sensitivity_variants"] <= record("eval")
