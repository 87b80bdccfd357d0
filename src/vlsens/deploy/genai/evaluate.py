"""A deploy folder checked end to end: the vision graph against transformers on the runtime's own
preprocessing (``parity.json``) and generation through onnxruntime-genai (``eval.json``)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlsens.core.errors import VlsensError
from vlsens.deploy import prepacked
from vlsens.deploy.genai import folder as genai
from vlsens.deploy.genai.runtime import Chat

log = logging.getLogger(__name__)


def eval_cases(images, workdir: str | Path) -> list[dict]:
    """Text only, one image, two images of different sizes (the first two parity images, as PNG
    files both runtimes read; with one parity image, or two of one size, the second is shown at
    two thirds of its width)."""
    from vlsens.data.images import open_rgb
    from vlsens.data.prompts import BUILTIN_PROMPTS

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if not images:
        raise VlsensError("deploy evaluation needs at least one parity image (parity.images)")
    pics = [(open_rgb(ref), ref.name) for ref in images[:2]]
    if len(pics) == 1:
        pics.append(pics[0])
    if pics[0][0].size == pics[1][0].size:  # the two-image case needs two sizes
        im, name = pics[1]
        pics[1] = (im.resize((max(28, im.width * 2 // 3), im.height)), f"{name} (2/3 width)")
    files = []
    for i, (im, name) in enumerate(pics):
        f = workdir / f"image{i}.png"
        # pixels only: an ICC profile would be copied from the source, and scikit-image's photos
        # carry one libpng warns about on every read ("iCCP: known incorrect sRGB profile");
        # neither runtime applies it
        im.save(f, icc_profile=None)
        files.append({"path": str(f), "source": name, "size": [im.height, im.width]})
    return [{"name": "text", "prompt": BUILTIN_PROMPTS[0], "images": []},
            {"name": "one-image", "prompt": BUILTIN_PROMPTS[1], "images": files[:1]},
            {"name": "two-images", "prompt": BUILTIN_PROMPTS[2 % len(BUILTIN_PROMPTS)], "images": files[:2]}]



def chat_text(processor, case: dict) -> str:
    content = [{"type": "image"} for _ in case["images"]] + [{"type": "text", "text": case["prompt"]}]
    return processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)



def transformers_generate(checkpoint, cases: list[dict], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy ``generate`` (float32, eager) for every case: new tokens only."""
    import torch
    from PIL import Image

    from vlsens.model.loading import load_model
    from vlsens.model.processor import load_processor

    model = load_model(checkpoint, attn_implementation="eager")
    processor = load_processor(checkpoint)
    out = []
    for case in cases:
        images = [Image.open(f["path"]).convert("RGB") for f in case["images"]] or None
        inputs = processor(text=[chat_text(processor, case)], images=images, return_tensors="pt")
        with torch.no_grad():
            seq = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        out.append(seq[0, inputs["input_ids"].shape[1]:].tolist())
    return out



def _case_images(case: dict) -> list[str]:
    return [f["path"] for f in case["images"]]



def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    def logsoftmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = logsoftmax(p_logits), logsoftmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)



@dataclass(frozen=True)
class Checks:
    """What a deploy folder is checked against: ``max_new_tokens`` generated per evaluation case;
    ``tolerance``: the vision graph's parity tolerance (None: measured, not gated); ``fp32_folder``:
    the published fp32 folder a lower precision is compared with (None for fp32 itself, which is
    compared with transformers); ``target``: the text profile's target, measured end to end;
    ``vision_features``: transformers' features of the evaluation images
    (:func:`write_vision_features`, the vision parity's reference without running PyTorch);
    ``fp32_logits``: the fp32 folder's logits on the evaluation cases (:func:`write_eval_logits`,
    a lower precision's reference without running the fp32 folder again);
    ``tied`` (``{"reference": the decoder's reference.npz, "exact_tolerance": FP32's}``): the
    embedding graph reads the decoder's lm_head weight, gated on the reference's embedding cases
    (:func:`vlsens.precision.weight_only.gate_tied`); ``provider``: the execution provider the folder
    is written for (``deploy.provider``; its genai_config), while every check runs it on this
    machine's CPU; ``questions``: the task's evaluation questions (a ``questions.jsonl``), answered
    by the folder into its ``answers.json`` (:mod:`vlsens.deploy.genai.answers`), or None."""

    max_new_tokens: int
    tolerance: dict | None = None
    fp32_folder: str | Path | None = None
    target: dict | None = None
    tied: dict | None = None
    vision_features: str | Path | None = None
    provider: str = "cpu"
    fp32_logits: str | Path | None = None
    questions: str | Path | None = None


