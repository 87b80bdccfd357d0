"""Image sources: the built-in photos shipped in scikit-image's wheel, or the user's files.

A source spec is ``builtin``, a directory, a glob pattern, a ``.txt`` file listing one path per
line (relative paths are relative to that file), or a list of any of these paths.
"""

from __future__ import annotations

import glob as _glob
import importlib.resources
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vlsens.core.errors import ImageError

log = logging.getLogger(__name__)

#: Colour photos in scikit-image's wheel, in a fixed order (the first ones feed parity checks).
BUILTIN_IMAGES = (
    "astronaut.png",
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "ihc.png",
    "motorcycle_right.png",
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif")


@dataclass(frozen=True)
class ImageRef:
    """One image file and the name it is reported under."""

    path: Path
    name: str

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    def sha256(self) -> str:
        from vlsens.core.fsutil import file_sha256

        return file_sha256(self.path)


def builtin_dir() -> Path:
    return Path(str(importlib.resources.files("skimage") / "data"))


def resolve_images(spec: str | list[str] | tuple[str, ...], key: str = "images") -> list[ImageRef]:
    """Turn a source spec into a sorted, de-duplicated list of image files.

    Raises :class:`ImageError` naming ``key`` when the spec matches nothing.
    """
    if isinstance(spec, (list, tuple)):
        refs: list[ImageRef] = []
        for item in spec:
            refs.extend(resolve_images(item, key))
        return _dedup(refs)
    if spec == "builtin":
        d = builtin_dir()
        refs = [ImageRef(d / n, n) for n in BUILTIN_IMAGES if (d / n).is_file()]
        if not refs:
            raise ImageError(f"{key}: no built-in images found under {d}; is scikit-image installed?")
        return refs
    p = Path(spec)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ImageError(f"{key}: directory '{spec}' holds no images ({', '.join(IMAGE_SUFFIXES)}).")
        return [ImageRef(f, f.name) for f in files]
    if p.is_file() and p.suffix.lower() == ".txt":
        refs = []
        for n, line in enumerate(p.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            f = Path(line) if Path(line).is_absolute() else p.parent / line
            if not f.is_file():
                raise ImageError(f"{key}: '{spec}' line {n} names '{line}', which does not exist.")
            refs.append(ImageRef(f, f.name))
        if not refs:
            raise ImageError(f"{key}: list file '{spec}' names no images.")
        return refs
    if p.is_file():
        return [ImageRef(p, p.name)]
    matches = sorted(Path(m) for m in _glob.glob(str(spec), recursive=True))
    matches = [m for m in matches if m.is_file()]
    if matches:
        return [ImageRef(m, m.name) for m in matches]
    raise ImageError(
        f"{key}: '{spec}' is not 'builtin', an existing directory, a .txt list file, an image file "
        "or a glob pattern that matches files."
    )


def _dedup(refs: Iterable[ImageRef]) -> list[ImageRef]:
    seen, out = set(), []
    for r in refs:
        k = r.path.resolve()
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def header(ref: ImageRef) -> dict:
    """Width and height as the image will be used (after its EXIF orientation) and its mode,
    read from the file's header without decoding the pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(ref.path) as im:
            w, h = im.size
            orientation = int(im.getexif().get(0x0112, 1) or 1)
            mode = im.mode
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"image '{ref.path}' cannot be read: {e}") from e
    if orientation in (5, 6, 7, 8):  # rotated by 90 degrees
        w, h = h, w
    return {"width": w, "height": h, "mode": mode, "exif_orientation": orientation}


def image_problems(entries: list[dict], min_side: int, max_aspect_ratio: float) -> list[str]:
    """What is wrong with images (entries with path, width, height), one line each."""
    out = []
    for e in entries:
        if "error" in e:
            continue  # unreadable: see vlsens.config.check_images
        w, h = int(e["width"]), int(e["height"])
        if min(w, h) < min_side:
            out.append(f"'{e['path']}' is {w}x{h} pixels, smaller than {min_side} pixels on a side "
                       "(one merged patch): it would be upsampled from almost nothing")
        elif max(w, h) / min(w, h) > max_aspect_ratio:
            out.append(f"'{e['path']}' is {w}x{h} pixels, aspect ratio {max(w, h) / min(w, h):.0f}:1 > "
                       f"{max_aspect_ratio:g}:1: resized to a fixed size it is squashed beyond recognition")
    return out


#: 16-bit and 32-bit integer modes, scaled to 8 bits by their full range (PIL's convert clips).
_WIDE_INT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def to_rgb(im):
    """A PIL image in any mode as 8-bit RGB.

    16-bit grayscale (``I;16*``; ``I`` with values above 255) is scaled from 0..65535, float
    (``F``) from 0..1 when its values lie there (else taken as 0..255); PIL's own ``convert`` clips
    them, which turns most 16-bit images white. Transparency is composited on white.
    """
    import numpy as np
    from PIL import Image

    if im.mode in _WIDE_INT_MODES or im.mode == "F":
        a = np.asarray(im, dtype=np.float64)
        if im.mode == "F":
            top = 1.0 if a.size and float(np.nanmax(a)) <= 1.0 else 255.0
        else:
            top = 65535.0 if im.mode != "I" or (a.size and a.max() > 255) else 255.0
        im = Image.fromarray(np.clip(np.nan_to_num(a) / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if im.mode in ("RGBA", "LA", "P", "PA", "La", "RGBa") or "transparency" in im.info:
        im = im.convert("RGBA")
        background = Image.new("RGBA", im.size, (255, 255, 255, 255))
        im = Image.alpha_composite(background, im)
    return im.convert("RGB")


def open_rgb(ref: ImageRef):
    """Open an image as an 8-bit RGB PIL image, upright (EXIF orientation applied, as
    transformers' ``load_image`` does); see :func:`to_rgb` for the modes.

    Raises :class:`ImageError` naming the file when it is unreadable or corrupt.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(ref.path) as im:
            im.load()
            return to_rgb(ImageOps.exif_transpose(im))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ImageError(f"image '{ref.path}' cannot be read: {e}") from e


def resize_exact(image, height: int, width: int, resample: int | None = None):
    """Resize a PIL image to exactly ``height`` x ``width`` (the processor's bicubic by default)."""
    from PIL import Image

    if image.size == (width, height):
        return image
    return image.resize((width, height), resample=Image.Resampling.BICUBIC if resample is None else resample)


def shifted_clip(image, frames: int, height: int, width: int, step: int = 8, resample: int | None = None) -> list:
    """A synthetic clip: ``frames`` PIL frames of ``image`` resized to ``height`` x ``width`` (the
    processor's filter), frame k shifted right by ``k * step`` pixels (wrapping), like a slow pan."""
    import numpy as np
    from PIL import Image

    base = np.asarray(resize_exact(image, height, width, resample).convert("RGB"))
    return [Image.fromarray(np.roll(base, k * step, axis=1)) for k in range(frames)]
