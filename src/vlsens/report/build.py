"""The report's stages: read the records of a run, draw a figure or write a table.

One function per rule of ``rules/report.smk``; the figures themselves are in
:mod:`vlsens.report.figures`, the tables in :mod:`vlsens.report.tables`.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from vlsens.report import figures, tables
from vlsens.report.verdict import EIGHT_BIT
from vlsens.sensitivity.ranking import read_csv


def kept_in_float(profile_yaml: str | Path | None) -> set[str]:
    """The ops a profile keeps in float."""
    if not profile_yaml:
        return set()
    prof = yaml.safe_load(Path(profile_yaml).read_text())
    return {op for op, o in (prof.get("ops") or {}).items() if o.get("precision") not in EIGHT_BIT}


def wide_ops(profile_yaml: str | Path | None) -> set[str]:
    """The ops a profile gives 16-bit activations (W8A16)."""
    if not profile_yaml:
        return set()
    prof = yaml.safe_load(Path(profile_yaml).read_text())
    return {op for op, o in (prof.get("ops") or {}).items() if o.get("precision") == "int8-a16"}


def tower_facts(config: dict, graph: str, preset_json: str | Path | None) -> tuple[tuple[int, str] | None, str]:
    """What the report needs from a graph's tower: where a tiny preset (its ``vlsens_preset.json``)
    planted an outlier in it (:meth:`~vlsens.export.towers.base.Tower.planted_site`; None for a real
    checkpoint) and what its blocks are called."""
    from vlsens.export import towers

    tower = towers.for_graph(config, graph)
    preset = json.loads(Path(preset_json).read_text()) if preset_json and Path(preset_json).is_file() else {}
    return tower.planted_site(preset), tower.block_label


def planted_ops(rows: list[dict], site: tuple[int, str] | None) -> set[str]:
    """The ops of ``rows`` that read a planted outlier at ``site`` (block, role)."""
    if not site:
        return set()
    block, role = site
    return {r["op"] for r in rows if r["block"] == block and r["role"] == role}


def heatmap(csv: str | Path, profile_yaml, site: tuple[int, str] | None, block_label: str, graph: str, variant: str,
            out: str | Path) -> dict:
    rows = read_csv(csv)
    metric = figures.error_metric(rows).upper()
    return figures.heatmap(rows, out, f"{graph} ({variant}): {metric} with each op alone in INT8 (engine ort)",
                           kept_in_float(profile_yaml), planted_ops(rows, site), block_label, wide_ops(profile_yaml))


def ranked(csv: str | Path, profile_yaml, site: tuple[int, str] | None, graph: str, variant: str, engine: str, top: int,
           out: str | Path) -> list[str]:
    rows = read_csv(csv)
    return figures.ranked(rows, out, f"{graph} ({variant}): the {min(top, len(rows))} most sensitive of "
                          f"{len(rows)} ops, engine {engine}", engine, top, kept_in_float(profile_yaml),
                          planted_ops(rows, site))


def pareto(eval_json: str | Path, graph: str, variant: str, out: str | Path) -> dict:
    record = json.loads(Path(eval_json).read_text())
    return figures.pareto(record, out, f"{graph} ({variant}): profile search, {record['search']['evaluations']} "
                          f"evaluations, status {record['status']}")


def engines(ort_csv, inc_csv, compare_json, graph: str, variant: str, out: str | Path) -> int:
    return figures.engines(read_csv(ort_csv), read_csv(inc_csv), json.loads(Path(compare_json).read_text()), out,
                           f"{graph} ({variant}): engines ort vs inc")


def fp16(record_json: str | Path, graph: str, out: str | Path) -> list[str]:
    record = json.loads(Path(record_json).read_text())
    return figures.fp16_fallback(record["extra"]["graphs"], out, f"{graph} fp16")


def files_bytes(record: dict, names=None) -> int:
    """Bytes of the files a record lists (all, or ``names`` and their external data)."""
    files = {k: v for k, v in record.get("files", {}).items() if isinstance(v, dict)}
    if names is not None:
        files = {k: v for k, v in files.items() if k in names or k.removesuffix(".data") in names}
    return sum(int(v["bytes"]) for v in files.values())


def latency(profiles: dict[str, str], records: dict[str, dict[str, str]], analysed: dict[str, str],
            deploy: dict[str, str], model: str, out: str | Path) -> int:
    """``profiles``: ``"<graph>/<variant>"`` -> profile eval.json; ``records``: graph -> {variant:
    parity.json} of its fp32/fp16 folders; ``analysed``: graph -> the file the profile quantizes;
    ``deploy``: precision -> deploy folder."""
    entries = []
    for key, path in profiles.items():
        graph, variant = key.rsplit("/", 1)
        ev = json.loads(Path(path).read_text())
        sizes = {v: files_bytes(json.loads(Path(p).read_text()), {analysed[graph]})
                 for v, p in records.get(graph, {}).items()}
        entries.append({"graph": f"{graph} [{variant}]", "latency_ms": ev["latency_ms"],
                        "bytes": {**sizes, "int8_mixed": ev["model_bytes"]}})
    folders = []
    for precision, folder in deploy.items():
        rec = json.loads((Path(folder) / "parity.json").read_text())
        ev = json.loads((Path(folder) / "eval.json").read_text())
        folders.append({"precision": precision, "bytes": files_bytes(rec),
                        "tokens_per_second": ev.get("tokens_per_second")})
    return figures.latency_size(entries, out, f"{model}: latency and size per graph (profiles' base, FP16 and "
                                "INT8-mixed models)" + (" and deploy folders" if folders else ""), folders)


def parity_table(records: list[str], root: str | Path, out: str | Path) -> int:
    rows = [tables.parity_row(json.loads(Path(p).read_text()), Path(p).parent, root) for p in records]
    tables.write_html(out, "Parity: every artifact against transformers", tables.PARITY_COLUMNS, rows,
                      "Every ONNX artifact of the run, checked against transformers in PyTorch on real inputs "
                      "(its parity.json). A variant folder is published only when every case passes.")
    return len(rows)


def profile_table(profiles: dict[str, str], out: str | Path) -> int:
    rows = [tables.profile_row(key, json.loads(Path(p).read_text())) for key, p in profiles.items()]
    tables.write_html(out, "Mixed-precision profiles", tables.PROFILE_COLUMNS, rows,
                      "Per analysed graph and base variant: the profile's target and deployment target (quant.target), "
                      "the search's estimate for its choice and what the shipped model measures in that target's "
                      "arithmetic against its float base on the evaluation set, how many models were built, how much "
                      "of it runs in INT8, and its latency next to FP32 timed in the same process.")
    return len(rows)


def int4(table_json: str | Path, nbits_csv: str | Path, profile_record: str | Path, pareto_out: str | Path,
         heatmap_out: str | Path) -> dict:
    """The int4 deploy folders' size against KL, and the decoder's weight-only sensitivity with
    the bits the int4-mixed profile chose."""
    import pandas as pd

    table = json.loads(Path(table_json).read_text())
    rows = pd.read_csv(nbits_csv, keep_default_na=False).to_dict("records")
    graph = json.loads(Path(profile_record).read_text())["extra"]["graphs"]["model.onnx"]
    bits = graph["bits"]
    tied = graph.get("search", {}).get("tied")
    for r in rows:  # lm_head with its tied table: the error the profile measured and budgeted
        if tied and r["op"] == tied["op"]:
            r["error_int4"], r["tied"] = tied["with_table"]["error_int4"], True
    figures.int4_pareto(table, pareto_out, "int4 deploy folders: decoder size vs KL with the fp32 folder "
                        "(onnxruntime-genai)")
    return figures.nbits_heatmap(rows, bits, heatmap_out, "decoder: KL with each MatMul alone in INT4; "
                                 "label: bits of the int4-mixed profile")