class _Timed:
    """The folder's greedy ``generate``, timed over the evaluation cases (the record's speed)."""

    def __init__(self, runtime: Chat, max_new_tokens: int, packed: bool):
        self.runtime, self.max_new_tokens, self.packed = runtime, max_new_tokens, packed
        self.seconds, self.tokens = 0.0, 0

    def generate(self, text: str, case: dict) -> list[int]:
        t0 = time.perf_counter()
        got = self.runtime.generate(text, _case_images(case), self.max_new_tokens)
        self.seconds += time.perf_counter() - t0
        self.tokens += len(got)
        return got

    def speed(self) -> dict:
        return {"tokens_per_second": self.tokens / self.seconds if self.seconds else None,
                "prepacked": self.packed,
                "speed_note": "tokens generated / seconds of onnxruntime-genai generate over the evaluation "
                              "cases (image encoding, prefill and greedy decode; the first call included)"
                              + ("" if self.packed else "; weight prepacking off (the fp32 reference folder is "
                                 "checked memory-mapped): bench/bench_deploy.py measures it as users load it")}


def evaluate(folder: str | Path, precision: str, checkpoint: str | Path, cases: list[dict], checks: Checks,
             fp32_eval: dict | None = None, runtime: Chat | None = None,
             expected: list[list[int]] | None = None) -> dict:
    """``eval.json`` of a folder (see the module docs); raises VlsensError when the fp32 folder's
    tokens differ from transformers'. ``fp32_eval``: the fp32 folder's ``eval.json`` (a lower
    precision); ``runtime``: the folder already loaded; ``expected``: transformers' tokens for
    ``cases``, already generated (:func:`transformers_generate`)."""
    from vlsens.model.processor import load_processor

    packed = prepacked(precision)
    gen = _Timed(runtime or Chat(folder, prepack=packed, provider="cpu"), checks.max_new_tokens, packed)
    if precision == "fp32":
        return _against_transformers(folder, precision, checkpoint, load_processor(checkpoint), cases, gen, expected)
    texts = {r["case"]: r.get("text") for r in fp32_eval["cases"]}
    if not all(texts.get(c["name"]) for c in cases):  # an fp32 record written before it kept its texts
        processor = load_processor(checkpoint)
        texts = {c["name"]: chat_text(processor, c) for c in cases}
    return _against_fp32(folder, precision, texts, cases, gen, checks, fp32_eval)


def _against_transformers(folder, precision: str, checkpoint, processor, cases: list[dict], gen: _Timed,
                          expected: list[list[int]] | None) -> dict:
    """The fp32 folder's record: its greedy tokens, which must equal transformers'."""
    max_new_tokens = gen.max_new_tokens
    if expected is None:
        expected = transformers_generate(checkpoint, cases, max_new_tokens)
    rows = []
    for case, ref in zip(cases, expected):
        text = chat_text(processor, case)
        got = gen.generate(text, case)
        rows.append({"case": case["name"], "images": case["images"], "tokens": got, "transformers": ref,
                     "identical": got == ref, "text": text})
    bad = [r["case"] for r in rows if not r["identical"]]
    record = {"precision": precision, "max_new_tokens": max_new_tokens, "reference": "transformers generate "
              "(greedy, float32, eager)", "cases": rows, "identical": not bad, **gen.speed()}
    if bad:
        raise VlsensError(f"{folder}: onnxruntime-genai's greedy tokens differ from transformers' for "
                          f"{bad}: {json.dumps(rows)[:2000]}")
    return record


