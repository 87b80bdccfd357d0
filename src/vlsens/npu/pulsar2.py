"""AXERA Pulsar2's ``pulsar2 build`` config from a profile: the graph (or a part), its calibration
archive and ``quant.layer_configs`` with the profile's per-op data types.

Pulsar2 takes a config in prototxt, relaxed JSON, YAML or TOML (its docs, "Configuration file
details": the ``BuildConfig`` structure). vlsens writes strict JSON, which relaxed JSON accepts:

* ``input``: the float graph Pulsar2 quantizes itself (the profile's ops are what it must keep
  wide or float), ``model_type: ONNX``; for a part, the single-file ``part<j>.onnx``;
* ``quant.input_configs``: the graph's input with ``calibration_dataset`` (the ``calib.tar`` of
  the graph, or of the part: one ``<input>_<index>.npy`` per call), ``calibration_format: Numpy``
  and every sample (``calibration_size: -1``);
* ``quant.layer_configs``: ``layer_names`` (the ONNX node names) with ``data_type`` ``U16`` (the
  profile's W8A16 ops; ``S16`` for signed activations) and ``FP32`` (its float ops); every other op
  takes Pulsar2's default ``U8``;
* ``quant.calibration_method`` from ``sensitivity.calibrate_method``; ``precision_analysis`` on,
  ``EndToEnd`` (Pulsar2's per-layer report of the compiled model, to compare with eval.json).

A second config, ``pulsar2_qdq.json``, gives Pulsar2 the profile's QDQ model itself
(``model_type: QuantONNX``: "Quantized ONNX model import", which its docs state for AX650 and M76H
and in ONNX's QDQ format): the weight codes, activation scales and 16-bit tensors vlsens measured
are then the ones compiled, instead of Pulsar2 rounding the float graph itself. The same
calibration archive and layer configs go with it (the documented QuantONNX examples keep both).

The schema the test checks these files against (``workflow/schemas/records/pulsar2.schema.yaml``)
is written from that documented structure; vlsens has not run Pulsar2 (its toolchain is a Docker
image outside the package registries), so the check is against the documentation only.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Pulsar2's activation data types for the profile's activation types.
DATA_TYPES = {"uint8": "U8", "int8": "S8", "uint16": "U16", "int16": "S16"}
#: ``sensitivity.calibrate_method`` -> Pulsar2's ``quant.calibration_method``.
CALIBRATION_METHODS = {"minmax": "MinMax", "entropy": "KL", "percentile": "Percentile"}
#: Pulsar2's default hardware and NPU mode (``target_hardware``, ``npu_mode``).
TARGET_HARDWARE, NPU_MODE = "AX650", "NPU1"
#: The hardware Pulsar2's docs state takes a Quantized ONNX (QDQ) model (``model_type: QuantONNX``).
QUANT_ONNX_HARDWARE = ("AX650", "M76H")


def layer_configs(ops: dict[str, dict], wide_type: str, present: Iterable[str] | None = None) -> list[dict]:
    """``quant.layer_configs`` for a profile's ``ops`` (``profile.yaml``'s): one entry naming the
    W8A16 ops at the wide type, one naming the float ops ``FP32``; ``present``: only these node
    names (a part's)."""
    keep = set(present) if present is not None else None
    wide, floats = [], []
    for name, op in ops.items():
        if keep is not None and name not in keep:
            continue
        if op["precision"] == "int8-a16":
            wide.append(name)
        elif op["precision"] not in ("int8",):
            floats.append(name)
    out = []
    if wide:
        out.append({"layer_names": wide, "data_type": DATA_TYPES[wide_type or "uint16"]})
    if floats:
        out.append({"layer_names": floats, "data_type": "FP32"})
    return out


def build_config(model: str, calib_tar: str, input_name: str, output_dir: str, layers: list[dict],
                 calibrate_method: str = "minmax", quantized: bool = False) -> dict:
    """One ``pulsar2 build`` config (paths as given: relative to the folder Pulsar2 runs in);
    ``quantized``: ``model`` is a QDQ model (``model_type: QuantONNX``), else a float graph."""
    return {
        "input": model,
        "output_dir": output_dir,
        "output_name": "compiled.axmodel",
        "model_type": "QuantONNX" if quantized else "ONNX",
        "target_hardware": TARGET_HARDWARE,
        "npu_mode": NPU_MODE,
        "onnx_opt": {"disable_onnx_optimization": False, "enable_onnxsim": False},
        "quant": {
            "input_configs": [{"tensor_name": input_name, "calibration_dataset": calib_tar,
                               "calibration_format": "Numpy", "calibration_size": -1}],
            "layer_configs": layers,
            "calibration_method": CALIBRATION_METHODS[calibrate_method],
            "precision_analysis": True,
            "precision_analysis_method": "EndToEnd",
            "enable_smooth_quant": False,
        },
        "compiler": {"check": 0},
    }
