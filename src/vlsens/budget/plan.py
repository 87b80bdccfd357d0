"""A plan: the file that rebuilds one deploy folder exactly, and the decoder it builds.

A folder of the byte-budget front is decided by four things: the bits of every weight MatMul of
the decoder (0: float, 4 or 8: ``MatMulNBits``) and, where it is not the settings', the
algorithm each quantized one is quantized with, the settings the decoder is quantized with
(:class:`~vlsens.quantize.nbits.NBitsSettings`), the vision graph's format and the embedding
table's format. A :class:`Plan` holds exactly these, plus a name and the search's estimate
(bytes and KL per part), and is saved as YAML, so the folder a search proposed can be built,
measured and compared later from the file alone. A plan whose MatMuls take a data-aware algorithm
(``gptq``) also names the SHA-256 of the calibration samples it read, and is rebuilt only from
those.

Two plans with the same :meth:`Plan.digest` (everything but the name and the estimate, as
canonical JSON) build the same folder. Every MatMul is listed, float ones as 0, so a plan that
names a MatMul the graph lacks, or misses one it has, is caught when the decoder is built
(:func:`build_decoder`) rather than silently left float.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vlsens.core.errors import ConfigError, VlsensError
from vlsens.quantize.nbits import ALGORITHMS, BITS, FLOAT, NBitsSettings

#: The vision graph's formats a plan may name: the exported graphs (``fp32``, ``fp16``), the
#: INT8 QDQ profile (``int8-mixed``), the weight-only ones
#: (:data:`vlsens.precision.weight_only.FORMATS`), and ``mixed``: every Linear its own width
#: (the plan's ``vision_ops``: INT4 in the run's ``int4`` format, INT8 as ``int8-wo``, 0 float;
#: :mod:`vlsens.budget.vision`).
VISION_FORMATS = ("fp32", "fp16", "int8-mixed", "int4", "int4-rtn128", "int8-wo", "mixed")
#: The mixed vision format (the graph is built from the plan's ``vision_ops``).
MIXED = "mixed"
#: The embedding table's formats: the exported FP32 table and ``GatherBlockQuantized`` at 8 / 4 bits.
EMBEDDING_FORMATS = ("fp32", "int8", "int4")
#: A plan folder's copy of its plan file.
PLAN_FILE = "plan.yaml"
#: The widths a decoder MatMul may take (0: float).
PLAN_BITS = (FLOAT, *BITS)
KEYS = ("name", "vision", "embedding", "decoder", "settings")  # and vision_ops where vision is mixed
HEADER = ("# A vlsens plan: one deploy folder (decoder bits per weight MatMul, 0 = float; vision and\n"
          "# embedding formats, a mixed vision graph's bits per Linear; quantization settings). Rebuild:\n"
          "# Plan.load(<this file>), then vlsens.budget.plan.build_decoder with the FP32 decoder (and, where\n"
          "# it names calibration, the decoder's calibration samples of that SHA-256), the named vision and\n"
          "# embedding graphs (mixed: vlsens.precision.weight_only.vision_folder with its per_op).\n")


def _settings(d, where: str) -> dict:
    """``d`` as complete :class:`NBitsSettings` (defaults filled), or a ConfigError naming ``where``."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: settings: a mapping of {sorted(NBitsSettings.__dataclass_fields__)}, got {d!r}")
    extra = sorted(set(d) - set(NBitsSettings.__dataclass_fields__))
    if extra:
        raise ConfigError(f"{where}: settings: unknown keys {extra}; valid: {sorted(NBitsSettings.__dataclass_fields__)}")
    try:
        return NBitsSettings.from_config(d).as_dict()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: settings: {e}") from e


