"""The end-to-end measure of onnxruntime-genai deploy folders, the way a user runs them: every
stratified case (:mod:`vlsens.deploy.cases`) through the folder's own chat template, image
preprocessing and KV-cache decoder.

:func:`reference` runs the fp32 folder once: its greedy tokens per case and, teacher-forced on
them, its log-probabilities at every generated step (``reference.npz``). :func:`measure_folder`
then runs any folder teacher-forced on those tokens and scores each step against the reference:
KL(fp32 || folder) and whether the folder's top-1 token is the fp32 token. Only the generated
steps count (what a user reads), and every folder sees the same prompts, images and token
prefixes, so two folders' rows pair case by case (:func:`vlsens.deploy.measure.paired`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from vlsens.core.errors import VlsensError
from vlsens.deploy.measure import kl_steps, log_softmax, summarize

REFERENCE = "the fp32 folder through onnxruntime-genai, teacher-forced on its greedy tokens"
POSITIONS = "the generated steps only (what a user reads)"


def _paths(case: dict) -> list[str]:
    return [f["path"] for f in case["images"]]


def _identity(case: dict) -> dict:
    """What a case must agree on between the reference and a measured folder."""
    return {"name": case["name"], "modality": case["modality"], "prompt": case["prompt"],
            "images": [[f["file"] if "file" in f else Path(f["path"]).name, list(f["size"])] for f in case["images"]]}


def reference(fp32_folder: str | Path, cases: list[dict], max_new_tokens: int, out_npz: str | Path) -> dict:
    """Greedy tokens (at most ``max_new_tokens``) and teacher-forced log-probabilities (float32,
    from a float64 log-softmax) of the fp32 folder on every case, written atomically to
    ``out_npz``: ``__index__`` (JSON: ``folder``, ``max_new_tokens``, per case its ``name``,
    ``modality``, ``tokens``, prompt and images) and ``<i:04d>/logp`` per case. Returns the index;
    raises VlsensError when a case yields no token."""
    from vlsens.core.fsutil import savez
    from vlsens.deploy.genai.runtime import Chat

    chat = Chat(fp32_folder, prepack=False, provider="cpu")  # a reference: memory-mapped weights
    index = {"folder": str(fp32_folder), "max_new_tokens": int(max_new_tokens), "cases": []}
    arrays = {}
    try:
        for i, case in enumerate(cases):
            paths = _paths(case)
            text = chat.prompt(case["prompt"], len(paths))
            tokens = chat.generate(text, paths, max_new_tokens)
            if not tokens:
                raise VlsensError(f"{fp32_folder}: case {case['name']} generated no token (the first one ended the "
                                  "sequence): nothing to measure on it")
            arrays[f"{i:04d}/logp"] = log_softmax(chat.forced_logits(text, paths, tokens)).astype(np.float32)
            index["cases"].append({**_identity(case), "tokens": [int(t) for t in tokens]})
    finally:
        chat.close()
    savez(out_npz, {"__index__": np.array(json.dumps(index)), **arrays})
    return index


def load_reference(npz: str | Path) -> tuple[dict, list[np.ndarray]]:
    """``(index, log-probabilities per case)`` of a :func:`reference` file (no pickled objects)."""
    from vlsens.core.fsutil import open_npz

    with open_npz(npz) as z:
        index = json.loads(str(z["__index__"][()]))
        return index, [z[f"{i:04d}/logp"] for i in range(len(index["cases"]))]


def _check_cases(index: dict, cases: list[dict], reference_npz) -> list[dict]:
    """``cases`` in the reference's order; VlsensError naming the first case that differs."""
    by_name = {c["name"]: c for c in cases}
    if len(by_name) != len(cases):
        raise VlsensError("a case name occurs twice in the cases given")
    ref_names = [c["name"] for c in index["cases"]]
    for n in [*ref_names, *by_name]:
        if n not in by_name or n not in ref_names:
            side = "the cases given" if n not in by_name else f"the reference {reference_npz}"
            raise VlsensError(f"case {n} is missing from {side}: a folder is measured on the reference's cases")
    for ref in index["cases"]:
        mine = _identity(by_name[ref["name"]])
        theirs = {k: ref.get(k) for k in mine}
        if mine != theirs:
            raise VlsensError(f"case {ref['name']} differs from the reference {reference_npz}: {mine} against {theirs}")
    return [by_name[n] for n in ref_names]


def _row(case: dict, logp: np.ndarray, tokens: list[int], q: np.ndarray) -> dict:
    kl = kl_steps(logp, q)
    top1 = q.argmax(-1) == np.asarray(tokens)
    return {"name": case["name"], "modality": case["modality"], "kl": float(kl.mean()), "max_kl": float(kl.max()),
            "top1": float(top1.mean()), "steps": int(kl.size)}


def folder_weight_bytes(folder: str | Path) -> int:
    """Bytes of a folder's graphs and their data files (``*.onnx``, ``*.onnx.data``)."""
    return sum(f.stat().st_size for f in Path(folder).iterdir()
               if f.is_file() and (f.name.endswith(".onnx") or f.name.endswith(".onnx.data")))


def measure_folder(folder: str | Path, reference_npz: str | Path, cases: list[dict], name: str,
                   prepack: bool = True, modalities: set[str] | None = None) -> dict:
    """One folder's measure: per case (in the reference's order) its logits teacher-forced on the
    reference tokens against the reference's log-probabilities (mean and max KL over the steps,
    top-1 agreement with the reference token) under ``cases``, :func:`~vlsens.deploy.measure.summarize`
    over them (its case count replaced by the rows), the folder's graph bytes and the wall time. ``name``: the folder as reported;
    ``prepack``: as :class:`~vlsens.deploy.genai.runtime.Chat` takes it; ``modalities``: run only
    the cases of these (a part that no other case reaches: the vision graph and text prompts),
    the summary over them alone."""
    from vlsens.deploy.genai.runtime import Chat

    t0 = time.perf_counter()
    index, logps = load_reference(reference_npz)
    ordered = _check_cases(index, cases, reference_npz)
    chat = Chat(folder, prepack=prepack, provider="cpu")
    rows = []
    try:
        for case, ref, logp in zip(ordered, index["cases"], logps):
            if modalities is not None and case["modality"] not in modalities:
                continue
            paths = _paths(case)
            text = chat.prompt(case["prompt"], len(paths))
            rows.append(_row(case, logp, ref["tokens"], chat.forced_logits(text, paths, ref["tokens"])))
    finally:
        chat.close()
    return {"folder": name, "reference": REFERENCE, "positions": POSITIONS, "max_new_tokens": index["max_new_tokens"],
            "bytes": folder_weight_bytes(folder), **summarize(rows), "cases": rows,  # the rows, not summarize's count
            "seconds": time.perf_counter() - t0}
