"""Stratified evaluation cases for comparing deploy folders: many cases per modality (text only,
one image, two images), so a folder's error is a distribution per modality, not three numbers.

The three cases of :func:`vlsens.deploy.genai.evaluate.eval_cases` prove a folder runs; they cannot
rank two folders (on the tiny random model one case's KL differs 50x from another's). Here every
modality gets ``per_modality`` cases: prompts cycled through the built-in prompts in a seeded
order, photos cycled through the given images, and each image resized exactly to one of a few
sizes (multiples of the merged patch, 28 pixels), so photos, sizes and aspect ratios vary. The
images are written once per (photo, size) as PNG files (pixels only) that every runtime reads, and
the cases as ``cases.json`` beside them (written last: its presence means the images are there).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from vlsens.core.errors import VlsensError

MODALITIES = ("text", "image", "images")
CASES_FILE = "cases.json"
SIZES = ((224, 224), (168, 280), (280, 168), (112, 336))


def _check(images, per_modality: int, sizes, multiple: int) -> list[tuple[int, int]]:
    if per_modality < 2:
        raise VlsensError(f"per_modality={per_modality}: a spread per modality needs at least two cases")
    if not images:
        raise VlsensError("stratified evaluation cases need at least one image")
    sizes = [tuple(int(v) for v in s) for s in sizes]
    for h, w in sizes:
        if h <= 0 or w <= 0 or h % multiple or w % multiple:
            raise VlsensError(f"evaluation image size {h}x{w} (H x W) is not a positive multiple of {multiple} "
                              "pixels on each side")
    if len(sizes) < 2 or len(set(sizes)) != len(sizes):
        raise VlsensError(f"evaluation image sizes {sizes}: the two-image cases need at least two distinct sizes")
    return sizes


def _prompts(per_modality: int, seed: int) -> dict[str, list[str]]:
    """Per modality ``per_modality`` prompts: the built-in prompts in a seeded order, cycled (so
    consecutive cases of a modality differ where there are two prompts or more)."""
    from vlsens.data.prompts import BUILTIN_PROMPTS

    rng = random.Random(seed)
    out = {}
    for m in MODALITIES:
        order = list(BUILTIN_PROMPTS)
        rng.shuffle(order)
        out[m] = [order[k % len(order)] for k in range(per_modality)]
    return out


def _layout(n_photos: int, n_sizes: int, per_modality: int) -> dict[str, list[list[tuple[int, int]]]]:
    """(photo index, size index) of every image of every case, per modality. One-image case k:
    photo k mod n, size (k + k // n) mod S (every photo meets every size before a pair repeats).
    Two-image case k: photos k and k + 1 (mod n: two different ones where n >= 2), sizes
    (k + k // n) mod S and a different one, offset by 1 .. S-1 as k goes round."""
    one = [[(k % n_photos, (k + k // n_photos) % n_sizes)] for k in range(per_modality)]
    two = []
    for k in range(per_modality):
        s1 = (k + k // n_photos) % n_sizes
        s2 = (s1 + 1 + (k // n_sizes) % (n_sizes - 1)) % n_sizes
        two.append([(k % n_photos, s1), ((k + 1) % n_photos, s2)])
    return {"text": [[] for _ in range(per_modality)], "image": one, "images": two}


def _file_name(index: int, source: str, size: tuple[int, int]) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(source).stem) or "image"
    return f"{index:02d}-{stem}-{size[0]}x{size[1]}.png"


def _write_png(im, path: Path) -> None:
    from vlsens.core.fsutil import atomic_file

    with atomic_file(path, suffix=".png") as tmp:
        # pixels only: an ICC profile would be copied from the source (scikit-image's photos carry
        # one libpng warns about on every read); no runtime applies it
        im.save(tmp, format="PNG", icc_profile=None)


def folder_cases(images, out_dir: str | Path, per_modality: int = 8, sizes=SIZES, seed: int = 0,
                 multiple: int = 28) -> list[dict]:
    """Write ``per_modality`` cases per modality into ``out_dir`` (see the module docs) and return
    them as :func:`load_cases` reads them back (each image entry with its absolute ``path``).
    ``images``: image refs (``open_rgb`` opens them; ``.name`` is the name they are reported
    under); ``sizes``: (H, W) pairs, each side a multiple of ``multiple``."""
    from PIL import Image

    from vlsens.core.fsutil import write_json
    from vlsens.data.images import open_rgb

    sizes = _check(images, per_modality, sizes, multiple)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts, layout = _prompts(per_modality, seed), _layout(len(images), len(sizes), per_modality)
    opened, written, cases = {}, {}, []
    for m in MODALITIES:
        for k, pics in enumerate(layout[m]):
            entries = []
            for p, s in pics:
                if (p, s) not in written:
                    if p not in opened:
                        opened[p] = open_rgb(images[p])
                    h, w = sizes[s]
                    name = _file_name(p, images[p].name, (h, w))
                    _write_png(opened[p].resize((w, h), resample=Image.Resampling.BICUBIC), out_dir / name)
                    written[(p, s)] = name
                entries.append({"file": written[(p, s)], "source": images[p].name, "size": list(sizes[s])})
            cases.append({"name": f"{m}-{k + 1:02d}", "modality": m, "prompt": prompts[m][k], "images": entries})
    write_json(out_dir / CASES_FILE, {"per_modality": per_modality, "seed": seed,
                                      "sizes": [list(s) for s in sizes], "cases": cases})
    return load_cases(out_dir)


def load_cases(out_dir: str | Path) -> list[dict]:
    """The cases of ``out_dir/cases.json``, each image entry with its absolute ``path`` added (what
    :class:`vlsens.deploy.genai.runtime.Chat` opens)."""
    out_dir = Path(out_dir).resolve()
    f = out_dir / CASES_FILE
    if not f.is_file():
        raise VlsensError(f"{f}: no evaluation cases here (vlsens.deploy.cases.folder_cases writes them)")
    cases = json.loads(f.read_text())["cases"]
    for case in cases:
        for entry in case["images"]:
            entry["path"] = str(out_dir / entry["file"])
    return cases


def pricing_cases(cases: list[dict], count: int | str) -> list[str]:
    """The names of ``count`` of ``cases`` (``all``: every one), stratified: each modality present
    gets ``count`` / the modalities' number of them (the first modalities one more where it does not
    divide), evenly spaced through its cases, so photos, sizes and prompts still vary. The subset
    ``bench/bench_decoder_estimate.py --price-cases`` prices the decoder's MatMuls on."""
    if count == "all":
        return [c["name"] for c in cases]
    groups = {m: [c["name"] for c in cases if c["modality"] == m] for m in MODALITIES}
    groups = {m: names for m, names in groups.items() if names}
    if not isinstance(count, int) or isinstance(count, bool) or not len(groups) <= count <= len(cases):
        raise VlsensError(f"cases to price on: {count!r}; valid: 'all', or an integer from {len(groups)} (one case per "
                          f"modality: {sorted(groups)}) to {len(cases)} (the measure's cases)")
    base, extra = divmod(count, len(groups))
    chosen = set()
    for i, names in enumerate(groups.values()):
        k = min(len(names), base + (i < extra))
        chosen |= {names[j * len(names) // k] for j in range(k)}
    return [c["name"] for c in cases if c["name"] in chosen]


def task_cases(questions: str | Path, out_dir: str | Path, per_modality: int = 8) -> list[dict]:
    """The measure's cases from the task's evaluation questions (a ``questions.jsonl``): the first
    ``per_modality`` of each modality, each image copied beside ``cases.json`` at its own size, the
    question's answer kept (``answer``). Written as :func:`folder_cases` writes its cases."""
    from PIL import Image

    from vlsens.core.fsutil import copy_file, write_json
    from vlsens.task.questions import read_split

    if per_modality < 2:
        raise VlsensError(f"per_modality={per_modality}: a spread per modality needs at least two cases")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = read_split(questions)
    cases, sizes = [], []
    for m in MODALITIES:
        chosen = [r for r in records if r["modality"] == m][:per_modality]
        if len(chosen) < per_modality:
            raise VlsensError(f"{questions}: {len(chosen)} {m} questions, the measure takes {per_modality}")
        for k, r in enumerate(chosen):
            entries = []
            for path in r["images"]:
                with Image.open(path) as im:
                    size = [im.height, im.width]
                copy_file(path, out_dir / Path(path).name)
                entries.append({"file": Path(path).name, "source": Path(path).name, "size": size})
                sizes += [size] if size not in sizes else []
            cases.append({"name": f"{m}-{k + 1:02d}", "modality": m, "prompt": r["prompt"], "images": entries,
                          "answer": r["answer"], "kind": r["kind"]})
    write_json(out_dir / CASES_FILE, {"per_modality": per_modality, "seed": 0, "sizes": sizes,
                                      "questions": str(questions), "cases": cases})
    return load_cases(out_dir)
