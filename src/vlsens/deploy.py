"""Deploy folders: what ships. ``results/<model>/deploy/<precision>/`` is an onnxruntime-genai
(ORT-GenAI) model folder for ``type: qwen2_5_vl`` (see :mod:`vlsens.genai` for its three graphs):

==============  =====================================  ===========================================
precision       text decoder + embedding               vision
==============  =====================================  ===========================================
``fp32``        ``decoder/fp32``                       ``vision/dynamic/fp32``
``fp16``        ``decoder/fp16``                       ``vision/dynamic/fp16``
``int8-mixed``  ``profile/decoder/fp32`` (+ the fp32   ``profile/vision/dynamic/fp32``
                embedding)
==============  =====================================  ===========================================

Every graph comes from a gated variant folder (or a built profile), so each already passed its
parity gate against transformers. The folder itself is then proven end to end by the runtime we
did not write:

* ``parity.json``: ``vision.onnx`` (the graph behind the index preamble) against transformers'
  ``get_image_features`` on the evaluation images, at the sizes the runtime's own preprocessing
  picks, gated (``parity.tolerance`` of fp32 / fp16, ``deploy.int8_tolerance`` for int8-mixed);
* ``eval.json``: ORT-GenAI generates ``max_new_tokens`` greedy tokens for a text-only prompt, one
  image, and two images of different sizes. The fp32 folder must generate exactly what
  transformers' ``generate`` does (else the job fails and nothing is published). The fp16 and
  INT8 folders are compared with the fp32 folder through ORT-GenAI, teacher-forced on the fp32
  tokens: KL(fp32 || folder) per step and top-1 agreement; the INT8 folder's mean KL is compared
  with the text profile's target.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np

from vlsens import genai, paths
from vlsens.errors import ConfigError, VlsensError
from vlsens.runtime import Chat

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8-mixed")
DEPLOY = paths.DEPLOY
#: The file that says a deploy folder is complete (written last).
DONE = "eval.json"


#: The graphs a deploy folder is made of: the decoder tower's and the dynamic vision graph.
DECODER_GRAPH, VISION_GRAPH = "decoder", "vision/dynamic"


def sources(precision: str) -> dict[str, str]:
    """Path patterns (``{model}`` left) of the graphs a deploy folder is made of."""
    dec = paths.fill(paths.VARIANT, graph=DECODER_GRAPH, variant="fp16" if precision == "fp16" else "fp32")
    vis = paths.fill(paths.VARIANT, graph=VISION_GRAPH, variant="fp16" if precision == "fp16" else "fp32")
    # The embedding graph is a secondary file of the decoder's variant folder: that folder's
    # model.onnx and record stand for it as inputs (the job verifies it against the record).
    out = {"decoder_folder": f"{dec}/{paths.MAIN}", "decoder_record": f"{dec}/{paths.RECORD}",
           "vision_record": f"{vis}/{paths.RECORD}"}
    if precision == "int8-mixed":
        out["decoder"] = paths.fill(paths.PROFILE, graph=DECODER_GRAPH, variant="fp32") + "/model.onnx"
        out["vision"] = paths.fill(paths.PROFILE, graph=VISION_GRAPH, variant="fp32") + "/model.onnx"
    else:
        out["decoder"] = f"{dec}/model.onnx"
        out["vision"] = f"{vis}/model.onnx"
    return out


def check_config(config: dict) -> None:
    """The graphs each requested precision needs are configured (else a ConfigError naming the key)."""
    d = config["deploy"]
    if not d["enabled"]:
        return
    dyn = config["vision"]["dynamic"]
    if not dyn["enabled"]:
        raise ConfigError("deploy.enabled: the deploy folders take the dynamic vision graph; set "
                          "vision.dynamic.enabled: true or deploy.enabled: false")
    for p in d["precisions"]:
        need = {"fp32": [("vision.dynamic.variants", dyn["variants"], "fp32"),
                         ("deploy.decoder.variants", d["decoder"]["variants"], "fp32")],
                "fp16": [("vision.dynamic.variants", dyn["variants"], "fp16"),
                         ("deploy.decoder.variants", d["decoder"]["variants"], "fp16")],
                "int8-mixed": [("vision.dynamic.sensitivity_variants", dyn["sensitivity_variants"], "fp32"),
                               ("deploy.decoder.sensitivity_variants", d["decoder"]["sensitivity_variants"], "fp32")]}
        for key, have, want in need[p]:
            if want not in have:
                raise ConfigError(f"deploy.precisions has '{p}', which needs '{want}' in {key} (it has {list(have)}); "
                                  f"add it or drop '{p}' from deploy.precisions")
    if "fp32" not in d["precisions"] and len(d["precisions"]):
        raise ConfigError("deploy.precisions: the fp16 and int8-mixed folders are evaluated against the fp32 "
                          "folder; keep 'fp32' in the list")


def check_runtime(config: dict) -> None:
    """onnxruntime-genai is importable where the deploy folders are built (not checked for conda
    deployments: envs/torch.yaml installs it)."""
    from importlib.util import find_spec

    if config["deploy"]["enabled"] and find_spec("onnxruntime_genai") is None:
        raise ConfigError("deploy.enabled: true needs onnxruntime-genai in this environment: pip install -e "
                          "'.[genai]' (`make run` installs it), or set deploy.enabled: false")


# ----------------------------------------------------------------------------------------------
# The folder


def assemble(out_dir: str | Path, checkpoint: str | Path, decoder: str | Path, embedding: str | Path,
             vision: str | Path, workdir: str | Path) -> dict[str, Path]:
    """Write the folder's graphs, configs and tokenizer into ``out_dir`` (a staging folder)."""
    from transformers import AutoConfig

    from vlsens.artifacts import verify
    from vlsens.fsutil import write_json
    from vlsens.onnxutil import copy_model

    out_dir, checkpoint = Path(out_dir), Path(checkpoint)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((checkpoint / "config.json").read_text())
    gen_path = checkpoint / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    pre = json.loads((checkpoint / "preprocessor_config.json").read_text())
    vc = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False).vision_config
    files = {
        "decoder": copy_model(verify(decoder), out_dir / genai.GRAPHS["decoder"]),
        "embedding": copy_model(verify(embedding), out_dir / genai.GRAPHS["embedding"]),
        "vision": genai.wrap_vision(verify(vision), out_dir / genai.GRAPHS["vision"], vc, workdir),
    }
    write_json(out_dir / "genai_config.json", genai.genai_config(cfg, gen))
    write_json(out_dir / "processor_config.json", genai.processor_config(pre))
    for name in genai.TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, out_dir / name)
    return files


