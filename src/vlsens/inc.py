"""Engine ``inc``: Intel Neural Compressor's ``mse_v2`` op sensitivity, next to engine ``ort``.

This module runs in INC's own environment (``envs/inc.yaml`` or the ``.venv-inc`` virtualenv the
Makefile creates): neural-compressor 3.7.1 is the last release with the ONNX Runtime adaptor and
``mse_v2``, and it needs onnx <= 1.18 and numpy < 2, which the main environment cannot have. Only
numpy, onnx and the standard library are imported at module level, plus vlsens modules that need
nothing else, so the helpers (:func:`map_names`, :func:`check_environment`) can also be imported
and tested from the main environment.

How the numbers are obtained. INC has no public per-op API: ``mse_v2`` ranks ops with its ONNX
Runtime adaptor's ``_get_mse_order``: for every INT8 op k, re-quantize the model with op k back in
FP32 (every other op INT8, re-calibrated, as INC does it) and take the MSE of the final outputs
against the FP32 model. A *low* MSE therefore means op k matters: putting it back in float removes
much of the error. We run INC's own tuning (``quantization.fit`` with ``quant_format="QDQ"``,
``quant_level=1`` -- ``"auto"`` silently replaces mse_v2 -- and strategy ``mse_v2``) and capture,
by wrapping three private adaptor methods (pinned in :data:`PRIVATE_API` and checked by
:func:`check_environment`, so an upgrade that removes them fails loudly):

* ``_get_mse_order``: the op list and INC's MSE per op (the first call is the fallback stage over
  every INT8 op); sensitivity mode stops the tuning right after it;
* ``_calculate_mse``: the float and quantized outputs behind each MSE, from which cosine and SQNR
  are computed with the same function the ``ort`` engine uses;
* ``_inference_model_on_batches``: redirected to the *evaluation* set, so ``inc`` scores ops on
  the same images as ``ort`` (INC calibrates on the calibration set, as ``ort`` does).

INC renames nodes (``Gemm`` -> ``<name>_MatMul`` + ``<name>_Add``; ORT fusions): :func:`map_names`
maps every scored op back to the exported graph's node names (by name, then by weight, then by
output tensor, then by name prefix); ops it cannot map are kept under INC's name and listed.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from vlsens.errors import VlsensError

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
    """Problems of :class:`~vlsens.quant.QuantSettings` for INC (empty list: fine)."""
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


# ----------------------------------------------------------------------------------------------
# Name mapping (pure; tested without INC)


@dataclass(frozen=True)
class Node:
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @classmethod
    def of(cls, node) -> "Node":
        return cls(node.name, node.op_type, tuple(node.input), tuple(node.output))


def map_names(inc_ops: Sequence[str], inc_nodes: Sequence[Node], exported: Sequence[Node],
              initializers: set[str], wanted: Sequence[str] | None = None) -> tuple[dict[str, tuple[str, str]], dict]:
    """Map INC's op names back to the exported graph.

    ``inc_ops``: names INC scored; ``inc_nodes``: INC's (pre-optimized) graph; ``exported``: the
    exported graph's nodes; ``initializers``: the exported graph's initializer names; ``wanted``:
    the exported nodes that may be targets (default: all). Returns ``(mapping, unmapped)`` with
    ``mapping[inc_name] = (exported_name, how)``, ``how`` in ``name | weight | output | prefix``,
    and ``unmapped[inc_name] = reason``. Two INC ops never map to the same exported node.
    """
    by_name = {n.name: n for n in inc_nodes}
    targets = [n for n in exported if wanted is None or n.name in set(wanted)]
    target_names = {n.name for n in targets}
    weight_owner: dict[str, list[str]] = {}
    output_owner: dict[str, str] = {}
    for n in targets:
        for i in n.inputs[1:]:
            if i in initializers:
                weight_owner.setdefault(i, []).append(n.name)
        for o in n.outputs:
            output_owner[o] = n.name

    def candidates(name: str) -> tuple[str | None, str]:
        if name in target_names:
            return name, "name"
        node = by_name.get(name)
        if node is None:
            return None, "not in INC's graph"
        owners = {o for i in node.inputs if i in weight_owner for o in weight_owner[i]}
        if len(owners) == 1:
            return owners.pop(), "weight"
        if len(owners) > 1:
            return None, f"weight shared by {sorted(owners)}"
        for o in node.outputs:
            for cand in (o, o.rsplit("_", 1)[0]):  # INC's Gemm split renames the output "<out>_MatMul"
                if cand in output_owner:
                    return output_owner[cand], "output"
        pref = [t for t in target_names if name.startswith(t + "_")]
        if pref:  # the longest one: ".../MatMul_1_x" is MatMul_1's, not MatMul's
            return max(pref, key=len), "prefix"
        return None, "no exported node with its name, weight or output"

    mapping: dict[str, tuple[str, str]] = {}
    unmapped: dict[str, str] = {}
    claimed: dict[str, str] = {}
    for name in inc_ops:
        target, how = candidates(name)
        if target is None:
            unmapped[name] = how
        elif target in claimed:
            unmapped[name] = f"{target} already mapped from {claimed[target]}"
        else:
            claimed[target] = name
            mapping[name] = (target, how)
    return mapping, unmapped


# ----------------------------------------------------------------------------------------------
# Running INC


class Loader:
    """INC dataloader: (batch, label) pairs in the graph's batch size."""

    def __init__(self, data: np.ndarray, batch: int = 1):
        self.data, self.batch_size = data, batch

    def __iter__(self):
        n = len(self.data) - len(self.data) % self.batch_size
        for i in range(0, n, self.batch_size):
            yield self.data[i:i + self.batch_size], 0

    def __len__(self):
        return len(self.data) // self.batch_size