def _against_fp32(folder, precision: str, texts: dict[str, str], cases: list[dict], gen: _Timed, checks: Checks,
                  fp32_eval: dict) -> dict:
    """A lower precision's record: its tokens, and its logits teacher-forced on the fp32 folder's
    tokens against the fp32 folder's (KL, top-1 agreement; the target's metric among them), each
    case run on the chat text the fp32 folder's tokens were generated from (``texts``: case name
    -> text)."""
    from vlsens.core.artifacts import verify

    fp32_folder = checks.fp32_folder
    for g in genai.GRAPHS.values():  # the fp32 folder is another job's output: check it first
        verify(Path(fp32_folder) / g)
    ref_rows = {r["case"]: r for r in fp32_eval["cases"]}
    # The folder first (its tokens and its logits teacher-forced on the fp32 tokens), released,
    # then the fp32 folder: one folder in memory at a time (at 3B with 36 layers the fp32 one is
    # 14 GB).
    mine = []
    for case in cases:
        text = texts[case["name"]]
        ref_tokens = ref_rows[case["name"]]["tokens"]
        got = gen.generate(text, case)
        mine.append((text, ref_tokens, got, gen.runtime.forced_logits(text, _case_images(case), ref_tokens)))
    gen.runtime.close()
    reference = _Fp32Logits(fp32_folder, checks.fp32_logits)
    rows, kls, agree = [], [], []
    for case, (text, ref_tokens, got, q) in zip(cases, mine):
        kl = _kl(reference(case, text, ref_tokens), q)
        top1 = q.argmax(-1) == np.asarray(ref_tokens)
        kls.append(kl)
        agree.append(top1)
        rows.append({"case": case["name"], "images": case["images"], "tokens": got, "fp32_tokens": ref_tokens,
                     "identical_to_fp32": got == ref_tokens, "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                     "top1_agreement": float(top1.mean())})
    reference.close()
    mean_kl = float(np.concatenate(kls).mean())
    agreement = float(np.concatenate(agree).mean())
    record = {"precision": precision, "max_new_tokens": gen.max_new_tokens,
              "reference": "the fp32 folder through onnxruntime-genai, teacher-forced on its greedy tokens",
              "cases": rows, "mean_kl": mean_kl, "top1_agreement": agreement, **gen.speed()}
    if checks.fp32_logits:
        record["fp32_logits"] = reference.record()
    if checks.target is not None:
        metric, value = checks.target["metric"], float(checks.target["target"])
        measured = {"kl": mean_kl, "top1": agreement}.get(metric)
        met = None if measured is None else (measured <= value if metric == "kl" else measured >= value)
        record["target"] = {"metric": metric, "target": value, "measured": measured, "met": met,
                            "note": "the text profile's target, measured end to end through onnxruntime-genai on "
                                    "the generated steps, with the folder's own vision graph and table (parity.json: "
                                    "sources)"}
    return record



class _Fp32Logits:
    """The fp32 folder's logits on an evaluation case, teacher-forced on its tokens: read from
    ``stored`` (:func:`write_eval_logits`; None: nothing stored) where the case is stored as run
    here (:func:`_logits_key`), else computed by the fp32 folder, loaded on the first such case
    (memory-mapped: a reference)."""

    def __init__(self, fp32_folder, stored: str | Path | None):
        self.fp32_folder, self.path = fp32_folder, stored
        self.stored = _stored_logits(stored, fp32_folder) if stored else {}
        self.base, self.used, self.computed = None, [], []

    def __call__(self, case: dict, text: str, tokens: list[int]) -> np.ndarray:
        hit = self.stored.get(case["name"])
        if hit is not None and hit[0] == _logits_key(case, text, tokens):
            self.used.append(case["name"])
            return hit[1]
        if self.path:
            log.info("evaluation reference: case %s not in %s as run here; the fp32 folder runs it", case["name"],
                     self.path)
        if self.base is None:
            self.base = Chat(self.fp32_folder, prepack=False, provider="cpu")
        self.computed.append(case["name"])
        return self.base.forced_logits(text, _case_images(case), tokens)

    def record(self) -> dict:
        from vlsens.core.fsutil import file_sha256

        return {"path": str(self.path), "sha256": file_sha256(self.path), "stored": self.used,
                "computed": self.computed}

    def close(self) -> None:
        if self.base is not None:
            self.base.close()


def _logits_key(case: dict, text: str, tokens: list[int]) -> str:
    """What an evaluation case's fp32 logits depend on besides the fp32 folder: its chat text, the
    tokens it is teacher-forced on and its image files' bytes (as JSON)."""
    from vlsens.core.fsutil import file_sha256

    return json.dumps({"text": text, "tokens": [int(t) for t in tokens],
                       "images": [file_sha256(f["path"]) for f in case["images"]]})


def write_eval_logits(fp32_folder: str | Path, images, out_npz: str | Path) -> dict:
    """The fp32 folder's logits on the deploy evaluation cases (:func:`eval_cases` of ``images``),
    teacher-forced on its own greedy tokens (its ``eval.json``), written atomically to
    ``out_npz``: what every lower precision's evaluation compares its logits with
    (:func:`_against_fp32`), computed once a run instead of once a folder (at 36 layers the fp32
    folder's pass over the three cases was 130 s of the int4-rtn folder's 222 s evaluation). Each case
    is stored with what its logits depend on (:func:`_logits_key`) and the SHA-256 of the fp32
    folder's ``eval.json`` (which lists every file of the folder): a folder's evaluation takes a
    case's logits only where both match, and runs the fp32 folder otherwise."""
    import tempfile

    from vlsens.core.fsutil import file_sha256, savez

    fp32_folder = Path(fp32_folder)
    fp32_eval = json.loads((fp32_folder / "eval.json").read_text())
    rows = {r["case"]: r for r in fp32_eval["cases"]}
    base = Chat(fp32_folder, prepack=False, provider="cpu")  # as the evaluations run it: memory-mapped
    arrays, index = {}, []
    try:
        with tempfile.TemporaryDirectory(prefix="vlsens-eval-logits-") as work:
            for i, case in enumerate(eval_cases(images, work)):
                row = rows.get(case["name"])
                if row is None or not row.get("text"):
                    raise VlsensError(f"{fp32_folder}/eval.json holds no case {case['name']} with its chat text: "
                                      "rebuild the fp32 folder")
                arrays[f"logits_{i}"] = np.asarray(
                    base.forced_logits(row["text"], _case_images(case), row["tokens"]), np.float32)
                index.append({"case": case["name"], "key": _logits_key(case, row["text"], row["tokens"])})
    finally:
        base.close()
    record = {"fp32_eval_sha256": file_sha256(fp32_folder / "eval.json"), "cases": index}
    savez(out_npz, {"__index__": np.array(json.dumps(record)), **arrays})
    log.info("fp32 logits of %d evaluation case(s) written to %s", len(index), out_npz)
    return record


def _stored_logits(npz: str | Path, fp32_folder: str | Path) -> dict[str, tuple[str, np.ndarray]]:
    """``{case: (key, logits)}`` of a :func:`write_eval_logits` file, empty where it was written
    for another fp32 folder (its ``eval.json`` differs)."""
    from vlsens.core.fsutil import file_sha256, open_npz

    with open_npz(npz) as z:
        record = json.loads(str(z["__index__"][()]))
        if record["fp32_eval_sha256"] != file_sha256(Path(fp32_folder) / "eval.json"):
            log.info("evaluation reference: %s was written for another fp32 folder than %s", npz, fp32_folder)
            return {}
        # stored as float32 (the runtime's logits, exactly), read as the float64 forced_logits returns
        return {c["case"]: (c["key"], z[f"logits_{i}"].astype(np.float64)) for i, c in enumerate(record["cases"])}


def _image_inputs(rt: Chat, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The runtime's own preprocessing of one image: ``(pixel_values, image_grid_thw)``."""
    inputs = rt.inputs("<|vision_start|><|image_pad|><|vision_end|>", [path])
    return (np.asarray(inputs["pixel_values"].as_numpy(), np.float32),
            np.asarray(inputs["image_grid_thw"].as_numpy(), np.int64))


def _digest(pixels: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(pixels).tobytes()).hexdigest()


class _TorchFeatures:
    """transformers' ``get_image_features`` (float32, eager), the vision tower loaded on first use."""

    def __init__(self, checkpoint):
        self.checkpoint, self.model = checkpoint, None

    def __call__(self, pixels: np.ndarray, grid: np.ndarray) -> np.ndarray:
        import torch

        if self.model is None:
            from vlsens.model.loading import load_model

            self.model = load_model(self.checkpoint, attn_implementation="eager", part="vision")
        with torch.no_grad():
            ref = self.model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid), return_dict=True)
        return torch.cat(list(ref.pooler_output), 0).numpy()


def _unique_images(cases: list[dict]) -> list[dict]:
    seen, out = set(), []
    for case in cases:
        for f in case["images"]:
            if f["path"] not in seen:
                seen.add(f["path"])
                out.append(f)
    return out


#: what the vision parity compares with
VISION_REFERENCE = "transformers get_image_features (float32, eager) on onnxruntime-genai's own preprocessing"


def write_vision_features(folder: str | Path, checkpoint: str | Path, images, out_npz: str | Path) -> dict:
    """transformers' image features of every evaluation image (:func:`eval_cases` of ``images``),
    computed once on ``folder``'s own preprocessing (the fp32 folder: every folder of a run shares
    its processor configuration) and written to ``out_npz``: per image its source name, the
    SHA-256 of the pixel values it was computed on, its grid and its features. The deploy jobs'
    vision parity reads them (:func:`vision_parity`) instead of loading and running the tower in
    PyTorch once per folder; an image whose preprocessing differs is recomputed."""
    import tempfile

    from vlsens.core.fsutil import savez

    torch_features = _TorchFeatures(checkpoint)
    rt = Chat(folder, prepack=False, provider="cpu")
    arrays, index = {}, []
    with tempfile.TemporaryDirectory(prefix="vlsens-vision-features-") as work:
        for i, f in enumerate(_unique_images(eval_cases(images, work))):
            pixels, grid = _image_inputs(rt, f["path"])
            arrays[f"features_{i}"] = torch_features(pixels, grid)
            arrays[f"grid_{i}"] = grid
            index.append({"source": f["source"], "pixels_sha256": _digest(pixels)})
    rt.close()
    arrays["sources"] = np.array([e["source"] for e in index])
    arrays["pixels_sha256"] = np.array([e["pixels_sha256"] for e in index])
    savez(out_npz, arrays)
    log.info("vision features of %d image(s) written to %s", len(index), out_npz)
    return {"images": index, "reference": VISION_REFERENCE}


def _stored_features(npz: str | Path) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """``{(source, pixels sha256): (grid, features)}`` of a :func:`write_vision_features` file."""
    from vlsens.core.fsutil import open_npz

    with open_npz(npz) as z:
        return {(str(s), str(h)): (z[f"grid_{i}"], z[f"features_{i}"])
                for i, (s, h) in enumerate(zip(z["sources"], z["pixels_sha256"], strict=True))}


def vision_parity(folder: str | Path, checkpoint: str | Path, cases: list[dict], tolerance: dict | None,
                  runtime: Chat | None = None, features: str | Path | None = None) -> dict:
    """``vision.onnx`` against transformers' ``get_image_features`` on every evaluation image at the
    size the runtime's own preprocessing gives it (ORT-GenAI's processor output fed to both).
    ``runtime``: the folder already loaded; ``features``: transformers' features of these images
    (:func:`write_vision_features`), used where an image's pixel values and grid are the ones they
    were computed on, recomputed otherwise."""
    from vlsens.core.fsutil import file_sha256
    from vlsens.core.metrics import compare
    from vlsens.core.onnxutil import make_session

    stored = _stored_features(features) if features else {}
    torch_features = _TorchFeatures(checkpoint)
    rt = runtime or Chat(folder, provider="cpu")
    sess = make_session(Path(folder) / genai.GRAPHS["vision"], providers=["CPUExecutionProvider"])
    rows = []
    for f in _unique_images(cases):
        pixels, grid = _image_inputs(rt, f["path"])
        got = sess.run(None, {"pixel_values": pixels, "image_grid_thw": grid})[0]
        hit = stored.get((f["source"], _digest(pixels)))
        if hit is not None and not np.array_equal(hit[0], grid):
            hit = None
        if hit is not None:
            ref = hit[1]
        else:
            if features:
                log.info("vision parity: %s not in %s at these pixel values; computed in PyTorch", f["source"],
                         features)
            ref = torch_features(pixels, grid)
        m = compare(got, ref)
        rows.append({"image": f["source"], "grid_thw": grid.tolist(), "stored_reference": hit is not None, **m})
    record = {"graph": genai.GRAPHS["vision"], "reference": VISION_REFERENCE, "images": rows}
    if features:
        record["reference_file"] = {"path": str(features), "sha256": file_sha256(features)}
    if tolerance is None:
        record.update(gated=False, note="measured, not gated: the graph passed its gate on its own weights; what its "
                                         "format costs is in the folder's measure")
    else:
        ok = all(r["cosine"] >= tolerance["min_cosine"] and r["max_rel_error"] <= tolerance["max_rel_error"]
                 for r in rows)
        record.update(tolerance=tolerance, passed=ok)
        if not ok:
            raise VlsensError(f"{folder}/vision.onnx misses parity tolerance {tolerance}: {rows}")
    return record