def _check(vision, embedding, decoder, where: str, vision_ops=None) -> None:
    """A ConfigError naming ``where`` and the key for an unknown format or a bits value not 0/4/8,
    and for ``vision_ops`` missing where the vision format is mixed (or given where it is not)."""
    if vision not in VISION_FORMATS:
        raise ConfigError(f"{where}: vision: unknown format {vision!r}; valid: {list(VISION_FORMATS)}")
    if vision == MIXED:
        if not isinstance(vision_ops, Mapping) or not vision_ops:
            raise ConfigError(f"{where}: vision_ops: a mixed vision graph names every Linear's MatMul with its bits "
                              f"({list(PLAN_BITS)}), got {vision_ops!r}")
        bad = {n: b for n, b in vision_ops.items() if isinstance(b, bool) or b not in PLAN_BITS}
        if bad:
            raise ConfigError(f"{where}: vision_ops: bits must be one of {list(PLAN_BITS)} (0: float); got "
                              f"{dict(list(bad.items())[:5])}")
    elif vision_ops:
        raise ConfigError(f"{where}: vision_ops is for vision: {MIXED}; this plan's vision is {vision!r}")
    if embedding not in EMBEDDING_FORMATS:
        raise ConfigError(f"{where}: embedding: unknown format {embedding!r}; valid: {list(EMBEDDING_FORMATS)}")
    if not isinstance(decoder, Mapping) or not decoder:
        raise ConfigError(f"{where}: decoder: a mapping of every weight MatMul to its bits, got {decoder!r}")
    bad = {n: b for n, b in decoder.items() if isinstance(b, bool) or b not in PLAN_BITS}
    if bad:
        raise ConfigError(f"{where}: decoder: bits must be one of {list(PLAN_BITS)} (0: float); got "
                          f"{dict(list(bad.items())[:5])}")


def _check_algorithms(algorithms, decoder, where: str) -> None:
    """A ConfigError naming ``where`` for an algorithm not in :data:`ALGORITHMS` or one given to
    a MatMul the plan leaves float or does not list."""
    if algorithms is None:
        return
    if not isinstance(algorithms, Mapping):
        raise ConfigError(f"{where}: algorithms: a mapping of quantized MatMuls to one of {list(ALGORITHMS)}, "
                          f"got {algorithms!r}")
    bad = {n: a for n, a in algorithms.items() if a not in ALGORITHMS}
    if bad:
        raise ConfigError(f"{where}: algorithms: one of {list(ALGORITHMS)} per MatMul; got {dict(list(bad.items())[:5])}")
    loose = sorted(n for n in algorithms if not (isinstance(decoder, Mapping) and decoder.get(n)))
    if loose:
        raise ConfigError(f"{where}: algorithms: {loose[:5]} are not quantized MatMuls of the plan's decoder")


def _check_calibration(calibration, algorithms, where: str) -> None:
    """A plan names its calibration samples' SHA-256 exactly when one of its MatMuls takes a
    data-aware algorithm."""
    from vlsens.quantize.nbits import DATA_AWARE, data_aware

    aware = data_aware((algorithms or {}).values())
    if aware and not (isinstance(calibration, str) and len(calibration) == 64):
        raise ConfigError(f"{where}: calibration: algorithms {aware} read calibration samples; the plan names their "
                          f"SHA-256 (64 hex digits), got {calibration!r}")
    if calibration and not aware:
        raise ConfigError(f"{where}: calibration: given, but no MatMul takes a data-aware algorithm ({list(DATA_AWARE)})")


