"""The deploy job: assemble one folder, check it, publish it only when every check passed."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from vlsens.core import paths
from vlsens.deploy import DONE, prepacked
from vlsens.deploy.card import write_card
from vlsens.deploy.genai.assemble import assemble
from vlsens.deploy.genai.evaluate import Checks, eval_cases, evaluate, transformers_generate, vision_parity
from vlsens.deploy.genai.folder import GRAPHS, set_provider
from vlsens.deploy.genai.runtime import Chat

log = logging.getLogger(__name__)


def folder_files(folder: Path) -> dict:
    """``files`` of a deploy folder's ``eval.json``: the bytes and SHA-256 of every file in it but
    ``eval.json`` itself (graphs, data, configs, tokenizer, template, ``parity.json``)."""
    from vlsens.core import job
    from vlsens.core.fsutil import file_sha256

    out: dict = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
                 for p in sorted(folder.iterdir()) if p.is_file() and p.name != DONE}
    out["rule"] = job.rule
    return out


def _finish(tmp: Path, record: dict, extra: dict[str, Path] | None) -> None:
    """The folder's last files: ``extra`` (a plan's file), then ``eval.json`` with every other file
    of the folder as it ships (a copy of the folder is checked against these)."""
    import shutil

    from vlsens.core.fsutil import write_json

    for name, src in (extra or {}).items():
        shutil.copyfile(src, tmp / name)
    record["files"] = folder_files(tmp)
    write_json(tmp / DONE, record)


def _complete_parity(parity: dict, files: dict, embedding_gate: dict | None, sources: dict) -> None:
    """The folder's parity record completed (in place): its files, the tied embedding's gate, the
    run's graphs it was built from."""
    parity["files"] = files
    if embedding_gate is not None:
        parity["embedding"] = {k: embedding_gate[k] for k in ("passed", "metrics", "tolerance", "reference")}
        parity["embedding"]["float_reference"] = embedding_gate["extra"]["float_reference"]["metrics"]
        parity["embedding"]["tied"] = "embedding.onnx reads lm_head's weight from decoder.onnx.data"
    parity["sources"] = sources


def _answer(tmp: Path, precision: str, runtime, checks: Checks) -> dict | None:
    """The task's questions answered by the staged folder (``answers.json`` in it), with the fp32
    folder's answers beside them for the card (None where the run does not score the task)."""
    from vlsens.core.fsutil import write_json
    from vlsens.deploy.genai.answers import FILE, answer

    if not checks.questions:
        return None
    t0 = time.perf_counter()
    record = answer(runtime, checks.questions, precision)
    write_json(Path(tmp) / FILE, record)
    log.info("deploy %s: answered %d questions in %.1f s, %.1f %% right", precision, record["count"],
             time.perf_counter() - t0, 100 * record["accuracy"]["accuracy"])
    fp32 = Path(checks.fp32_folder) / FILE if checks.fp32_folder else None
    return {"own": record, "fp32": json.loads(fp32.read_text()) if fp32 is not None and fp32.is_file() else None}


def _with_source(graph) -> tuple:
    """``(graph, what the record names as its source)``: a graph of the run is its own source."""
    return graph if isinstance(graph, tuple) else (graph, graph)


def build_folder(precision: str, out_dir: str | Path, checkpoint: str | Path, decoder: str | Path,
                 embedding: str | Path, vision: str | Path, images, checks: Checks,
                 extra: dict[str, Path] | None = None) -> dict:
    """Assemble, gate and evaluate one deploy folder (``checks``: what it is checked against, the tied embedding gate
    among them); publish it only when every check passed. ``extra``: files copied in under the given names (a plan's
    file). ``decoder`` / ``vision`` may be ``(scratch graph, the run's graph it was built from)``: the record names it."""
    import tempfile

    from vlsens.core.artifacts import file_entries
    from vlsens.core.fsutil import atomic_dir, write_json

    out_dir, (decoder, decoder_src), (vision, vision_src) = Path(out_dir), *map(_with_source, (decoder, vision))
    fp32_folder, tied, max_new_tokens = checks.fp32_folder, checks.tied, checks.max_new_tokens
    fp32_eval = json.loads((Path(fp32_folder) / DONE).read_text()) if fp32_folder else None
    with atomic_dir(out_dir) as tmp, tempfile.TemporaryDirectory(prefix="vlsens-deploy-") as work:
        t0 = time.perf_counter()
        files = assemble(tmp, checkpoint, decoder, embedding, vision, Path(work) / "preamble", tied=tied is not None,
                         preamble_from=Path(fp32_folder) / GRAPHS["vision"] if fp32_folder else None)
        if checks.provider != "cpu":
            set_provider(tmp, checks.provider)
        embedding_gate = None
        if tied is not None:
            from vlsens.precision.weight_only import gate_tied

            token = int(json.loads((Path(checkpoint) / "config.json").read_text())["image_token_id"])
            embedding_gate = gate_tied(tmp, tied["reference"], token, tied["exact_tolerance"])
            log.info("deploy %s: the tied embedding gathers lm_head's rows exactly (min cosine %.8f); against the "
                     "checkpoint's table min cosine %.6f", precision, embedding_gate["metrics"]["min_cosine"],
                     embedding_gate["extra"]["float_reference"]["metrics"]["min_cosine"])
        log.info("deploy %s: assembled in %.1f s (%s)", precision, time.perf_counter() - t0, ", ".join(sorted(files)))
        cases = eval_cases(images, Path(work) / "images")
        # transformers' tokens before the folder is loaded: the two float32 models never sit in
        # memory together (at 3B with all 36 layers each is 14-15 GB)
        if precision == "fp32":
            t0 = time.perf_counter()
            expected = transformers_generate(checkpoint, cases, max_new_tokens)
            log.info("deploy fp32: transformers generated %d case(s) in %.1f s", len(cases), time.perf_counter() - t0)
        else:
            expected = None
        t0 = time.perf_counter()
        runtime = Chat(tmp, prepack=prepacked(precision), provider="cpu")  # loaded once for both checks
        log.info("deploy %s: onnxruntime-genai loaded the folder in %.1f s; vision parity", precision,
                 time.perf_counter() - t0)
        parity = vision_parity(tmp, checkpoint, cases, checks.tolerance, runtime, checks.vision_features)
        _complete_parity(parity, file_entries(files.values(), single_file=True), embedding_gate,
                         {"decoder": str(decoder_src), "embedding": str(embedding), "vision": str(vision_src)})
        write_json(tmp / paths.RECORD, parity)
        answers = _answer(tmp, precision, runtime, checks)  # before the evaluation, which closes the runtime
        t0 = time.perf_counter()
        record = evaluate(tmp, precision, checkpoint, cases, checks, fp32_eval, runtime, expected)
        log.info("deploy %s: evaluated in %.1f s", precision, time.perf_counter() - t0)
        del runtime
        for c in record["cases"]:  # the images lived in a temporary folder: keep their names
            c["images"] = [{"source": f["source"], "size": f["size"]} for f in c["images"]]
        write_card(tmp, out_dir.name, record, parity, checkpoint, out_dir.parents[1], plan="plan.yaml" in (extra or {}),
                   answers=answers)
        _finish(Path(tmp), record, extra)
    return record
