"""The int4 deploy folders side by side: ``results/<model>/deploy/int4.json`` and ``int4.md``.

Per folder: the decoder's bytes (graph + data file, as shipped), how many MatMuls are INT4 /
INT8 / float, the KL per generated step and top-1 agreement with the fp32 folder through
onnxruntime-genai (teacher-forced on its tokens, from the folder's ``eval.json``) and the decode
speed of its evaluation; the bytes of its three graphs. The goals the int4-mixed folder is held to
are stated next to it: at equal or fewer decoder bytes, a KL of at most half the builder's
llama.cpp heuristic (``int4-k_quant_mixed``); the whole folder at most 0.3x the FP16 folder's bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlsens.core import paths
from vlsens.deploy import DONE
from vlsens.deploy.card import CARD
from vlsens.deploy.genai import folder as genai

HEURISTIC = "int4-k_quant_mixed"
#: The int4-mixed folder's bytes against the FP16 folder's, at most.
FOLDER_GOAL = 0.3


def decoder_bits(folder: Path) -> dict[str, int]:
    import onnx

    m = onnx.load(str(folder / genai.GRAPHS["decoder"]), load_external_data=False)
    out = {"int4": 0, "int8": 0, "float": 0}
    for n in m.graph.node:
        if n.op_type == "MatMulNBits":
            bits = next(a.i for a in n.attribute if a.name == "bits")
            out[f"int{bits}"] += 1
        elif n.op_type == "MatMul" and any(i in {t.name for t in m.graph.initializer} for i in n.input[1:]):
            out["float"] += 1
    return out


#: vlsens' own records in a deploy folder: its measure, parity record, card and plan file
#: (vlsens.budget.plan.PLAN_FILE). They hold measured times whose digits vary from run to run.
RECORDS = (DONE, paths.RECORD, CARD, "plan.yaml")


def folder_bytes(folder: Path) -> int:
    """The files of a deploy folder the runtime loads (graphs, data files, configs, tokenizer),
    without vlsens' records (:data:`RECORDS`): the same folder built twice has the same size."""
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file() and f.name not in RECORDS)


def graph_bytes(folder: Path) -> dict[str, int]:
    """Each graph of a deploy folder with its data file: ``{decoder, embedding, vision}``."""
    from vlsens.core.onnxutil import model_bytes

    return {key: model_bytes(Path(folder) / name) for key, name in genai.GRAPHS.items()}


def table(folders: dict[str, str | Path]) -> dict:
    """``{precision: row}`` for the given int4 deploy folders, their sizes against the fp16
    folder's (or, where none was built, half the fp32 folder's: every weight in 2 bytes), and
    the goal's verdict."""
    rows = {}
    for precision, folder in folders.items():
        if precision in ("fp32", "fp16"):
            continue
        folder = Path(folder)
        ev = json.loads((folder / DONE).read_text())
        graphs = graph_bytes(folder)
        rows[precision] = {
            "decoder_bytes": graphs["decoder"],
            "graph_bytes": graphs,
            "folder_bytes": folder_bytes(folder),
            "matmuls": decoder_bits(folder),
            "mean_kl": ev.get("mean_kl"),
            "top1_agreement": ev.get("top1_agreement"),
            "tokens_per_second": ev.get("tokens_per_second"),
            "case_kl": {c["case"]: c.get("mean_kl") for c in ev.get("cases", [])},
        }
    out = {"rows": rows, "reference": "the fp32 folder through onnxruntime-genai, teacher-forced on its greedy tokens"}
    if "fp16" in folders:
        out["fp16_bytes"], out["fp16_source"] = folder_bytes(Path(folders["fp16"])), "the fp16 folder"
    elif "fp32" in folders:
        out["fp16_bytes"] = folder_bytes(Path(folders["fp32"])) // 2
        out["fp16_source"] = "half the fp32 folder (no fp16 folder built)"
    if "fp16_bytes" in out:
        for r in rows.values():
            r["folder_vs_fp16"] = r["folder_bytes"] / out["fp16_bytes"]
    mine, heur = rows.get("int4-mixed"), rows.get(HEURISTIC)
    if mine and heur and mine["mean_kl"] is not None and heur["mean_kl"] is not None:
        out["goal"] = {
            "statement": f"int4-mixed: decoder bytes <= {HEURISTIC}'s and mean KL <= 0.5x {HEURISTIC}'s",
            "bytes_ratio": mine["decoder_bytes"] / heur["decoder_bytes"],
            "kl_ratio": mine["mean_kl"] / heur["mean_kl"] if heur["mean_kl"] > 0 else None,
        }
        out["goal"]["met"] = bool(out["goal"]["bytes_ratio"] <= 1.0 and out["goal"]["kl_ratio"] is not None
                                  and out["goal"]["kl_ratio"] <= 0.5)
        # the case without an image: the decoders alone (every int4 folder has the same vision graph)
        mt, ht = mine["case_kl"].get("text"), heur["case_kl"].get("text")
        out["goal"]["text_kl_ratio"] = mt / ht if mt is not None and ht else None
    if mine and "folder_vs_fp16" in mine:
        out["bytes_goal"] = {"statement": f"int4-mixed: folder bytes <= {FOLDER_GOAL}x the fp16 folder's",
                             "ratio": mine["folder_vs_fp16"], "met": bool(mine["folder_vs_fp16"] <= FOLDER_GOAL)}
    return out