class _Stop(BaseException):
    """Raised inside INC once the per-op scores are captured (sensitivity mode). A BaseException:
    ``quantization.fit`` swallows every ``Exception`` (and KeyboardInterrupt) and only logs it."""


class _ErrorCatcher(logging.Handler):
    """Collects the errors ``quantization.fit`` logs instead of raising (it swallows exceptions)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "Unexpected exception" in msg:
            self.messages.append(msg)


@contextmanager
def _inc_errors() -> Iterator[_ErrorCatcher]:
    catcher = _ErrorCatcher()
    logger = logging.getLogger("neural_compressor")
    logger.addHandler(catcher)
    try:
        yield catcher
    finally:
        logger.removeHandler(catcher)


@contextmanager
def _patched(cls, name: str, wrapper) -> Iterator[None]:
    original = getattr(cls, name)
    setattr(cls, name, wrapper(original))
    try:
        yield
    finally:
        setattr(cls, name, original)


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
        op_type_dict=op_type_dict,
        tuning_criterion=TuningCriterion(strategy="mse_v2", max_trials=max_trials,
                                         strategy_kwargs={"confidence_batches": confidence}),
        accuracy_criterion=AccuracyCriterion(higher_is_better=True, criterion="absolute",
                                             tolerable_loss=tolerable_loss),
    )


def graph_batch(model) -> int:
    from vlsens.samples import graph_input

    return graph_input(model)[1]


def run_sensitivity(model_path: str | Path, calib: np.ndarray, evals: np.ndarray, settings,
                    max_ops: int | None = None, workspace: str | Path | None = None) -> tuple[list[dict], dict]:
    """Per-op rows (ranked, ``ort.csv`` schema) and a summary dict, from one INC mse_v2 run."""
    versions = check_environment()
    problems = check_settings(settings)
    if problems:
        raise VlsensError("; ".join(problems))
    import onnx
    from neural_compressor import quantization
    from neural_compressor.adaptor.onnxrt import ONNXRUNTIMEAdaptor

    from vlsens.quant import output_metrics, quantizable_ops
    model = onnx.load(str(model_path), load_external_data=True)
    batch = graph_batch(model)
    exported = [Node.of(n) for n in model.graph.node]
    ops = {o.name: o for o in quantizable_ops(model, settings.op_types)}
    n_eval = len(evals) // batch
    cap: dict = {"calls": 0, "metrics": [], "inference_end": []}

    def wrap_mse_order(orig):
        def f(self, fp32_model, tune_cfg, replace_cfgs, ops_lst, dataloader, output_op_names, confidence_batches):
            cap["calls"] += 1
            if cap["calls"] > 1:  # later fallback rounds of a tuning run: not ours to record
                return orig(self, fp32_model, tune_cfg, replace_cfgs, ops_lst, dataloader, output_op_names,
                            confidence_batches)
            cap["all_ops"] = [tuple(o) for o in ops_lst]
            chosen = list(ops_lst)[:max_ops] if max_ops else list(ops_lst)
            cap["inc_nodes"] = [Node.of(n) for n in fp32_model.model.graph.node]
            cap["inc_inits"] = {i.name: int(np.prod(i.dims)) for i in fp32_model.model.graph.initializer}
            cap["t0"] = time.perf_counter()
            cap["result"] = orig(self, fp32_model, tune_cfg, replace_cfgs, chosen, dataloader, output_op_names,
                                 confidence_batches)
            cap["t1"] = time.perf_counter()
            cap["ops"] = [tuple(o) for o in chosen]
            raise _Stop

        return f

    def wrap_calc(orig):
        def f(self, fp32_output, q_output):
            value = orig(self, fp32_output, q_output)
            ref = np.concatenate([np.asarray(a).ravel() for a in fp32_output])
            out = np.concatenate([np.asarray(a).ravel() for a in q_output])
            cap["metrics"].append((float(value), output_metrics(out, ref)))
            return value

        return f

    def wrap_inference(orig):
        def f(self, model, tune_cfg, dataloader, output_op_name, iterations):
            out = orig(self, model, tune_cfg, Loader(evals, batch), output_op_name, n_eval)
            cap["inference_end"].append(time.perf_counter())
            return out

        return f

    evaluations = []

    def eval_func(_model):  # sensitivity mode: the FP32 baseline passes, every INT8 trial "misses",
        evaluations.append(1)  # so mse_v2 goes on to its per-op fallback stage (what we capture)
        return 1.0 if len(evaluations) == 1 else 0.0

    conf = inc_config(model, settings, len(calib) // batch, n_eval, max_trials=100, tolerable_loss=0.5)
    t_start = time.perf_counter()
    with _workspace(workspace), _inc_errors() as errors, \
            _patched(ONNXRUNTIMEAdaptor, "_get_mse_order", wrap_mse_order), \
            _patched(ONNXRUNTIMEAdaptor, "_calculate_mse", wrap_calc), \
            _patched(ONNXRUNTIMEAdaptor, "_inference_model_on_batches", wrap_inference):
        try:
            quantization.fit(model, conf, calib_dataloader=Loader(calib, batch), eval_func=eval_func)
        except _Stop:
            pass
    t_end = time.perf_counter()
    if "result" not in cap:
        raise VlsensError(
            "engine inc: INC's mse_v2 never reached its per-op fallback stage (no _get_mse_order call)"
            + (f"; INC failed with: {errors.messages[0]}" if errors.messages else "; see INC's log above"))
    inc_names = [name for name, _ in cap["ops"]]
    if len(cap["metrics"]) != len(inc_names):
        raise VlsensError(f"engine inc: captured {len(cap['metrics'])} output comparisons for {len(inc_names)} ops")
    inits = {i.name for i in model.graph.initializer}
    mapping, unmapped = map_names(inc_names, cap["inc_nodes"], exported, inits, wanted=list(ops))
    inc_by_name = {n.name: n for n in cap["inc_nodes"]}
    graph_order = {n.name: i for i, n in enumerate(exported)}
    rows, max_dev = [], 0.0
    for k, ((name, inc_type), (inc_mse, metrics)) in enumerate(zip(cap["ops"], cap["metrics"])):
        mse = float(cap["result"][(name, inc_type)])
        max_dev = max(max_dev, abs(mse - inc_mse) / max(abs(mse), 1e-30))
        max_dev = max(max_dev, abs(metrics["mse"] - mse) / max(abs(mse), 1e-30))
        if name in mapping:
            row = ops[mapping[name][0]].as_row()
            order = graph_order[mapping[name][0]]
        else:
            from vlsens.quant import parse_op_name

            block, role = parse_op_name(name, inc_type)
            node = inc_by_name.get(name)
            row = {"op": name, "op_type": inc_type, "block": "" if block is None else block, "role": role,
                   "weight_params": sum(cap["inc_inits"].get(i, 0) for i in node.inputs[1:]) if node else 0}
            order = len(graph_order) + k
        rows.append({**row, "mse": mse, "cosine": metrics["cosine"], "sqnr_db": metrics["sqnr_db"], "_order": order})
    # Rank 1 = most sensitive = the *lowest* MSE with the op back in float (INC's own order:
    # mse_v2 falls back ops_lst[0] first); ties keep graph order.
    ranked = []
    for rank, r in enumerate(sorted(rows, key=lambda r: (r["mse"], r["_order"])), 1):
        ranked.append({"rank": rank, **{k: v for k, v in r.items() if k != "_order"}})
    per_op = (cap["t1"] - _first_after(cap["inference_end"], cap["t0"])) / max(len(inc_names), 1)
    total_ops = len(cap["all_ops"])
    scored_exported = {m[0] for m in mapping.values()}
    summary = {
        "engine": "inc",
        "measure": "final-output error with op k back in FP32 and every other op INT8 (INC mse_v2); "
                   "rank 1 = lowest mse = the op whose fallback helps most",
        "ops": len(ranked),
        "ops_total": total_ops,
        "bounded": bool(max_ops) and len(inc_names) < total_ops,
        "seconds_per_op": per_op,
        "seconds_per_op_note": "quantize (INC re-calibrates) + evaluation-set inference + MSE, per scored op",
        "extrapolated_seconds_all_ops": per_op * total_ops,
        "seconds_total": t_end - t_start,
        "eval_images": int(len(evals)),
        "calib_images": int(len(calib)),
        "settings": settings.as_dict() | {"inc_calibrate_method": CALIBRATE_METHODS[settings.calibrate_method]},
        "versions": versions,
        "mapping": {k: {"onnx_name": v[0], "by": v[1]} for k, v in mapping.items()},
        "unmapped": unmapped,
        "not_scored": sorted(set(ops) - scored_exported) if not (max_ops and len(inc_names) < total_ops) else [],
        "mse_max_rel_deviation": max_dev,
        "most_sensitive": [r["op"] for r in ranked[:5]],
    }
    for name, why in unmapped.items():
        log.warning("INC op %s is not mapped to the exported graph (%s); kept under INC's name", name, why)
    return ranked, summary


def _first_after(times: list[float], t0: float) -> float:
    """End of the float reference pass: the first inference that finished after ``t0``."""
    return next((t for t in times if t >= t0), t0)


@contextmanager
def _workspace(path: str | Path | None) -> Iterator[None]:
    """INC writes into ``./nc_workspace`` unless told otherwise: keep it inside the job's folder."""
    if path is None:
        yield
        return
    from neural_compressor.config import options

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    before = options.workspace
    options.workspace = str(path) + "/"
    try:
        yield
    finally:
        options.workspace = before


