"""Engine ``inc``'s stages: the ``sensitivity_inc`` rule (``inc.csv`` + ``inc.json``) and the
``sensitivity_inc_tune`` rule (INC's own fallback run to the profile's target).

Runs in INC's own environment (:mod:`vlsens.sensitivity.inc`); imports only numpy, onnx and vlsens modules that
need nothing else at module level.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from vlsens.core.errors import VlsensError
from vlsens.core.fsutil import file_sha256, publish, staging_dir, write_json
from vlsens.core.metrics import output_metrics
from vlsens.core.onnxutil import input_batch
from vlsens.data.samples import load_stacked
from vlsens.quantize.qdq import parse_op_name, quantizable_ops
from vlsens.sensitivity.inc.capture import Loader, MseOrderCapture, Stop, inc_errors, redirected_inference, workspace
from vlsens.sensitivity.inc.names import Node, map_names
from vlsens.sensitivity.inc.settings import CALIBRATE_METHODS, check_environment, check_settings, inc_config
from vlsens.sensitivity.ranking import write_csv

log = logging.getLogger(__name__)


def _single_input(split_npz: str | Path) -> np.ndarray:
    """The one stacked input of a calibration split (INC feeds single-input graphs)."""
    arrays = load_stacked(split_npz)
    if len(arrays) != 1:
        raise VlsensError(f"engine inc: {split_npz} holds inputs {sorted(arrays)}; INC takes single-input graphs")
    return next(iter(arrays.values()))


def _inc_model(model, model_path: str | Path):
    """What INC is given: the loaded model, or its path above protobuf's 2 GB (INC detects the
    framework by opening an ONNX Runtime session on the serialized proto, which fails there)."""
    from vlsens.core.onnxutil import data_path

    size = Path(model_path).stat().st_size + (data_path(model_path).stat().st_size
                                              if data_path(model_path).is_file() else 0)
    return str(model_path) if size >= 2**31 else model


def _capture(model, model_path: str | Path, calib: np.ndarray, evals: np.ndarray, settings, batch: int,
             max_ops: int | None, workdir: str | Path | None) -> tuple[MseOrderCapture, float]:
    """INC's mse_v2 run, stopped at its per-op fallback stage with that stage's order and outputs
    captured (:class:`MseOrderCapture`): (the capture, seconds of the run)."""
    from neural_compressor import quantization
    from neural_compressor.adaptor.onnxrt import ONNXRUNTIMEAdaptor

    cap = MseOrderCapture(evals, batch, max_ops)
    evaluations = []

    def eval_func(_model):  # sensitivity mode: the FP32 baseline passes, every INT8 trial "misses",
        evaluations.append(1)  # so mse_v2 goes on to its per-op fallback stage (what we capture)
        return 1.0 if len(evaluations) == 1 else 0.0

    conf = inc_config(model, settings, len(calib) // batch, len(evals) // batch, max_trials=100, tolerable_loss=0.5)
    t_start = time.perf_counter()
    with workspace(workdir), inc_errors() as errors, cap.patched(ONNXRUNTIMEAdaptor):
        try:
            quantization.fit(_inc_model(model, model_path), conf, calib_dataloader=Loader(calib, batch),
                             eval_func=eval_func)
        except Stop:
            pass
    t_end = time.perf_counter()
    if not cap.complete:
        raise VlsensError(
            "engine inc: INC's mse_v2 never reached its per-op fallback stage (no _get_mse_order call)"
            + (f"; INC failed with: {errors.messages[0]}" if errors.messages else "; see INC's log above"))
    return cap, t_end - t_start


def _ranked_rows(cap: MseOrderCapture, mapping: dict, ops: dict, exported: list[Node]) -> tuple[list[dict], float]:
    """The captured ops as ``ort.csv`` rows, ranked, and the largest relative deviation between
    INC's MSE and ours. Rank 1 = most sensitive = the *lowest* MSE with the op back in float
    (INC's own order: mse_v2 falls back ops_lst[0] first); ties keep graph order."""
    inc_by_name = {n.name: n for n in cap.inc_nodes}
    graph_order = {n.name: i for i, n in enumerate(exported)}
    rows, max_dev = [], 0.0
    for k, ((name, inc_type), (inc_mse, metrics)) in enumerate(zip(cap.ops, cap.outputs)):
        mse = float(cap.mse[(name, inc_type)])
        max_dev = max(max_dev, abs(mse - inc_mse) / max(abs(mse), 1e-30))
        max_dev = max(max_dev, abs(metrics["mse"] - mse) / max(abs(mse), 1e-30))
        if name in mapping:
            row = ops[mapping[name][0]].as_row()
            order = graph_order[mapping[name][0]]
        else:
            block, role = parse_op_name(name, inc_type)
            node = inc_by_name.get(name)
            row = {"op": name, "op_type": inc_type, "block": "" if block is None else block, "role": role,
                   "weight_params": sum(cap.inc_inits.get(i, 0) for i in node.inputs[1:]) if node else 0}
            order = len(graph_order) + k
        rows.append({**row, "mse": mse, "cosine": metrics["cosine"], "sqnr_db": metrics["sqnr_db"], "_order": order})
    ranked = []
    for rank, r in enumerate(sorted(rows, key=lambda r: (r["mse"], r["_order"])), 1):
        ranked.append({"rank": rank, **{k: v for k, v in r.items() if k != "_order"}})
    return ranked, max_dev


def run_sensitivity(model_path: str | Path, calib: np.ndarray, evals: np.ndarray, settings,
                    max_ops: int | None = None, workdir: str | Path | None = None) -> tuple[list[dict], dict]:
    """Per-op rows (ranked, ``ort.csv`` schema) and a summary dict, from one INC mse_v2 run."""
    versions = check_environment()
    problems = check_settings(settings)
    if problems:
        raise VlsensError("; ".join(problems))
    import onnx

    model = onnx.load(str(model_path), load_external_data=True)
    _, batch = input_batch(model)
    batch = batch or 1
    exported = [Node.of(n) for n in model.graph.node]
    ops = {o.name: o for o in quantizable_ops(model, settings.op_types)}
    cap, seconds = _capture(model, model_path, calib, evals, settings, batch, max_ops, workdir)
    inc_names = [name for name, _ in cap.ops]
    if len(cap.outputs) != len(inc_names):
        raise VlsensError(f"engine inc: captured {len(cap.outputs)} output comparisons for {len(inc_names)} ops")
    inits = {i.name for i in model.graph.initializer}
    mapping, unmapped = map_names(inc_names, cap.inc_nodes, exported, inits, wanted=list(ops))
    ranked, max_dev = _ranked_rows(cap, mapping, ops, exported)
    per_op = cap.seconds_per_op()
    total_ops = len(cap.all_ops)
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
        "seconds_total": seconds,
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


def sensitivity_stage(model_path: str | Path, calib_npz: str | Path, eval_npz: str | Path, out_csv: str | Path,
                      out_json: str | Path, settings, max_ops: int | None = None) -> dict:
    """The ``sensitivity_inc`` rule: ``inc.csv`` (``ort.csv`` schema) + ``inc.json``."""
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(out_csv) as work:
        rows, summary = run_sensitivity(model_path, _single_input(calib_npz), _single_input(eval_npz), settings,
                                        max_ops=max_ops, workdir=work)
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


def _cpu_session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def _tuned_ops(q_model, model, exported: list[Node], ops: dict, settings) -> dict:
    """The record's ``int8_ops``, ``fp32_ops`` (exported names where INC's map back) and
    ``unmapped`` of the model INC's tuning returned."""
    keep = set(settings.op_types) | ({"MatMul"} if "Gemm" in settings.op_types else set())
    cfg = {k: c for k, c in q_model.q_config["op"].items() if k[1] in keep}  # other types: pinned FP32
    int8 = [name for (name, _), c in cfg.items() if c["activation"]["dtype"] not in ("fp32", "fp16", "bf16")]
    fp32 = [name for (name, _), c in cfg.items() if c["activation"]["dtype"] == "fp32"]
    inc_nodes = [Node.of(n) for n in q_model.model.graph.node]
    inits = {i.name for i in model.graph.initializer}
    names = int8 + fp32
    mapping, unmapped = map_names(names, inc_nodes, exported, inits, wanted=list(ops))
    return {"int8_ops": sorted(mapping[n][0] if n in mapping else n for n in int8),
            "fp32_ops": sorted(mapping[n][0] if n in mapping else n for n in fp32),
            "unmapped": unmapped}


def _tune(model, model_path: str | Path, conf, calib: np.ndarray, evals: np.ndarray, batch: int, eval_func,
          out_dir: Path):
    """INC's mse_v2 tuning run (its workspace in a staging folder of ``out_dir``): the model it
    returns, None when no model met the target."""
    from neural_compressor import quantization
    from neural_compressor.adaptor.onnxrt import ONNXRUNTIMEAdaptor

    with staging_dir(out_dir / "eval.json") as work, workspace(work), inc_errors() as errors, \
            redirected_inference(ONNXRUNTIMEAdaptor, evals, batch):
        q_model = quantization.fit(_inc_model(model, model_path), conf, calib_dataloader=Loader(calib, batch),
                                   eval_func=eval_func)
    if errors.messages:  # not "no model found": INC itself failed
        raise VlsensError(f"engine inc: INC's tuning failed: {errors.messages[0]}")
    return q_model


def tune_stage(model_path: str | Path, calib_npz: str | Path, eval_npz: str | Path, out_dir: str | Path,
               settings, metric: str, target: float, max_trials: int) -> dict:
    """The ``sensitivity_inc_tune`` rule: INC's mse_v2 run to the profile's target; the model INC
    returns is saved and re-measured with a fresh ONNX Runtime session (``eval.json``)."""
    import onnx

    from vlsens.core.artifacts import file_entries
    from vlsens.core.onnxutil import save_with_external_data

    versions = check_environment()
    problems = check_settings(settings)
    if problems:
        raise VlsensError("; ".join(problems))
    calib, evals = _single_input(calib_npz), _single_input(eval_npz)
    model = onnx.load(str(model_path), load_external_data=True)
    batch = input_batch(model)[1] or 1
    n_eval = len(evals) // batch
    ops = {o.name: o for o in quantizable_ops(model, settings.op_types)}
    exported = [Node.of(n) for n in model.graph.node]
    ref = _outputs(_cpu_session(str(model_path)), evals, batch)
    trials: list[dict] = []

    def eval_func(qmodel) -> float:
        # INC passes the ModelProto (or, for a model over 2 GB, a path)
        src = qmodel if isinstance(qmodel, (str, Path)) else qmodel.SerializeToString()
        m = output_metrics(_outputs(_cpu_session(str(src) if isinstance(src, Path) else src), evals, batch), ref)
        trials.append(m)
        return inc_score(m, metric)

    conf = inc_config(model, settings, len(calib) // batch, n_eval, max_trials=max_trials,
                      tolerable_loss=tolerable_loss(metric, target))
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    q_model = _tune(model, model_path, conf, calib, evals, batch, eval_func, out_dir)
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
        names = _tuned_ops(q_model, model, exported, ops, settings)
        save_with_external_data(q_model.model, stage / "model.onnx")
        measured = output_metrics(_outputs(_cpu_session(str(stage / "model.onnx")), evals, batch), ref)
        ok = inc_score(measured, metric) >= inc_score({metric: target}, metric)
        record.update(status="met" if ok else "missed", measured=measured, **names, ops_total=len(ops),
                      files=file_entries([stage / "model.onnx"]))
        write_json(stage / "eval.json", record)
        # eval.json (the rule's declared output) last: the model is complete when it appears
        publish({out_dir / p: stage / p for p in ("model.onnx", "model.onnx.data", "eval.json")},
                last=out_dir / "eval.json")
    return record
