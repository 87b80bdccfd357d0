"""The tower: the unit of extension. One class per kind of graph built from a checkpoint.

A tower knows what only it can know, and nothing else:

* which graphs of its kind a config asks for (``vision/224x224`` ... ) and their variants;
* its **reference**: the graph's inputs built from the checkpoint and real images, and transformers'
  output for them, as :class:`~vlsens.data.cases.Cases` (each case also says how to compare: the valid
  output positions, whether the output is logits);
* its **export**: PyTorch -> the ONNX graph file(s) of its variant folder (``model.onnx`` first;
  the text tower also writes ``embeds.onnx``);
* its **calibration set**: calibration and evaluation feeds for the graph it analyses.

Everything after the export is generic and never asks which tower it serves: the parity gate
reads the cases, FP16 / simplify transform every graph file the cases name, and calibration
sets, the sensitivity engines and the profile work on any ONNX graph with its feeds.

What the DAG needs (graphs, variants, settings that become rule params) is read from the config
when the DAG is built, without torch; the job methods (:meth:`reference`, :meth:`export`,
:meth:`calibration`) receive exactly those settings, so a setting that changes an output is
always a rule param (and re-runs it).

Registering a tower: the builtin ones are listed in :mod:`vlsens.export.towers`; others are named in the
config (``towers: [{class: "module:Class", ...}]``) and imported from the Python path.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from vlsens.core import paths
from vlsens.data.cases import Cases


class Tower:
    #: Short name of the kind (used in messages and for plugin towers' config entries).
    kind: ClassVar[str] = ""
    #: Regular expression every graph name of this kind matches (``vision/[0-9]+x[0-9]+``).
    pattern: ClassVar[str] = ""
    #: ONNX graph files of a variant folder, the main one (``model.onnx``, published last) first.
    files: ClassVar[tuple[str, ...]] = (paths.MAIN,)
    #: The file the sensitivity engines and the profile take.
    analysed: ClassVar[str] = paths.MAIN
    #: Sensitivity engines that can analyse this graph (``inc``: single stacked input, fixed batch).
    engines: ClassVar[tuple[str, ...]] = ("ort",)
    #: Write the calibration set also as ``calib.tar`` / ``eval.tar`` (one .npy per sample).
    npu_archive: ClassVar[bool] = False
    #: Can its graphs be cut into single-file parts at block boundaries (``vision.parts``;
    #: fixed shapes: what NPU compilers take)?
    cuttable: ClassVar[bool] = False
    #: Does its calibration run a model (torch)? Then it asks for a GPU and the configured threads.
    calibration_runs_model: ClassVar[bool] = True
    #: The analysed graph's first output is logits (B, S, vocab): KL and top-1 are measured too.
    logits: ClassVar[bool] = False
    #: What one repeated unit of its graph is called (rows of the report's heatmap).
    block_label: ClassVar[str] = "block"
    #: Libraries each of its stages depends on, where they differ from vlsens.core.versions.STAGE_LIBRARIES.
    libraries: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, graph: str, config: dict, spec: dict | None = None):
        self.graph = graph
        self.config = config
        self.spec = spec or {}

    @cached_property
    def size_rule(self) -> dict:
        """``parse_size`` keywords of the configured model's family (sides: multiples of 28 or 32;
        a local checkpoint's config.json is read once per tower)."""
        from vlsens.model.family import size_rule

        return size_rule(self.config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.graph!r})"

    # ------------------------------------------------------------------------------------------
    # The DAG (config side, no torch)

    @classmethod
    def graphs(cls, config: dict, spec: dict | None = None) -> list[str]:
        """The graphs of this kind the config asks for (empty: the tower is off)."""
        raise NotImplementedError

    def check(self, plan) -> None:
        """Raise :class:`~vlsens.core.errors.ConfigError` for settings of this tower that cannot work."""
        from vlsens.config import check_variants

        check_variants(self.variants(), self.analysed_variants(), self.key("variants"), self.key("sensitivity_variants"))

    # Every tower reads its keys from one section of the config: a builtin one from
    # :attr:`section_key` (``vision``, ``vision.dynamic``, ``text``, ``deploy.decoder`` ...), a tower
    # named in the config from its entry (``towers[i]``). Each section has ``variants`` and
    # ``sensitivity_variants``.

    #: Dotted config key of the tower's section (None: its ``towers[]`` entry).
    section_key: ClassVar[str | None] = None

    @property
    def section(self) -> dict:
        if self.section_key is None:
            return self.spec
        node = self.config
        for part in self.section_key.split("."):
            node = node[part]
        return node

    def key(self, name: str) -> str:
        """The full config key of ``name`` in the tower's section (for messages)."""
        return f"{self.section_key or 'towers[]'}.{name}"

    def variants(self) -> list[str]:
        """Variants built (``fp32`` always comes from the export)."""
        return list(self.section["variants"])

    def configure(self, facts: dict) -> None:
        """Take the model's facts the plan measured when the DAG was built
        (:func:`vlsens.dag.plan.model_facts`: ``lm_fp32_bytes``); a tower whose settings depend on the
        model's size resolves them here."""

    def parts_calibration(self) -> bool:
        """Does each part get its calibration archives (``vision.parts.calibration``)?"""
        return bool(self.config["vision"]["parts"]["calibration"])

    def parts_variants(self) -> list[str]:
        """Variants cut into parts: those of ``vision.parts.variants`` this graph builds (towers
        that are :attr:`cuttable`; a variant no such graph builds is refused by the plan)."""
        if not self.cuttable:
            return []
        return [v for v in self.config["vision"]["parts"]["variants"] if v in self.variants()]

    def analysed_variants(self) -> list[str]:
        """Variants analysed by the sensitivity engines and profiled."""
        return list(self.section["sensitivity_variants"])

    def reference_settings(self) -> dict[str, Any]:
        return dict(self.spec["settings"])

    def export_settings(self) -> dict[str, Any]:
        return dict(self.spec["settings"])

    def calibration_settings(self) -> dict[str, Any]:
        return dict(self.spec["settings"])

    def outside_inputs(self, plan) -> dict[str, tuple[str, list]]:
        """Files outside ``results/`` this tower reads besides the checkpoint and the plan's
        images, by manifest kind: ``{kind: (file, [ImageRef the file names])}``. Each gets a content
        manifest (:func:`vlsens.data.inputs.write_manifests`), passed to :meth:`calibration_inputs`."""
        return {}

    def calibration_inputs(self, model: str, manifests: dict[str, str]) -> dict[str, Any]:
        """Inputs of the calibration rule besides the checkpoint (paths; lists allowed)."""
        return {}

    def planted_site(self, preset: dict) -> tuple[int, str] | None:
        """Where a tiny preset (its ``vlsens_preset.json``) planted an outlier in this tower: the
        block and the ranking role of the op that reads the outlier tensor (None: nowhere)."""
        return None

    def profile_settings(self) -> dict[str, Any]:
        """``metric``, ``target``, ``max_evals``, ``fail_if_unreachable`` of its profile."""
        return dict(self.config["profile"])

    # ------------------------------------------------------------------------------------------
    # Jobs

    def reference(self, checkpoint: Path, images: list, settings: dict, device: str = "cpu") -> Cases:
        """Parity cases: inputs from the checkpoint's processor and real ``images``, and
        transformers' outputs (cases for every file in :attr:`files`)."""
        raise NotImplementedError

    def export(self, checkpoint: Path, cases: Cases, workdir: Path, settings: dict) -> tuple[dict[str, Path], dict]:
        """Write the FP32 graph files into ``workdir`` (one external data file each, see
        :mod:`vlsens.core.onnxutil`); return ``{file: path}`` and facts for the parity record."""
        raise NotImplementedError

    def calibration(self, checkpoint: Path, inputs: dict[str, Any], settings: dict):
        """A :class:`~vlsens.data.calibration.CalibrationSet` for the :attr:`analysed` graph."""
        raise NotImplementedError