def markdown(result: dict) -> str:
    lines = ["| folder | decoder MB | embedding MB | vision MB | folder / fp16 | INT4 / INT8 / float MatMuls "
             "| mean KL vs fp32 | top-1 vs fp32 | tok/s |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for p, r in result["rows"].items():
        m = r["matmuls"]
        tps = r["tokens_per_second"]
        ratio = r.get("folder_vs_fp16")
        g = r.get("graph_bytes", {})
        lines.append(f"| {p} | {r['decoder_bytes'] / 1e6:.3f} | {g.get('embedding', 0) / 1e6:.3f} | "
                     f"{g.get('vision', 0) / 1e6:.3f} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
                     f"{m['int4']} / {m['int8']} / {m['float']} | {r['mean_kl']:.3g} | {r['top1_agreement']:.3f} | "
                     f"{'-' if tps is None else f'{tps:.1f}'} |")
    if "fp16_bytes" in result:
        lines += ["", f"fp16: {result['fp16_bytes'] / 1e6:.1f} MB ({result['fp16_source']}). tok/s: tokens of "
                      "onnxruntime-genai's generate over the evaluation cases / their seconds (image encoding and "
                      "prefill included; bench/bench_deploy.py separates decode)."]
    g = result.get("goal")
    if g:
        kl = "-" if g["kl_ratio"] is None else f"{g['kl_ratio']:.2f}"
        text = "" if g.get("text_kl_ratio") is None else \
            f" (on the text case, no image, the decoders alone: {g['text_kl_ratio']:.2f}x)"
        lines += ["", f"Goal ({g['statement']}): bytes {g['bytes_ratio']:.2f}x, KL {kl}x{text}: "
                      f"{'met' if g['met'] else 'not met'}."]
    bg = result.get("bytes_goal")
    if bg:
        lines += ["", f"Goal ({bg['statement']}): {bg['ratio']:.3f}x: {'met' if bg['met'] else 'not met'}."]
    return "\n".join(lines) + "\n"


def write_pair(result: dict, to_markdown, out_json: str | Path, out_md: str | Path) -> dict:
    """A comparison as its JSON record and its Markdown table (each written atomically)."""
    from vlsens.core.fsutil import atomic_file, write_json

    write_json(out_json, result)
    with atomic_file(out_md) as tmp:
        Path(tmp).write_text(to_markdown(result))
    return result


def write(folders: dict[str, str | Path], out_json: str | Path, out_md: str | Path) -> dict:
    return write_pair(table(folders), markdown, out_json, out_md)
