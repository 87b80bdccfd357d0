"""The visual question task: questions whose answer is one word or digit, drawn from a seed.

Three modalities, a third of the questions each:

``text``    closed-world text questions: small-number arithmetic, and a fact stated in the prompt
            ("The kite is red and the box is blue. What color is the box?");
``image``   one image of 1-4 coloured shapes on a varied background: colour, shape, count,
            position (leftmost / rightmost / top / bottom shape; left or right of, above or
            below another), largest / smallest;
``images``  two images: which has more shapes, do they share a colour, how many in total, the
            colour or count of one of them.

Question ``i`` of split ``s`` is drawn from its own generator, ``numpy.random.default_rng((seed,
SPLITS[s], i))``, so the ``train``, ``calib`` and ``eval`` splits are disjoint by seed and any
question can be drawn again alone. Pure numpy and PIL: no torch, no transformers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: The generator's version: a change to what a seed draws changes it, so split files written by an
#: older generator are written again (:func:`vlsens.task.files.materialize`).
VERSION = 1
#: Split name -> the middle term of every question's seed.
SPLITS = {"train": 0, "calib": 1, "eval": 2}
MODALITIES = ("text", "image", "images")

COLORS = {"red": (220, 30, 30), "green": (30, 160, 50), "blue": (40, 80, 235), "yellow": (245, 215, 20)}
SHAPES = ("circle", "square", "triangle", "cross")
OBJECTS = ("ball", "box", "cup", "hat", "car", "kite", "bird", "door")
#: Every answer the task can have: each is one token of the trained preset's tokenizer.
ANSWERS = (*COLORS, *SHAPES, *(str(d) for d in range(10)), "left", "right", "above", "below",
           "first", "second", "yes", "no")
#: The image sizes (H, W) questions are drawn at by default: the sizes the default run exports.
DEFAULT_SIZES = ((224, 224), (224, 336))


@dataclass(frozen=True)
class Shape:
    kind: str
    color: str
    x: float  # centre, pixels
    y: float
    r: float  # half the side / radius, pixels

    @property
    def area(self) -> float:
        return float(self.r ** 2)


@dataclass
class Question:
    """One question: its modality and kind, the prompt, its images (RGB uint8 arrays) and answer."""

    modality: str
    kind: str
    prompt: str
    answer: str
    images: list = field(default_factory=list)
    #: the shapes drawn in each image (what follow-up questions on the same images ask about)
    shapes: list = field(default_factory=list, repr=False, compare=False)

    def record(self, image_paths: Sequence[str] = ()) -> dict:
        return {"modality": self.modality, "kind": self.kind, "prompt": self.prompt, "answer": self.answer,
                "images": list(image_paths)}


def rng_for(seed: int, split: str, index: int) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"task split '{split}' is not one of {sorted(SPLITS)}")
    return np.random.default_rng((int(seed), SPLITS[split], int(index)))


def question(seed: int, split: str, index: int, sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
             easy: bool = False, first: bool = False) -> Question:
    """Question ``index`` of ``split``: modality ``MODALITIES[index % 3]``. ``easy``: images of one
    or two shapes and only their colour, shape and count; ``first``: one image of one shape at the
    first size, its colour (the first steps of training: a model from random init learns to read an
    image there before it learns what the other questions ask)."""
    rng = rng_for(seed, split, index)
    if first:
        shapes, img = draw_shapes(rng, tuple(sizes[0]), 1)
        return Question("image", "color", "What color is the shape?", shapes[0].color, [img], [shapes])
    modality = MODALITIES[index % len(MODALITIES)]
    if modality == "text":
        return text_question(rng)
    if modality == "image":
        return image_question(rng, sizes, easy)
    return two_image_question(rng, sizes, easy)


def questions(seed: int, split: str, count: int, sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
              start: int = 0) -> Iterator[Question]:
    for i in range(start, start + count):
        yield question(seed, split, i, sizes)


# -- text ------------------------------------------------------------------------------------------

def text_question(rng: np.random.Generator) -> Question:
    kind = ("plus", "minus", "larger", "fact")[int(rng.integers(4))]
    if kind == "plus":
        a = int(rng.integers(0, 10))
        b = int(rng.integers(0, 10 - a))
        return Question("text", kind, f"What is {a} plus {b}?", str(a + b))
    if kind == "minus":
        a = int(rng.integers(0, 10))
        b = int(rng.integers(0, a + 1))
        return Question("text", kind, f"What is {a} minus {b}?", str(a - b))
    if kind == "larger":
        a, b = (int(v) for v in rng.choice(10, size=2, replace=False))
        word = ("larger", "smaller")[int(rng.integers(2))]
        answer = max(a, b) if word == "larger" else min(a, b)
        return Question("text", kind, f"Which is {word}, {a} or {b}?", str(answer))
    n = int(rng.integers(2, 4))
    objs = [OBJECTS[i] for i in rng.choice(len(OBJECTS), size=n, replace=False)]
    cols = [list(COLORS)[int(rng.integers(len(COLORS)))] for _ in objs]
    facts = ", ".join(f"the {o} is {c}" for o, c in zip(objs, cols))
    k = int(rng.integers(n))
    return Question("text", kind, f"{facts[0].upper()}{facts[1:]}. What color is the {objs[k]}?", cols[k])


# -- images ----------------------------------------------------------------------------------------

def draw_shapes(rng: np.random.Generator, size: tuple[int, int], count: int, colors: Sequence[str] | None = None
                ) -> tuple[list[Shape], np.ndarray]:
    """``count`` non-overlapping shapes of distinct colours on a varied background at ``size``."""
    h, w = size
    colors = list(colors) if colors is not None else [list(COLORS)[i] for i in
                                                      rng.choice(len(COLORS), size=count, replace=False)]
    base = min(h, w)
    for _ in range(200):
        shapes = []
        for c in colors:
            r = float(rng.uniform(0.07, 0.15) * base)
            shapes.append(Shape(SHAPES[int(rng.integers(len(SHAPES)))], c, float(rng.uniform(r + 2, w - r - 2)),
                                float(rng.uniform(r + 2, h - r - 2)), r))
        # apart by more than both shapes' reach (a square's or triangle's corner: r * sqrt(2))
        if all(np.hypot(a.x - b.x, a.y - b.y) > 1.42 * (a.r + b.r) + 4
               for i, a in enumerate(shapes) for b in shapes[i + 1:]):
            return shapes, render(rng, size, shapes)
    raise RuntimeError(f"no layout of {count} shapes fits {h}x{w}")


def background(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """A desaturated background: flat, a gradient or a texture, with noise."""
    h, w = size
    gray = float(rng.uniform(50, 190))
    tint = rng.uniform(-20, 20, size=3)
    img = np.full((h, w, 3), gray, np.float32) + tint
    style = int(rng.integers(3))
    if style == 1:
        ramp = np.linspace(-1, 1, w if rng.integers(2) else h, dtype=np.float32)
        ramp = ramp[None, :, None] if ramp.shape[0] == w else ramp[:, None, None]
        img = img + 35 * ramp
    elif style == 2:
        cells = rng.uniform(-25, 25, size=(h // 28 + 1, w // 28 + 1, 1)).astype(np.float32)
        img = img + np.kron(cells, np.ones((28, 28, 1), np.float32))[:h, :w]
    img = img + rng.normal(0, 6, size=img.shape)
    return img


def render(rng: np.random.Generator, size: tuple[int, int], shapes: Sequence[Shape]) -> np.ndarray:
    from PIL import Image, ImageDraw

    img = Image.fromarray(np.clip(background(rng, size), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for s in shapes:
        fill = COLORS[s.color]
        x, y, r = s.x, s.y, s.r
        if s.kind == "circle":
            draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif s.kind == "square":
            draw.rectangle((x - r, y - r, x + r, y + r), fill=fill)
        elif s.kind == "triangle":
            draw.polygon(((x, y - r), (x - r, y + r), (x + r, y + r)), fill=fill)
        else:
            t = r / 3
            draw.rectangle((x - r, y - t, x + r, y + t), fill=fill)
            draw.rectangle((x - t, y - r, x + t, y + r), fill=fill)
    return np.asarray(img)


def _size(rng: np.random.Generator, sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    h, w = sizes[int(rng.integers(len(sizes)))]
    return (h, w) if rng.integers(2) else (w, h)


_IMAGE_KINDS = ("count", "color", "shape", "extreme", "relation", "size")


def image_question(rng: np.random.Generator, sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
                   easy: bool = False) -> Question:
    kinds = _IMAGE_KINDS[:3] if easy else _IMAGE_KINDS
    kind = kinds[int(rng.integers(len(kinds)))]
    most = 3 if easy else 5
    count = int(rng.integers(1, most)) if kind in ("count", "color", "shape") else int(rng.integers(2, most))
    for _ in range(100):
        shapes, img = draw_shapes(rng, _size(rng, sizes), count)
        asked = _ask_image(rng, kind, shapes)
        if asked is not None:
            return Question("image", kind, asked[0], asked[1], [img], [shapes])
    raise RuntimeError(f"no unambiguous '{kind}' question drawn")


def _ask_image(rng: np.random.Generator, kind: str, shapes: list[Shape]) -> tuple[str, str] | None:
    """(prompt, answer) of a ``kind`` question on ``shapes``, or None when it would be ambiguous."""
    if kind == "count":
        return "How many shapes are there?", str(len(shapes))
    if len(shapes) < 2 and kind in ("extreme", "relation", "size"):
        return None
    if kind == "color":
        s = shapes[int(rng.integers(len(shapes)))]
        if len(shapes) == 1:
            return "What color is the shape?", s.color
        if sum(t.kind == s.kind for t in shapes) > 1:
            return None
        return f"What color is the {s.kind}?", s.color
    if kind == "shape":
        s = shapes[int(rng.integers(len(shapes)))]
        return (("What shape is it?" if len(shapes) == 1 else f"What shape is the {s.color} one?"), s.kind)
    if kind == "extreme":
        return _ask_extreme(rng, shapes)
    if kind == "relation":
        return _ask_relation(rng, shapes)
    word = ("largest", "smallest")[int(rng.integers(2))]
    order = sorted(shapes, key=lambda s: s.area, reverse=word == "largest")
    if order[0].area < 1.5 * order[1].area and order[1].area < 1.5 * order[0].area:
        return None
    return f"What color is the {word} shape?", order[0].color


def _ask_extreme(rng: np.random.Generator, shapes: list[Shape]) -> tuple[str, str] | None:
    side = ("left", "right", "top", "bottom")[int(rng.integers(4))]
    key = {"left": lambda s: s.x, "right": lambda s: -s.x, "top": lambda s: s.y, "bottom": lambda s: -s.y}[side]
    order = sorted(shapes, key=key)
    if abs(key(order[1]) - key(order[0])) < 20:
        return None
    where = {"left": "furthest to the left", "right": "furthest to the right", "top": "at the top",
             "bottom": "at the bottom"}[side]
    return f"What color is the shape {where}?", order[0].color


def _ask_relation(rng: np.random.Generator, shapes: list[Shape]) -> tuple[str, str] | None:
    a, b = (shapes[i] for i in rng.choice(len(shapes), size=2, replace=False))
    if rng.integers(2):
        if abs(a.x - b.x) < 20:
            return None
        return f"Is the {a.color} shape left or right of the {b.color} shape?", ("left" if a.x < b.x else "right")
    if abs(a.y - b.y) < 20:
        return None
    return f"Is the {a.color} shape above or below the {b.color} shape?", ("above" if a.y < b.y else "below")


_PAIR_KINDS = ("more", "share", "total", "which")


def two_image_question(rng: np.random.Generator, sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
                       easy: bool = False) -> Question:
    kind = _PAIR_KINDS[int(rng.integers(len(_PAIR_KINDS)))]
    most = 3 if easy else 5
    n1, n2 = (int(v) for v in rng.integers(1, most, size=2))
    while kind == "more" and n1 == n2:
        n2 = int(rng.integers(1, most))
    (s1, i1), (s2, i2) = (draw_shapes(rng, _size(rng, sizes), n) for n in (n1, n2))
    prompt, answer = _ask_pair(rng, kind, s1, s2)
    return Question("images", kind, prompt, answer, [i1, i2], [s1, s2])


def _ask_pair(rng: np.random.Generator, kind: str, s1: list[Shape], s2: list[Shape]) -> tuple[str, str] | None:
    n1, n2 = len(s1), len(s2)
    if kind == "more":
        return None if n1 == n2 else ("Which image has more shapes?", ("first" if n1 > n2 else "second"))
    if kind == "share":
        shared = {s.color for s in s1} & {s.color for s in s2}
        return "Do the two images share a color?", ("yes" if shared else "no")
    if kind == "total":
        return "How many shapes are there in the two images together?", str(n1 + n2)
    which = int(rng.integers(2))
    return f"How many shapes are in the {('first', 'second')[which]} image?", str((n1, n2)[which])


def follow_ups(rng: np.random.Generator, q: Question, count: int) -> list[Question]:
    """Up to ``count`` more questions on ``q``'s images (a text question: other text questions),
    for a multi-turn training chat: one image encoding, several answers learnt from it."""
    out = []
    for _ in range(4 * count):
        if len(out) == count:
            break
        if q.modality == "text":
            out.append(text_question(rng))
            continue
        kinds = _IMAGE_KINDS if q.modality == "image" else _PAIR_KINDS
        kind = kinds[int(rng.integers(len(kinds)))]
        asked = _ask_image(rng, kind, q.shapes[0]) if q.modality == "image" else _ask_pair(rng, kind, *q.shapes)
        if asked is not None and all(asked[0] != p.prompt for p in [q, *out]):
            out.append(Question(q.modality, kind, asked[0], asked[1]))
    return out


# -- files -----------------------------------------------------------------------------------------

def write_split(out_dir: str | Path, seed: int, split: str, count: int,
                sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES) -> Path:
    """Write ``count`` questions of ``split`` as PNG files and ``questions.jsonl`` (one record a
    question: modality, kind, prompt, answer, image file names relative to ``out_dir``)."""
    from PIL import Image

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, q in enumerate(questions(seed, split, count, sizes)):
        names = []
        for j, img in enumerate(q.images):
            name = f"{split}-{i:04d}-{j}.png"
            Image.fromarray(img).save(out / name, optimize=False, compress_level=1)
            names.append(name)
        lines.append(json.dumps(q.record(names), sort_keys=True))
    (out / "questions.jsonl").write_text("\n".join(lines) + "\n")
    return out / "questions.jsonl"


def read_split(path: str | Path) -> list[dict]:
    """The records of a ``questions.jsonl``, image names resolved against its folder."""
    path = Path(path)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in records:
        r["images"] = [str(path.parent / n) for n in r["images"]]
    return records
