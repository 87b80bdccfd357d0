"""Towers: one class per kind of graph (:mod:`vlsens.export.towers.base` says what a tower does).

The builtin kinds are listed in :data:`BUILTIN` by import path and imported only when used, so
the code hash of a stage (a rerun trigger, :mod:`vlsens.core.versions`) covers the tower it runs and
no other. More kinds come from the config::

    towers:
      - class: my_towers:MergerTower      # module:Class on the Python path
        variants: [fp32, fp16]
        sensitivity_variants: [fp32]
        settings: {...}                   # the tower's own settings (rule params)
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING

from vlsens.core.errors import ConfigError

if TYPE_CHECKING:
    from vlsens.export.towers.base import Tower

#: kind -> "module:Class", in the order their graphs are listed.
BUILTIN = {
    "vision_fixed": "vlsens.export.towers.vision_fixed:FixedVision",
    "vision_uint8": "vlsens.export.towers.vision_uint8:Uint8Vision",
    "vision_video": "vlsens.export.towers.vision_video:VideoStepVision",
    "vision_dynamic": "vlsens.export.towers.vision_dynamic:DynamicVision",
    "text": "vlsens.export.towers.text:Text",
    "decoder": "vlsens.export.towers.decoder:Decoder",
}


def load_class(path: str, key: str = "towers") -> type:
    module, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{key}: cannot import tower class '{path}' (module:Class on the Python path): {e}") from e
    from vlsens.export.towers.base import Tower

    if not (isinstance(cls, type) and issubclass(cls, Tower)):
        raise ConfigError(f"{key}: '{path}' is not a subclass of vlsens.export.towers.base.Tower")
    return cls


def kinds(config: dict) -> list[tuple[str, dict | None]]:
    """``(class path, plugin spec)`` of every tower kind: the builtin ones, then the config's."""
    return [(p, None) for p in BUILTIN.values()] + [(s["class"], s) for s in config.get("towers") or []]


def active(config: dict) -> dict[str, "Tower"]:
    """Every graph the config asks for -> its tower, in a stable order."""
    out: dict[str, Tower] = {}
    for i, (path, spec) in enumerate(kinds(config)):
        key = f"towers[{i - len(BUILTIN)}].class" if spec else "towers"
        cls = load_class(path, key)
        for graph in cls.graphs(config, spec):
            if not re.fullmatch(cls.pattern, graph):
                raise ConfigError(f"{key}: {cls.__name__} names graph '{graph}', which its pattern "
                                  f"'{cls.pattern}' does not match")
            if graph in out:
                raise ConfigError(f"{key}: graph '{graph}' is claimed by {type(out[graph]).__name__} and "
                                  f"{cls.__name__}")
            out[graph] = cls(graph, config, spec)
    return out


def for_graph(config: dict, graph: str) -> "Tower":
    """The tower of one graph (what a job script needs)."""
    towers = active(config)
    if graph not in towers:
        raise ConfigError(f"graph '{graph}' is not configured (configured: {', '.join(towers)})")
    return towers[graph]


def check_parts(config: dict, towers: dict) -> None:
    """Every variant of ``vision.parts.variants`` is built by at least one graph that can be cut."""
    cuttable = [t for t in towers.values() if t.cuttable]
    for v in config["vision"]["parts"]["variants"]:
        if cuttable and not any(v in t.variants() for t in cuttable):
            raise ConfigError(f"vision.parts.variants: '{v}' is built by no fixed-size graph "
                              f"({', '.join(t.graph for t in cuttable)}); add it to vision.variants (or the uint8 / "
                              "video sections' variants) or remove it from vision.parts.variants")
