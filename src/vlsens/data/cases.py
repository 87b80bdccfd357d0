"""Parity cases: a graph's inputs and transformers' output for them (``reference.npz``).

Every tower writes its reference as cases (:meth:`vlsens.export.towers.base.Tower.reference`), and every
ONNX stage (the export gate, FP16, simplify) reads them without knowing the tower. A case names
the graph file of the variant folder it feeds (``model.onnx``, ``embeds.onnx``, ...), holds that
graph's inputs and the expected output, optionally the output positions that count (real tokens
of a left-padded batch), and whether the output is logits (then top-1 agreement is measured too).
``meta`` holds facts for the parity record (image name and sha256, patch count, ...).

On disk: ``__index__`` (JSON: name, graph, logits, meta, input names per case, and ``source``,
what produced the expected outputs), then ``<i>/in/<input>``, ``<i>/expected``, ``<i>/valid``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlsens.core.fsutil import savez


@dataclass
class Case:
    name: str
    graph: str
    inputs: dict[str, np.ndarray]
    expected: np.ndarray
    valid: np.ndarray | None = None
    logits: bool = False
    meta: dict = field(default_factory=dict)


class Cases:
    """Ordered parity cases and what produced their expected outputs (``source``)."""

    def __init__(self, cases: list[Case] | None = None, source: str = ""):
        self.cases = list(cases or [])
        self.source = source

    def __iter__(self):
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)

    def add(self, case: Case) -> None:
        if any(c.name == case.name for c in self.cases):
            case.name = f"{case.name}#{len(self.cases)}"  # two images of the same file name
        self.cases.append(case)

    @property
    def graphs(self) -> list[str]:
        """Graph files the cases feed, in order of first use."""
        return list(dict.fromkeys(c.graph for c in self.cases))

    def for_graph(self, graph: str) -> list[Case]:
        return [c for c in self.cases if c.graph == graph]

    def feeds(self, graph: str) -> list[dict[str, np.ndarray]]:
        return [c.inputs for c in self.for_graph(graph)]

    def save(self, path: str | Path) -> None:
        index, arrays = [], {}
        for i, c in enumerate(self.cases):
            index.append({"name": c.name, "graph": c.graph, "logits": bool(c.logits), "meta": c.meta,
                          "inputs": list(c.inputs), "valid": c.valid is not None})
            arrays.update({f"{i:04d}/in/{k}": v for k, v in c.inputs.items()})
            arrays[f"{i:04d}/expected"] = c.expected
            if c.valid is not None:
                arrays[f"{i:04d}/valid"] = np.asarray(c.valid, dtype=bool)
        arrays["__index__"] = np.array(json.dumps({"source": self.source, "cases": index}, sort_keys=True))
        savez(path, arrays)

    @classmethod
    def load(cls, path: str | Path) -> "Cases":
        from vlsens.core.fsutil import open_npz

        with open_npz(path) as z:
            index = json.loads(str(z["__index__"]))
            cases = []
            for i, e in enumerate(index["cases"]):
                cases.append(Case(e["name"], e["graph"], {k: z[f"{i:04d}/in/{k}"] for k in e["inputs"]},
                                  z[f"{i:04d}/expected"], z[f"{i:04d}/valid"] if e["valid"] else None,
                                  bool(e["logits"]), e["meta"]))
        return cls(cases, index["source"])
