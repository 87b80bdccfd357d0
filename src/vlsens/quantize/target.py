"""Deployment targets of a mixed-precision profile: the arithmetic a QDQ model really runs in.

A QDQ model is not one arithmetic. The sensitivity engine and the profile search evaluate Q/DQ
nodes in float (``DQ(Q(x))``, a basic-optimization session: *fake quantization*). What a deployment
computes depends on where it runs:

``ort-cpu``   ONNX Runtime's CPU provider with its default optimizations fuses every
              ``DQ -> MatMul/Gemm/Conv -> Q`` into an integer kernel (``QLinearMatMul``, ``QGemm``,
              ``QLinearConv``, ``MatMulIntegerToFloat``). With U8 activations and S8 weights on an
              x86 CPU without VNNI, MLAS multiplies with ``vpmaddubsw``, which adds two u8 x s8
              products into a *saturating* 16-bit integer: the kernel's result is not the fake-quant
              one (measured on a depth-8 tower: cosine 0.99707 built vs 0.99902 estimated). ORT's
              guidance for such CPUs: 7-bit weights (``reduce_range``: 255 x 64 x 2 < 2^15, so no pair
              can saturate) or U8U8 (widened 16-bit products, no saturation, slower). With either
              the integer kernels equal fake quantization up to float rounding, so the engine's
              estimate is the deployed model's value. CPUs with VNNI (``avx512_vnni``,
              ``avx_vnni``, AMX) and ARM CPUs accumulate in 32 bits: no guard is needed.
``ort-cuda``  ONNX Runtime's CUDA provider runs Q and DQ as operators around float kernels:
              fake quantization.
``tensorrt``  TensorRT compiles Q/DQ pairs into INT8 kernels with 32-bit accumulation, which
              equals fake quantization up to float rounding; it takes symmetric INT8 activations
              only, so activations are S8 with zero point 0.
``npu``       NPU toolchains (AXERA Pulsar2 and the like) compile the float graph with the
              profile's per-layer data types (``quant.layer_configs``: U8 / U16 / FP32);
              fake quantization is the closest model of them.
``qnn``       ONNX Runtime's QNN execution provider (Qualcomm HTP) runs a QDQ model whose
              activations are uint8 or uint16 per tensor (ORT's ``TensorQuantOverrides``);
              fake quantization here, on the CPU provider.

``npu`` and ``qnn`` have **16-bit activations** (:data:`WIDE_TARGETS`): each quantizable op is
W8A8, W8A16 or float, and the engine measures both widths (``quant.wide_activations``).

``resolve`` turns the config (``quant.*`` and ``sensitivity.*``) into the quantization settings
every engine and profile job of a run shares (a rule param: changing the target or the guard
re-runs the analysis). The CPU is read where the DAG is built; set ``quant.saturation``
explicitly when the deployment CPU is another one (a cluster, an edge box).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from vlsens.core.errors import ConfigError
from vlsens.quantize.rounding import ROUNDINGS


@dataclass(frozen=True)
class Target:
    name: str
    #: "integer" (ORT's fused integer kernels) or "fake-quant" (Q/DQ evaluated in float)
    arithmetic: str
    #: ONNX Runtime provider its built models are measured and timed on; None: not in ORT.
    provider: str | None
    description: str

    @property
    def latency_here(self) -> bool:
        """Can vlsens time a model on this target's own provider (on a machine that has it)?"""
        return self.provider is not None


TARGETS = {
    "ort-cpu": Target("ort-cpu", "integer", "CPUExecutionProvider",
                      "ONNX Runtime CPU provider, default optimizations: integer kernels "
                      "(QLinearMatMul / QGemm / QLinearConv / MatMulIntegerToFloat)"),
    "ort-cuda": Target("ort-cuda", "fake-quant", "CUDAExecutionProvider",
                       "ONNX Runtime CUDA provider: Q/DQ operators around float kernels"),
    "tensorrt": Target("tensorrt", "fake-quant", None,
                       "TensorRT: Q/DQ compiled into INT8 kernels with 32-bit accumulation, symmetric activations"),
    "npu": Target("npu", "fake-quant", None,
                  "NPU toolchain: float graph + per-layer U8 / U16 / FP32 data types, compiled by the vendor's "
                  "quantizer"),
    "qnn": Target("qnn", "fake-quant", None,
                  "ONNX Runtime QNN execution provider: QDQ with uint8 / uint16 activations per tensor"),
}