# ----------------------------------------------------------------------------------------------
# Evaluation cases


def eval_cases(images, workdir: str | Path) -> list[dict]:
    """Text only, one image, two images of different sizes (the first two parity images, as PNG
    files both runtimes read; with one parity image, or two of one size, the second is shown at
    two thirds of its width)."""
    from vlsens.images import open_rgb
    from vlsens.prompts import BUILTIN_PROMPTS

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
        im.save(f)
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

    from vlsens.loading import load_model
    from vlsens.processor import load_processor

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


def evaluate(folder: str | Path, precision: str, checkpoint: str | Path, cases: list[dict], max_new_tokens: int,
             fp32_folder: str | Path | None, fp32_eval: dict | None, target: dict | None,
             runtime: Chat | None = None) -> dict:
    """``eval.json`` of a folder (see the module docs); raises VlsensError when the fp32 folder's
    tokens differ from transformers'. ``runtime``: the folder already loaded."""
    from vlsens.processor import load_processor

    processor = load_processor(checkpoint)
    folder_rt = runtime or Chat(folder)
    rows = []
    timing = {"seconds": 0.0, "tokens": 0}

    def generate(text: str, case: dict) -> list[int]:
        t0 = time.perf_counter()
        got = folder_rt.generate(text, _case_images(case), max_new_tokens)
        timing["seconds"] += time.perf_counter() - t0
        timing["tokens"] += len(got)
        return got

    def speed() -> dict:
        return {"tokens_per_second": timing["tokens"] / timing["seconds"] if timing["seconds"] else None,
                "speed_note": "tokens generated / seconds of onnxruntime-genai generate over the evaluation "
                              "cases (image encoding, prefill and greedy decode; the first call included)"}

    if precision == "fp32":
        expected = transformers_generate(checkpoint, cases, max_new_tokens)
        for case, ref in zip(cases, expected):
            got = generate(chat_text(processor, case), case)
            rows.append({"case": case["name"], "images": case["images"], "tokens": got, "transformers": ref,
                         "identical": got == ref})
        bad = [r["case"] for r in rows if not r["identical"]]
        record = {"precision": precision, "max_new_tokens": max_new_tokens, "reference": "transformers generate "
                  "(greedy, float32, eager)", "cases": rows, "identical": not bad, **speed()}
        if bad:
            raise VlsensError(f"{folder}: onnxruntime-genai's greedy tokens differ from transformers' for "
                              f"{bad}: {json.dumps(rows)[:2000]}")
        return record
    from vlsens.artifacts import verify

    for g in genai.GRAPHS.values():  # the fp32 folder is another job's output: check it first
        verify(Path(fp32_folder) / g)
    base = Chat(fp32_folder)
    ref_rows = {r["case"]: r for r in fp32_eval["cases"]}
    kls, agree = [], []
    for case in cases:
        text = chat_text(processor, case)
        ref_tokens = ref_rows[case["name"]]["tokens"]
        got = generate(text, case)
        p = base.forced_logits(text, _case_images(case), ref_tokens)
        q = folder_rt.forced_logits(text, _case_images(case), ref_tokens)
        kl = _kl(p, q)
        top1 = q.argmax(-1) == np.asarray(ref_tokens)
        kls.append(kl)
        agree.append(top1)
        rows.append({"case": case["name"], "images": case["images"], "tokens": got, "fp32_tokens": ref_tokens,
                     "identical_to_fp32": got == ref_tokens, "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                     "top1_agreement": float(top1.mean())})
    mean_kl = float(np.concatenate(kls).mean())
    agreement = float(np.concatenate(agree).mean())
    record = {"precision": precision, "max_new_tokens": max_new_tokens,
              "reference": "the fp32 folder through onnxruntime-genai, teacher-forced on its greedy tokens",
              "cases": rows, "mean_kl": mean_kl, "top1_agreement": agreement, **speed()}
    if target is not None:
        metric, value = target["metric"], float(target["target"])
        measured = {"kl": mean_kl, "top1": agreement}.get(metric)
        met = None if measured is None else (measured <= value if metric == "kl" else measured >= value)
        record["target"] = {"metric": metric, "target": value, "measured": measured, "met": met,
                            "note": "the text profile's target, measured end to end through onnxruntime-genai "
                                    "(vision INT8 included) on the generated steps"}
    return record


def vision_parity(folder: str | Path, checkpoint: str | Path, cases: list[dict], tolerance: dict | None,
                  runtime: Chat | None = None) -> dict:
    """``vision.onnx`` against transformers' ``get_image_features`` on every evaluation image at the
    size the runtime's own preprocessing gives it (ORT-GenAI's processor output fed to both).
    ``runtime``: the folder already loaded."""
    import onnxruntime as ort
    import torch

    from vlsens.loading import load_model
    from vlsens.metrics import compare

    model = load_model(checkpoint, attn_implementation="eager", part="vision")
    rt = runtime or Chat(folder)
    sess = ort.InferenceSession(str(Path(folder) / genai.GRAPHS["vision"]), providers=["CPUExecutionProvider"])
    seen, rows = set(), []
    for case in cases:
        for f in case["images"]:
            if f["path"] in seen:
                continue
            seen.add(f["path"])
            inputs = rt.inputs("<|vision_start|><|image_pad|><|vision_end|>", [f["path"]])
            pixels = np.asarray(inputs["pixel_values"].as_numpy(), np.float32)
            grid = np.asarray(inputs["image_grid_thw"].as_numpy(), np.int64)
            got = sess.run(None, {"pixel_values": pixels, "image_grid_thw": grid})[0]
            with torch.no_grad():
                ref = model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid), return_dict=True)
                ref = torch.cat(list(ref.pooler_output), 0).numpy()
            m = compare(got, ref)
            rows.append({"image": f["source"], "grid_thw": grid.tolist(), **m})
    record = {"graph": genai.GRAPHS["vision"], "reference": "transformers get_image_features (float32, eager) on "
              "onnxruntime-genai's own preprocessing", "images": rows}
    if tolerance is not None:
        ok = all(r["cosine"] >= tolerance["min_cosine"] and r["max_rel_error"] <= tolerance["max_rel_error"]
                 for r in rows)
        record.update(tolerance=tolerance, passed=ok)
        if not ok:
            raise VlsensError(f"{folder}/vision.onnx misses parity tolerance {tolerance}: {rows}")
    return record