def sensitivity_stage(model_path: str | Path, calib_npz: str | Path, eval_npz: str | Path, out_csv: str | Path,
                      out_json: str | Path, settings, max_ops: int | None = None) -> dict:
    """The ``sensitivity_inc`` rule: ``inc.csv`` (``ort.csv`` schema) + ``inc.json``."""
    from vlsens.calibration import load_split
    from vlsens.fsutil import file_sha256, staging_dir, write_json
    from vlsens.sensitivity import write_csv

    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(out_csv) as work:
        rows, summary = run_sensitivity(model_path, load_split(calib_npz), load_split(eval_npz), settings,
                                        max_ops=max_ops, workspace=work)
    summary["eval_sha256"] = file_sha256(eval_npz)
    summary["base_model"] = str(model_path)
    write_csv(rows, out_csv)
    write_json(out_json, summary)
    log.info("inc: %d ops, %.3f s/op, most sensitive: %s", summary["ops"], summary["seconds_per_op"],
             summary["most_sensitive"][:3])
    return summary


# ----------------------------------------------------------------------------------------------
# INC's own fallback run (optional): mse_v2 tuning to the profile's target


#: The profile metric as INC's "higher is better" accuracy; sqnr is capped so the FP32 baseline
#: (infinite SQNR) stays a number.
SQNR_CAP_DB = 200.0


