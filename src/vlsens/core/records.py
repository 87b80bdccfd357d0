"""The JSON records the workflow writes, each documented once by a JSON Schema
(``workflow/schemas/records/<name>.schema.yaml``) and checked against it in the tests:

=====================  ====================================================  ===================
record                 where                                                 schema
=====================  ====================================================  ===================
``parity.json``        every model folder ``<graph>/<variant>/``             ``parity``
``manifest.json``      every calibration folder ``calib/<graph>/``          ``manifest``
``engine.json``        ``sensitivity/<graph>/<variant>/engine/``             ``engine``
``ort.json``           beside ``ort.csv``                                    ``ort``
``inc.json``           beside ``inc.csv``                                    ``inc``
``compare.json``       beside both CSVs                                      ``compare``
``eval.json``          ``profile/<graph>/<variant>/``                        ``eval``
``eval.json``          ``sensitivity/<graph>/<variant>/inc-tune/``           ``inc_tune``
``parity.json``        ``deploy/<precision>/``                               ``deploy_parity``
``eval.json``          ``deploy/<precision>/``                               ``deploy_eval``
``engine.json``        ``sensitivity/<graph>/<variant>/nbits-engine/``       ``nbits_engine``
``nbits.json``         beside ``nbits.csv``                                  ``nbits``
``int4.json``          ``deploy/``                                           ``deploy_int4``
``parts.json``         ``parts/<graph>/<variant>/``                          ``parts``
``manifest.json``      ``calib/<graph>/parts-<variant>/``                    ``parts_calibration``
``<folder>.json``      ``measure/`` (one per deploy folder but fp32)         ``measure``
``compare.json``       ``measure/``                                          ``measure_compare``
``accuracy.json``      ``measure/``                                          ``measure_accuracy``
``answers.json``       ``deploy/<precision>/``                               ``deploy_answers``
``cases.json``         ``measure/cases/``                                    ``measure_cases``
``components.json``    ``budget/``                                           ``budget_components``
``front.json``         ``budget/``                                           ``budget_front``
``measured.json``      ``budget/``                                           ``budget_measured``
``latency.json``       ``budget/``                                           ``budget_latency``
``nbits.json``         ``budget/``                                           ``nbits``
``vision.json``        ``budget/``                                           ``budget_vision``
``engine.json``        ``budget/nbits-engine/``                              ``nbits_engine``
``recommend.json``     ``results/<model>/``                                  ``recommend``
=====================  ====================================================  ===================

    python -m vlsens.core.records results/tiny     # check every record under a folder

Each record is checked against its schema and then against its own invariants
(:func:`invariants`: a passing gate meets its tolerance, counts agree with the CSV beside them).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas" / "records"  # workflow/schemas/records (package data)
BY_NAME = {"parity.json": "parity", "manifest.json": "manifest", "engine.json": "engine", "ort.json": "ort",
           "inc.json": "inc", "compare.json": "compare", "eval.json": "eval", "nbits.json": "nbits",
           "parts.json": "parts"}
#: The whole-VLM plan's records in ``budget/`` (its ``nbits.json`` and ``nbits-engine/engine.json``: BY_NAME's).
BUDGET = {"components.json": "budget_components", "front.json": "budget_front", "measured.json": "budget_measured",
          "vision.json": "budget_vision", "latency.json": "budget_latency"}


def schema_name(path: str | Path) -> str | None:
    """The schema of a record file (None: not a record)."""
    path = Path(path)
    if path.parent.name == "measure" and path.suffix == ".json":
        return {"compare.json": "measure_compare", "accuracy.json": "measure_accuracy"}.get(path.name, "measure")
    if path.name == "cases.json" and path.parent.name == "cases" and path.parent.parent.name == "measure":
        return "measure_cases"
    if path.parent.name == "budget" and path.name in BUDGET:
        return BUDGET[path.name]
    if path.name == "recommend.json":
        return "recommend"
    if path.name == "toolchain.json":
        return "toolchain"
    if path.name.endswith("pulsar2.json") or path.name == "pulsar2_qdq.json":
        return "pulsar2"
    if path.name == "eval.json" and path.parent.name == "inc-tune":
        return "inc_tune"
    if path.name == "engine.json" and path.parent.name == "nbits-engine":
        return "nbits_engine"
    if path.name == "int4.json" and path.parent.name == "deploy":
        return "deploy_int4"
    if path.name == "manifest.json" and path.parent.name.startswith("parts-"):
        return "parts_calibration"
    if path.name == "manifest.json" and "calib" not in path.parts:
        return None
    if path.name == "answers.json" and (path.parent / "genai_config.json").is_file():  # a folder copied elsewhere
        return "deploy_answers"
    if "deploy" in path.parts and path.name in ("parity.json", "eval.json", "answers.json"):
        return "deploy_" + path.stem
    return BY_NAME.get(path.name)


@functools.cache
def _validator(name: str):
    import jsonschema
    import yaml
    from referencing import Registry, Resource

    resources = []
    for f in sorted(SCHEMAS.glob("*.schema.yaml")):
        contents = yaml.safe_load(f.read_text())
        contents["$id"] = f.resolve().as_uri()
        resources.append((contents["$id"], Resource.from_contents(contents)))
    registry = Registry().with_resources(resources)
    schema = registry.contents((SCHEMAS / f"{name}.schema.yaml").resolve().as_uri())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def errors(path: str | Path, data: dict | None = None) -> list[str]:
    """Schema violations of a record (``data``: its content, default read from ``path``), then,
    where its schema holds, violations of its own invariants (:func:`invariants`)."""
    name = schema_name(path)
    if name is None:
        raise ValueError(f"{path}: not a vlsens record ({', '.join(sorted(BY_NAME))})")
    if data is None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return [f"<record>: not JSON ({str(e).splitlines()[0][:120]}): cut or edited after it was written; "
                    f"rebuild it with snakemake --forcerun {path}"]
    out = []
    for e in sorted(_validator(name).iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        out.append(f"{'.'.join(map(str, e.absolute_path)) or '<record>'}: {e.message}")
    return out or invariants(path, data)


def _gate(metrics: dict, tolerance: dict, where: str) -> list[str]:
    """A passing gate's metrics against its own tolerance (cosine at least, relative error at most)."""
    out = []
    if "min_cosine" in tolerance and metrics.get("min_cosine", 1.0) < tolerance["min_cosine"]:
        out.append(f"{where}: passed with cosine {metrics['min_cosine']} below its tolerance {tolerance['min_cosine']}")
    if "max_rel_error" in tolerance and metrics.get("max_rel_error", 0.0) > tolerance["max_rel_error"]:
        out.append(f"{where}: passed with relative error {metrics['max_rel_error']} above its tolerance "
                   f"{tolerance['max_rel_error']}")
    return out