def build_folder(precision: str, out_dir: str | Path, checkpoint: str | Path, decoder: str | Path,
                 embedding: str | Path, vision: str | Path, images, max_new_tokens: int, tolerance: dict | None,
                 fp32_folder: str | Path | None = None, target: dict | None = None) -> dict:
    """Assemble, gate and evaluate one deploy folder; publish it only when every check passed."""
    import tempfile

    from vlsens.artifacts import file_entries
    from vlsens.fsutil import atomic_dir, write_json

    out_dir = Path(out_dir)
    fp32_eval = json.loads((Path(fp32_folder) / DONE).read_text()) if fp32_folder else None
    with atomic_dir(out_dir) as tmp, tempfile.TemporaryDirectory(prefix="vlsens-deploy-") as work:
        files = assemble(tmp, checkpoint, decoder, embedding, vision, Path(work) / "preamble")
        cases = eval_cases(images, Path(work) / "images")
        runtime = Chat(tmp)  # loaded once for both checks
        parity = vision_parity(tmp, checkpoint, cases, tolerance, runtime)
        parity["files"] = file_entries(files.values())
        parity["sources"] = {"decoder": str(decoder), "embedding": str(embedding), "vision": str(vision)}
        write_json(tmp / paths.RECORD, parity)
        record = evaluate(tmp, precision, checkpoint, cases, max_new_tokens, fp32_folder, fp32_eval, target, runtime)
        del runtime
        for c in record["cases"]:  # the images lived in a temporary folder: keep their names
            c["images"] = [{"source": f["source"], "size": f["size"]} for f in c["images"]]
        write_json(tmp / DONE, record)
    return record