def inc_score(metrics: dict, metric: str) -> float:
    if metric == "cosine":
        return float(metrics["cosine"])
    if metric == "mse":
        return -float(metrics["mse"])
    if metric == "sqnr_db":
        return min(float(metrics["sqnr_db"]), SQNR_CAP_DB)
    raise ValueError(f"profile.metric: '{metric}' unknown (cosine, mse, sqnr_db)")


def tolerable_loss(metric: str, target: float) -> float:
    """INC's absolute tolerable loss that makes "meets the target" of the profile."""
    baseline = {"cosine": 1.0, "mse": 0.0, "sqnr_db": SQNR_CAP_DB}[metric]
    return baseline - inc_score({metric: target}, metric)


def _outputs(session, inputs: np.ndarray, batch: int) -> np.ndarray:
    name = session.get_inputs()[0].name
    n = len(inputs) - len(inputs) % batch
    return np.concatenate([session.run(None, {name: inputs[i:i + batch]})[0] for i in range(0, n, batch)])


def tune_stage(model_path: str | Path, calib_npz: str | Path, eval_npz: str | Path, out_dir: str | Path,
               settings, metric: str, target: float, max_trials: int) -> dict:
    """The ``sensitivity_inc_tune`` rule: INC's mse_v2 run to the profile's target; the model INC
    returns is saved and re-measured with a fresh ONNX Runtime session (``eval.json``)."""
    import onnx
    import onnxruntime as ort
    from neural_compressor import quantization
    from neural_compressor.adaptor.onnxrt import ONNXRUNTIMEAdaptor

    from vlsens.artifacts import file_entries
    from vlsens.calibration import load_split
    from vlsens.fsutil import file_sha256, publish, staging_dir, write_json
    from vlsens.onnxutil import save_with_external_data
    from vlsens.quant import output_metrics, quantizable_ops

    versions = check_environment()
    problems = check_settings(settings)
    if problems:
        raise VlsensError("; ".join(problems))
    calib, evals = load_split(calib_npz), load_split(eval_npz)
    model = onnx.load(str(model_path), load_external_data=True)
    batch = graph_batch(model)
    n_eval = len(evals) // batch
    ops = {o.name: o for o in quantizable_ops(model, settings.op_types)}
    exported = [Node.of(n) for n in model.graph.node]
    ref = _outputs(ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]), evals, batch)
    trials: list[dict] = []

    def eval_func(qmodel) -> float:
        # INC passes the ModelProto (or, for a model over 2 GB, a path)
        src = qmodel if isinstance(qmodel, (str, Path)) else qmodel.SerializeToString()
        sess = ort.InferenceSession(str(src) if isinstance(src, Path) else src, providers=["CPUExecutionProvider"])
        m = output_metrics(_outputs(sess, evals, batch), ref)
        trials.append(m)
        return inc_score(m, metric)

    def wrap_inference(orig):
        def f(self, model, tune_cfg, dataloader, output_op_name, iterations):
            return orig(self, model, tune_cfg, Loader(evals, batch), output_op_name, n_eval)

        return f

    conf = inc_config(model, settings, len(calib) // batch, n_eval, max_trials=max_trials,
                      tolerable_loss=tolerable_loss(metric, target))
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with staging_dir(out_dir / "eval.json") as work, _workspace(work), _inc_errors() as errors, \
            _patched(ONNXRUNTIMEAdaptor, "_inference_model_on_batches", wrap_inference):
        q_model = quantization.fit(model, conf, calib_dataloader=Loader(calib, batch), eval_func=eval_func)
    if errors.messages:  # not "no model found": INC itself failed
        raise VlsensError(f"engine inc: INC's tuning failed: {errors.messages[0]}")
    seconds = time.perf_counter() - t0
    record = {"engine": "inc", "strategy": "mse_v2", "metric": metric, "target": target,
              "max_trials": max_trials, "trials": len(trials) - 1, "seconds": seconds, "versions": versions,
              "settings": settings.as_dict(), "eval_sha256": file_sha256(eval_npz)}
    with staging_dir(out_dir / "eval.json") as stage:
        if q_model is None:
            record.update(status="unreachable", note="INC found no model that meets the target within "
                                                     f"{max_trials} trials (sensitivity.inc.max_trials)")
            write_json(stage / "eval.json", record)
            publish({out_dir / "eval.json": stage / "eval.json"})
            return record
        keep = set(settings.op_types) | ({"MatMul"} if "Gemm" in settings.op_types else set())
        cfg = {k: c for k, c in q_model.q_config["op"].items() if k[1] in keep}  # other types: pinned FP32
        int8 = [name for (name, _), c in cfg.items() if c["activation"]["dtype"] not in ("fp32", "fp16", "bf16")]
        fp32 = [name for (name, _), c in cfg.items() if c["activation"]["dtype"] == "fp32"]
        inc_nodes = [Node.of(n) for n in q_model.model.graph.node]
        inits = {i.name for i in model.graph.initializer}
        names = int8 + fp32
        mapping, unmapped = map_names(names, inc_nodes, exported, inits, wanted=list(ops))
        save_with_external_data(q_model.model, stage / "model.onnx")
        measured = output_metrics(_outputs(ort.InferenceSession(str(stage / "model.onnx"),
                                                                providers=["CPUExecutionProvider"]), evals, batch), ref)
        ok = inc_score(measured, metric) >= inc_score({metric: target}, metric)
        record.update(
            status="met" if ok else "missed", measured=measured,
            int8_ops=sorted(mapping[n][0] if n in mapping else n for n in int8),
            fp32_ops=sorted(mapping[n][0] if n in mapping else n for n in fp32),
            unmapped=unmapped, ops_total=len(ops),
            files=file_entries([stage / "model.onnx"]),
        )
        write_json(stage / "eval.json", record)
        # eval.json (the rule's declared output) last: the model is complete when it appears
        publish({out_dir / p: stage / p for p in ("model.onnx", "model.onnx.data", "eval.json")},
                last=out_dir / "eval.json")
    return record
