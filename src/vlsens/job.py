"""The workflow job this process runs (set by :func:`vlsens.scripting.run`; None outside jobs)."""

from __future__ import annotations

rule: str | None = None


def set_rule(name: str | None) -> None:
    global rule
    rule = name
