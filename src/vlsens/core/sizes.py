"""Image sizes ``HxW``: parsing and the patch-geometry check (patch x merge 2: 28 pixels for
Qwen2-VL and Qwen2.5-VL, 32 for Qwen3-VL; :mod:`vlsens.model.family`)."""

from __future__ import annotations

import re

from vlsens.core.errors import ConfigError

SIZE_RE = re.compile(r"^(\d+)x(\d+)$")


def parse_size(text: str, key: str = "vision.sizes", factor: int = 28, family: str = "") -> tuple[int, int]:
    """Parse ``HxW`` and check that both sides are positive multiples of ``factor``.

    The error names the key, the value, the family (``family``: its title, when known) and the
    nearest valid sizes.
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
        f"({family + ': ' if family else ''}patch {factor // 2} x merge 2). Nearest valid sizes: {', '.join(near)}."
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