#: Targets whose ops may take 16-bit activations (W8A16), and the wide type for each 8-bit one.
WIDE_TARGETS = ("npu", "qnn")
WIDE_TYPE = {"uint8": "uint16", "int8": "int16"}
#: ``quant.wide_activations`` values: auto = on for :data:`WIDE_TARGETS`, off = 8-bit or float only.
WIDE_MODES = ("auto", "off")

#: ``quant.saturation`` values: how ``ort-cpu`` avoids 16-bit saturation on CPUs without VNNI.
GUARDS = ("auto", "reduce_range", "u8u8", "none")

#: /proc/cpuinfo flags that mean 32-bit integer dot products (no u8 x s8 pair saturation).
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: Flags recorded with every engine and profile (what decides the integer kernels MLAS picks).
RECORDED_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "f16c", "asimddp", "i8mm")


def cpu_features(cpuinfo: str | None = None) -> dict:
    """This machine's CPU: architecture, model name, the :data:`RECORDED_FLAGS` it has, and whether
    its integer dot products saturate (x86 without any of :data:`VNNI_FLAGS`). ``cpuinfo``: the
    text of ``/proc/cpuinfo`` (read when not given)."""
    arch = platform.machine().lower()
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    model = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
    x86 = arch in ("x86_64", "amd64", "i686", "i386") or "sse2" in flags
    if x86:
        arch = "x86_64" if arch in ("", "amd64") else arch
    vnni = any(f in flags for f in VNNI_FLAGS)
    return {"arch": arch, "model": model, "flags": sorted(f for f in RECORDED_FLAGS if f in flags),
            "vnni": vnni, "u8s8_saturates": bool(x86 and not vnni)}


def resolve_guard(value: str, cpu: dict) -> tuple[str, str]:
    """(guard, why) for ``ort-cpu``: ``auto`` is ``reduce_range`` where U8S8 saturates, else none."""
    if value not in GUARDS:
        raise ConfigError(f"quant.saturation: '{value}' (valid: {', '.join(GUARDS)})")
    if value != "auto":
        return value, f"quant.saturation: {value} (set in the config)"
    if cpu["u8s8_saturates"]:
        return "reduce_range", (f"auto: {cpu['model'] or cpu['arch']} has no VNNI ({'/'.join(VNNI_FLAGS)}), so ORT's "
                                "U8S8 kernels add u8 x s8 pairs into saturating 16-bit integers; 7-bit weights "
                                "cannot saturate (ORT's guidance for non-VNNI CPUs)")
    return "none", f"auto: {cpu['model'] or cpu['arch']} accumulates integer dot products in 32 bits (no saturation)"