def _csv_rows(csv: Path) -> int:
    with open(csv, newline="") as fh:
        return max(sum(1 for line in fh if line.strip()) - 1, 0)


def invariants(path: str | Path, data: dict) -> list[str]:
    """What a record says about itself and its neighbours, checked: a passing parity gate meets its
    own tolerance (a model folder's worst case; a gated deploy folder's every image); the ops an
    ``ort.json`` or ``nbits.json`` counts are the rows of the CSV beside it; a folder's measure
    has the mean of its cases' KL as its mean."""
    path, name, out = Path(path), schema_name(path), []
    if name == "parity" and data.get("passed"):
        out += _gate(data["metrics"], data.get("tolerance") or {}, "metrics")
    if name == "deploy_parity" and data.get("gated") is not False and data.get("passed"):
        for i, row in enumerate(data["images"]):
            out += _gate({"min_cosine": row["cosine"], "max_rel_error": row["max_rel_error"]},
                         data.get("tolerance") or {}, f"images.{i}")
    if name in ("ort", "nbits") and path.with_suffix(".csv").is_file():
        rows = _csv_rows(path.with_suffix(".csv"))
        if int(data["ops"]) != rows:
            out.append(f"ops: {data['ops']}, but {path.with_suffix('.csv').name} beside it has {rows} rows")
    if name == "deploy_answers":
        right = data["correct"].count("1")
        if len(data["correct"]) != data["count"] or right != data["accuracy"]["correct"]:
            out.append(f"accuracy.correct: {data['accuracy']['correct']}, but {right} of its {len(data['correct'])} "
                       f"answers are marked right ({data['count']} questions)")
    if name == "measure" and data["cases"]:
        mean = sum(float(c["kl"]) for c in data["cases"]) / len(data["cases"])
        if abs(mean - float(data["mean_kl"])) > 1e-9 * max(abs(mean), 1e-30) + 1e-18:
            out.append(f"mean_kl: {data['mean_kl']}, but its {len(data['cases'])} cases' mean is {mean}")
    return out


def records_under(folder: str | Path) -> list[Path]:
    """Every record under ``folder``, not those of an output's previous version kept aside while
    its job runs again (:func:`vlsens.core.outputs.keep_previous`)."""
    from vlsens.core.outputs import RECORD_DIR

    return sorted(p for p in Path(folder).rglob("*.json")
                  if schema_name(p) is not None and RECORD_DIR not in p.relative_to(folder).parts)


def _main(argv: list[str]) -> int:
    import argparse
    from collections import Counter

    ap = argparse.ArgumentParser(prog="python -m vlsens.core.records",
                                 description="Check every JSON record under the given folders against its schema "
                                             "(workflow/schemas/records/) and its invariants, and every file a job "
                                             "wrote against what the job recorded (vlsens.core.outputs); one line "
                                             "per problem, then a summary.")
    ap.add_argument("folders", nargs="*", default=["results"], help="run folders (default: results)")
    args = ap.parse_args(argv)
    bad = 0
    for folder in args.folders:
        if not Path(folder).is_dir():
            print(f"{folder}: no such folder", file=sys.stderr)
            return 2
        found = records_under(folder)
        if not found:
            print(f"{folder}: no vlsens records under it (is it a run folder, results/<model>?)", file=sys.stderr)
            return 2
        problems = 0
        for p in found:
            for line in errors(p):
                print(f"{p}: {line}")
                problems += 1
        from vlsens.core.outputs import check_run
        from vlsens.core.outputs import records_under as recorded

        outputs = recorded(folder)
        for _, lines in check_run(folder, update=False).values():  # every file a job wrote, as it wrote it
            for line in lines:
                print(line)
                problems += 1
        kinds = Counter(schema_name(p) for p in found)
        verdict = "all valid" if not problems else f"{problems} problem(s)"
        print(f"{folder}: {len(found)} records ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
              f"{len(outputs)} recorded outputs: {verdict}")
        bad += problems
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