@dataclass(frozen=True)
class Plan:
    """One folder: ``decoder`` (every weight MatMul -> 0 / 4 / 8), its quantization ``settings``
    (completed to :meth:`NBitsSettings.as_dict`), the ``vision`` and ``embedding`` formats; ``name``
    and ``estimate`` (free-form: bytes, KL, per part) do not change what is built."""

    name: str
    vision: str
    embedding: str
    decoder: dict[str, int]
    settings: dict
    estimate: dict = field(default_factory=dict)
    #: a mixed vision graph's Linears (MatMul name -> 0 / 4 / 8); empty for every other format
    vision_ops: dict[str, int] = field(default_factory=dict)
    #: the quantized decoder MatMuls quantized by another algorithm than ``settings``' (MatMul ->
    #: one of :data:`~vlsens.quantize.nbits.ALGORITHMS`; empty: every one by the settings')
    algorithms: dict[str, str] = field(default_factory=dict)
    #: the SHA-256 of the calibration samples a data-aware algorithm (``gptq``) read; '' where none is taken
    calibration: str = ""

    def __post_init__(self):
        where = f"plan {self.name!r}"
        _check(self.vision, self.embedding, self.decoder, where, self.vision_ops)
        _check_algorithms(self.algorithms, self.decoder, where)
        _check_calibration(self.calibration, self.algorithms, where)
        object.__setattr__(self, "algorithms", {str(n): str(a) for n, a in (self.algorithms or {}).items()})
        object.__setattr__(self, "decoder", {str(n): int(b) for n, b in self.decoder.items()})
        object.__setattr__(self, "vision_ops", {str(n): int(b) for n, b in (self.vision_ops or {}).items()})
        object.__setattr__(self, "settings", _settings(self.settings, where))
        object.__setattr__(self, "estimate", dict(self.estimate or {}))

    def as_dict(self) -> dict:
        return {"name": self.name, "vision": self.vision, "embedding": self.embedding, "settings": self.settings,
                "estimate": self.estimate, "decoder": self.decoder, **self._optional()}

    def _optional(self) -> dict:
        """The optional keys that are set: a mixed vision graph's Linears, per-op algorithms and the
        calibration a data-aware one read (absent where unset, so a plan without them keeps the
        file and digest it had before they existed)."""
        return {k: getattr(self, k) for k in ("vision_ops", "algorithms", "calibration") if getattr(self, k)}

    def save(self, path: str | Path) -> Path:
        """The plan as YAML (atomically), a header saying what the file is and how to rebuild it."""
        import yaml

        from vlsens.core.fsutil import atomic_file

        path = Path(path)
        with atomic_file(path) as tmp:
            tmp.write_text(HEADER + yaml.safe_dump(self.as_dict(), sort_keys=False, default_flow_style=False))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """The plan in ``path``; a ConfigError naming the file and the key for a missing key, an
        unknown format or bits other than 0 / 4 / 8."""
        import yaml

        path = Path(path)
        d = yaml.safe_load(path.read_text())
        if not isinstance(d, Mapping):
            raise ConfigError(f"{path}: not a plan (a mapping with keys {list(KEYS)})")
        missing = [k for k in KEYS if k not in d]
        if missing:
            raise ConfigError(f"{path}: missing key {missing[0]!r} (a plan has {list(KEYS)})")
        optional = ("estimate", "vision_ops", "algorithms", "calibration")
        extra = sorted(set(d) - {*KEYS, *optional})
        if extra:
            raise ConfigError(f"{path}: unknown key {extra[0]!r} (a plan has {[*KEYS, *optional]})")
        _check(d["vision"], d["embedding"], d["decoder"], str(path), d.get("vision_ops"))
        _check_algorithms(d.get("algorithms"), d["decoder"], str(path))
        _check_calibration(d.get("calibration", ""), d.get("algorithms") or {}, str(path))
        return cls(str(d["name"]), d["vision"], d["embedding"], dict(d["decoder"]), _settings(d["settings"], str(path)),
                   dict(d.get("estimate") or {}), dict(d.get("vision_ops") or {}), dict(d.get("algorithms") or {}),
                   str(d.get("calibration") or ""))

    def digest(self) -> str:
        """sha256 of what is built (everything but ``name`` and ``estimate``), as canonical JSON."""
        built = {"vision": self.vision, "embedding": self.embedding, "decoder": self.decoder, "settings": self.settings,
                 **self._optional()}
        return hashlib.sha256(json.dumps(built, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def bits_summary(self) -> dict[str, int]:
        """How many decoder MatMuls are INT4, INT8 and float."""
        b = list(self.decoder.values())
        return {"int4": b.count(4), "int8": b.count(8), "float": b.count(FLOAT)}

    def entry(self) -> dict:
        """The plan as the front's record lists it: name, digest, estimate, MatMul counts per width
        and, where some take another algorithm than the settings', per algorithm (``algorithms``)."""
        counts: dict[str, int] = {}
        for a in self.algorithms.values():
            counts[a] = counts.get(a, 0) + 1
        return {"name": self.name, "digest": self.digest(), **self.estimate, **self.bits_summary(),
                **({"algorithms": counts} if counts else {}), "vision": self.vision_label(), "embedding": self.embedding}

    def vision_label(self) -> str:
        """The vision format as a table shows it (a mixed graph with its INT4 / INT8 / float Linears)."""
        if self.vision != MIXED:
            return self.vision
        b = list(self.vision_ops.values())
        return f"{MIXED} {b.count(4)}/{b.count(8)}/{b.count(FLOAT)}"


def build_decoder(plan: Plan, float_model: str | Path, out_model: str | Path, calibration=None,
                  threads: int = 0, reuse=None) -> dict:
    """``out_model`` (+ its data file): ``float_model`` with every MatMul at the plan's bits, by
    :func:`vlsens.quantize.nbits.quantize` at the plan's settings. The plan must list exactly the
    graph's weight MatMuls (else a VlsensError naming the missing and extra ones); the built
    graph's bits are read back and checked. ``calibration``: the samples a plan that names
    calibration was chosen on (checked by their SHA-256), a path or a
    :class:`vlsens.quantize.gptq.Calibration` with the run's store of GPTQ codes (read, not
    recomputed: the same decoder); ``reuse``: a :class:`vlsens.quantize.nbits.Reuse` its data-free
    MatMuls are taken from where it has them (the same nodes). Facts: plan, digest, counts, weight
    bytes."""
    from vlsens.precision.nbits import weight_facts
    from vlsens.quantize.nbits import quantize, weight_matmuls

    graph = [o["name"] for o in weight_matmuls(float_model)]
    missing, extra = sorted(set(graph) - set(plan.decoder)), sorted(set(plan.decoder) - set(graph))
    if missing or extra:
        raise VlsensError(f"plan {plan.name!r} does not list the weight MatMuls of {float_model}: "
                          f"missing {missing[:5]} ({len(missing)}), extra {extra[:5]} ({len(extra)})")
    if plan.calibration:
        from vlsens.core.fsutil import file_sha256
        from vlsens.quantize.gptq import Calibration

        samples = Calibration.of(calibration).samples if calibration is not None else None
        got = file_sha256(samples) if samples is not None and samples.is_file() else None
        if got != plan.calibration:
            given = "missing" if got is None else got[:12] + ".."
            raise VlsensError(f"plan {plan.name!r} takes weights a data-aware algorithm chose on the calibration samples "
                              f"{plan.calibration[:12]}..; given {samples} ({given})")
    model = quantize(float_model, out_model, {n: b for n, b in plan.decoder.items() if b},
                     NBitsSettings.from_config(plan.settings), algorithms=plan.algorithms,
                     calibration=calibration if plan.calibration else None, threads=threads, reuse=reuse)
    facts = weight_facts(model)
    if facts["bits"] != plan.decoder:
        wrong = sorted(n for n in plan.decoder if facts["bits"].get(n) != plan.decoder[n])
        raise VlsensError(f"{model}: the built bits differ from plan {plan.name!r} at {wrong[:5]}")
    return {"plan": plan.name, "digest": plan.digest(), "model": str(model), "bits": plan.bits_summary(),
            "weight_bytes": facts["weight_bytes"], "settings": plan.settings}