def resolve(config: dict, cpu: dict | None = None) -> dict:
    """The quantization settings of a run (``sensitivity.*`` adjusted for ``quant.target``), with
    the target, the saturation guard and why it was chosen: a rule param, and what engine.json,
    ort.json and every profile's eval.json record as ``settings``."""
    sens, q = config["sensitivity"], config["quant"]
    name = q["target"]
    if name not in TARGETS:
        raise ConfigError(f"quant.target: '{name}' (valid: {', '.join(TARGETS)})")
    s = {k: sens[k] for k in ("op_types", "activation_type", "weight_type", "per_channel", "calibrate_method")}
    s["op_types"] = list(s["op_types"])
    s.update(reduce_range=False, activation_symmetric=False, target=name, guard="none", guard_why="")
    if name == "ort-cpu":
        cpu = cpu if cpu is not None else cpu_features()
        guard, why = resolve_guard(q["saturation"], cpu)
        s.update(guard=guard, guard_why=why)
        if guard == "reduce_range":
            s["reduce_range"] = True
        elif guard == "u8u8":
            if s["activation_type"] != "uint8" or s["weight_type"] != "int8":
                raise ConfigError(f"quant.saturation: u8u8 turns U8 activations x S8 weights into U8 x U8; "
                                  f"sensitivity.activation_type/weight_type are {s['activation_type']}/"
                                  f"{s['weight_type']}. Use reduce_range, or set them to uint8/int8.")
            s["weight_type"] = "uint8"
    elif q["saturation"] not in ("auto", "none"):
        raise ConfigError(f"quant.saturation: {q['saturation']} guards ONNX Runtime's CPU kernels; quant.target "
                          f"'{name}' does not run them. Use auto (or none).")
    wide = q.get("wide_activations", "auto")
    if wide not in WIDE_MODES:
        raise ConfigError(f"quant.wide_activations: '{wide}' (valid: {', '.join(WIDE_MODES)})")
    s["activation_wide"] = WIDE_TYPE[s["activation_type"]] if wide == "auto" and name in WIDE_TARGETS else ""
    rounding = _rounding(q.get("weight_rounding", "auto"), name)
    if rounding != "rtn":  # rtn is QuantSettings' default: the settings of rtn runs stay as they were
        s["weight_rounding"] = rounding
    if name == "tensorrt":
        if s["activation_type"] not in ("uint8", "int8") or s["weight_type"] != "int8":
            raise ConfigError("quant.target: tensorrt takes symmetric INT8 activations and INT8 weights; "
                              f"sensitivity.activation_type/weight_type are {s['activation_type']}/{s['weight_type']}")
        s.update(activation_type="int8", activation_symmetric=True)
    return s


#: ``quant.weight_rounding`` values: auto = gptq where the QDQ model itself is deployed (:data:`GPTQ_TARGETS`).
ROUNDING_MODES = ("auto", *ROUNDINGS)
#: Targets whose deployed model can be the QDQ model vlsens builds, its weight codes included: QNN's
#: HTP backend runs it; Pulsar2 compiles it through its Quantized ONNX import (the toolchain folder's
#: ``pulsar2_qdq.json``). On the float graph (``pulsar2.json``) Pulsar2 rounds the weights itself,
#: so a profile chosen with GPTQ codes holds there only for the QDQ model (docs/npu.md).
GPTQ_TARGETS = ("qnn", "npu")


def _rounding(value: str, target: str) -> str:
    if value not in ROUNDING_MODES:
        raise ConfigError(f"quant.weight_rounding: '{value}' (valid: {', '.join(ROUNDING_MODES)})")
    if value == "auto":
        return "gptq" if target in GPTQ_TARGETS else "rtn"
    return value


def check_profile_objective(objective: str, settings: dict, key: str) -> None:
    """``objective: latency`` times candidates on the target's own provider: refused where vlsens
    cannot run that provider (tensorrt, npu)."""
    target = TARGETS[settings["target"]]
    if objective == "latency" and not target.latency_here:
        raise ConfigError(f"{key}: latency needs the target's own runtime to time candidates; quant.target "
                          f"'{target.name}' is not run by vlsens. Use objective: accuracy, or quant.target "
                          "ort-cpu / ort-cuda.")


def target_of(settings: dict) -> Target:
    return TARGETS[settings.get("target", "ort-cpu")]


def measurement_providers(target: Target) -> tuple[list[str], bool]:
    """(providers, on_target) a built model of ``target`` is measured and timed with here: the
    target's own provider where ONNX Runtime has it, else the CPU provider (``on_target`` False)."""
    import onnxruntime as ort

    if target.provider and target.provider in ort.get_available_providers():
        extra = [] if target.provider == "CPUExecutionProvider" else ["CPUExecutionProvider"]
        return [target.provider, *extra], True
    return ["CPUExecutionProvider"], False


def arithmetic_note(settings: dict) -> str:
    """One line for the records: what the engine's estimate and the built model's value mean."""
    t = target_of(settings)
    if t.arithmetic == "integer":
        guard = settings.get("guard", "none")
        return (f"{t.name}: the built model runs ONNX Runtime's integer kernels; the engine's fake-quant estimate "
                f"equals them up to float rounding (saturation guard: {guard})")
    return f"{t.name}: fake quantization (Q/DQ in float), what the target compiles Q/DQ pairs into"
