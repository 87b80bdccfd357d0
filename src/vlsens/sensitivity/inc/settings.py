"""The INC release this engine is written against, the settings it can honour, and its config.

Pure module (no INC import at module level): the main environment checks settings with it when
the DAG is built.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys

import numpy as np

from vlsens.core.errors import VlsensError

log = logging.getLogger(__name__)

#: The releases this engine is written against; anything else is refused (see module doc).
INC_VERSION = "3.7.1"
ONNX_MAX = (1, 18)

#: Private adaptor methods we wrap, with the parameter names we rely on.
PRIVATE_API = {
    "_get_mse_order": ("self", "fp32_model", "tune_cfg", "replace_cfgs", "ops_lst", "dataloader",
                       "output_op_names", "confidence_batches"),
    "_calculate_mse": ("self", "fp32_output", "q_output"),
    "_inference_model_on_batches": ("self", "model", "tune_cfg", "dataloader", "output_op_name", "iterations"),
    "calculate_op_sensitivity": ("self", "model", "dataloader", "tune_cfg", "output_op_names",
                                 "confidence_batches", "fallback", "requantize_cfgs"),
}

#: Our calibration methods in INC's words (INC's ONNX adaptor has no "entropy"; "kl" is it).
CALIBRATE_METHODS = {"minmax": "minmax", "entropy": "kl", "percentile": "percentile"}
#: INC's ONNX Runtime adaptor quantizes activations as uint8 (asym) and weights as int8 (sym) only.
ACTIVATION_TYPES = ("uint8",)
WEIGHT_TYPES = ("int8",)

SETUP_HINT = ("create it with `make inc-env` (a virtualenv at .venv-inc) or from envs/inc.yaml, and point "
              "sensitivity.inc.python at its interpreter")


class IncEnvironmentError(VlsensError):
    """The interpreter running the ``inc`` engine lacks neural-compressor or has another version."""


def check_settings(settings) -> list[str]:
    """Problems of :class:`~vlsens.quantize.qdq.QuantSettings` for INC (empty list: fine)."""
    problems = []
    if settings.activation_type not in ACTIVATION_TYPES:
        problems.append(f"sensitivity.activation_type: '{settings.activation_type}' is not supported by engine inc "
                        f"(INC's ONNX Runtime adaptor: {', '.join(ACTIVATION_TYPES)})")
    if settings.weight_type not in WEIGHT_TYPES:
        problems.append(f"sensitivity.weight_type: '{settings.weight_type}' is not supported by engine inc "
                        f"(INC's ONNX Runtime adaptor: {', '.join(WEIGHT_TYPES)})")
    if settings.calibrate_method not in CALIBRATE_METHODS:
        problems.append(f"sensitivity.calibrate_method: '{settings.calibrate_method}' has no INC equivalent "
                        f"({', '.join(CALIBRATE_METHODS)})")
    if getattr(settings, "weight_rounding", "rtn") != "rtn":
        problems.append(f"quant.weight_rounding: '{settings.weight_rounding}' writes GPTQ codes into ONNX Runtime's QDQ "
                        "models (auto resolves to gptq on quant.target npu and qnn); engine inc quantizes through INC, "
                        "which rounds to nearest (use engine ort, or quant.weight_rounding: rtn)")
    return problems


def check_environment() -> dict:
    """Versions of this interpreter's INC stack; raises :class:`IncEnvironmentError` when it is not
    the pinned one or when a private method we wrap is gone or has other parameters."""
    from importlib import metadata

    try:
        inc_version = metadata.version("neural-compressor")
    except metadata.PackageNotFoundError:
        raise IncEnvironmentError(
            f"engine inc: neural-compressor is not installed for {sys.executable}. The INC engine needs its own "
            f"environment (neural-compressor=={INC_VERSION}, onnx<=1.18, numpy<2, six): {SETUP_HINT}."
        ) from None
    if inc_version != INC_VERSION:
        raise IncEnvironmentError(
            f"engine inc: neural-compressor {inc_version} found for {sys.executable}, but vlsens relies on "
            f"{INC_VERSION} (the last release with the ONNX Runtime adaptor and mse_v2): {SETUP_HINT}."
        )
    onnx_version = metadata.version("onnx")
    if tuple(int(p) for p in onnx_version.split(".")[:2]) > ONNX_MAX:
        raise IncEnvironmentError(
            f"engine inc: onnx {onnx_version} found for {sys.executable}; neural-compressor {INC_VERSION} needs "
            f"onnx <= {'.'.join(map(str, ONNX_MAX))} (it uses onnx.mapping): {SETUP_HINT}."
        )
    try:
        adaptor = importlib.import_module("neural_compressor.adaptor.onnxrt").ONNXRUNTIMEAdaptor
    except Exception as e:  # noqa: BLE001  (e.g. the undeclared `six`)
        raise IncEnvironmentError(f"engine inc: importing INC's ONNX Runtime adaptor failed ({e!r}): {SETUP_HINT}.") \
            from e
    check_private_api(adaptor)
    import onnxruntime

    return {"neural-compressor": inc_version, "onnx": onnx_version, "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__, "python": sys.executable}


def check_private_api(adaptor_cls) -> None:
    for name, params in PRIVATE_API.items():
        fn = getattr(adaptor_cls, name, None)
        if fn is None:
            raise IncEnvironmentError(
                f"engine inc: {adaptor_cls.__name__}.{name} is gone; the per-op MSE of mse_v2 is read from it. "
                f"Use neural-compressor=={INC_VERSION}.")
        got = tuple(inspect.signature(fn).parameters)
        if got != params:
            raise IncEnvironmentError(
                f"engine inc: {adaptor_cls.__name__}.{name} has parameters {got}, expected {params}. "
                f"Use neural-compressor=={INC_VERSION}.")


def inc_config(model, settings, n_calib: int, confidence: int, max_trials: int, tolerable_loss: float):
    """``PostTrainingQuantConfig`` for mse_v2 with our op types and settings; every other op type of
    the graph is pinned to FP32 so both engines score the same kind of ops."""
    from neural_compressor import PostTrainingQuantConfig
    from neural_compressor.config import AccuracyCriterion, TuningCriterion

    keep = set(settings.op_types) | ({"MatMul"} if "Gemm" in settings.op_types else set())
    fp32 = {"activation": {"dtype": ["fp32"]}, "weight": {"dtype": ["fp32"]}}
    op_type_dict = {t: fp32 for t in sorted({n.op_type for n in model.graph.node} - keep)}
    algo = CALIBRATE_METHODS[settings.calibrate_method]
    for t in sorted(keep):
        op_type_dict[t] = {
            "activation": {"dtype": [settings.activation_type], "algorithm": [algo]},
            "weight": {"dtype": [settings.weight_type],
                       "granularity": ["per_channel", "per_tensor"] if settings.per_channel else ["per_tensor"]},
        }
    if "Gemm" in settings.op_types and "MatMul" not in settings.op_types:
        log.warning("INC turns Gemm into MatMul+Add before quantizing: MatMul ops are scored too")
    return PostTrainingQuantConfig(
        approach="static", quant_format="QDQ", quant_level=1, calibration_sampling_size=[n_calib],
        reduce_range=bool(getattr(settings, "reduce_range", False)),
        op_type_dict=op_type_dict,
        tuning_criterion=TuningCriterion(strategy="mse_v2", max_trials=max_trials,
                                         strategy_kwargs={"confidence_batches": confidence}),
        accuracy_criterion=AccuracyCriterion(higher_is_better=True, criterion="absolute",
                                             tolerable_loss=tolerable_loss),
    )
