"""Image sizes ``HxW``: parsing and the patch-geometry check (patch 14 x merge 2 = 28 pixels)."""

from __future__ import annotations

import re

from vlsens.errors import ConfigError

SIZE_RE = re.compile(r"^(\d+)x(\d+)$")


def parse_size(text: str, key: str = "vision.sizes", factor: int = 28) -> tuple[int, int]:
    """Parse ``HxW`` and check that both sides are positive multiples of ``factor``.

    The error names the key, the value, and the nearest valid sizes.
    """
    m = SIZE_RE.match(str(text).strip())
    if not m:
        raise ConfigError(f"{key}: '{text}' is not of the form HxW (for example 224x224 or 224x336).")
    h, w = int(m.group(1)), int(m.group(2))
    if h > 0 and w > 0 and h % factor == 0 and w % factor == 0:
        return h, w
    near = nearest_valid_sizes(h, w, factor)
    raise ConfigError(
        f"{key}: size '{text}' is invalid: height and width must be positive multiples of {factor} "
        f"(patch 14 x merge 2). Nearest valid sizes: {', '.join(near)}."
    )


def nearest_valid_sizes(h: int, w: int, factor: int = 28) -> list[str]:
    def around(v: int) -> list[int]:
        lo = max(factor, (v // factor) * factor)
        hi = lo if v <= lo and v % factor == 0 else lo + factor
        return sorted({lo, hi}, key=lambda x: (abs(x - v), x))

    cands = sorted(
        {(a, b) for a in around(h) for b in around(w)},
        key=lambda s: (abs(s[0] - h) + abs(s[1] - w), s),
    )
    return [f"{a}x{b}" for a, b in cands[:3]]


def size_str(h: int, w: int) -> str:
    return f"{h}x{w}"
