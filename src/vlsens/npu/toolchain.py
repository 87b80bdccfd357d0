"""The toolchain job: a fixed-size graph's profile turned into the files NPU toolchains take.

``results/<model>/toolchain/<graph>/<variant>/``:

* ``pulsar2.json``: ``pulsar2 build`` on the whole graph (:mod:`vlsens.npu.pulsar2`) with the
  graph's ``calib.tar``;
* ``qdq.onnx`` and ``pulsar2_qdq.json``: the profile's QDQ model as one protobuf, and ``pulsar2
  build`` on it (``model_type: QuantONNX``): Pulsar2 then compiles the weight codes and activation
  scales the profile measured rather than rounding the float graph itself; skipped, with why, where
  the model does not fit one protobuf;
* ``parts/part<j>.pulsar2.json``: the same per single-file part (``vision.parts``), each with the
  part's own ``calib.tar`` and the layer configs of the nodes the part holds;
* ``qnn_overrides.json``: ORT's ``TensorQuantOverrides`` of the profile's QDQ model (the 16-bit
  tensors), the ``init_overrides`` of ORT's QNN recipe (:mod:`vlsens.npu.qnn`);
* ``toolchain.json``: the record: every file above, the profile's counts, the QDQ model (the
  profile's ``model.onnx``: uint8 / uint16 activations per tensor) with its measured error and the
  engine's estimate, and what was run against what was only checked against documentation.

Paths inside the configs are relative to ``results/<model>/``: run ``pulsar2 build`` there.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from vlsens.core.errors import VlsensError
from vlsens.core.fsutil import atomic_dir, write_json
from vlsens.npu import pulsar2, qnn

RECORD = "toolchain.json"
#: The profile's QDQ model as one protobuf, Pulsar2's ``QuantONNX`` input; and its config.
QDQ, QDQ_CONFIG = "qdq.onnx", "pulsar2_qdq.json"
#: What each file was checked against (the record's ``checked``).
CHECKED = {
    "pulsar2": "the documented BuildConfig schema (workflow/schemas/records/pulsar2.schema.yaml); "
               "Pulsar2 itself was not run",
    "pulsar2_qdq": "qdq.onnx read back equals the profile's QDQ model (graph and every initializer); its config "
                   "against the same schema, model_type QuantONNX as the docs' Quantized ONNX import states it; "
                   "Pulsar2 itself was not run",
    "qnn": "the QDQ model ran on ONNX Runtime's CPU provider (fake quantization) and equals the engine's "
           "estimate (eval.json); the QNN execution provider itself was not run",
}


def _rel(path: str | Path, root: Path) -> str:
    return Path(path).resolve().relative_to(root.resolve()).as_posix()


def _input_name(model: str | Path) -> str:
    import onnx

    return onnx.load(str(model), load_external_data=False).graph.input[0].name


def _node_names(model: str | Path) -> set[str]:
    import onnx

    return {n.name for n in onnx.load(str(model), load_external_data=False).graph.node}


def _part_configs(parts_dir: Path, parts_calib: Path, ops: dict, wide_type: str, method: str, root: Path,
                  out: Path, label: str) -> list[dict]:
    from vlsens.npu.build import load_record, verify_parts

    files = verify_parts(parts_dir)
    record = load_record(parts_dir)
    entries = []
    (out / "parts").mkdir(exist_ok=True)
    for j, (f, part) in enumerate(zip(files, record["parts"])):
        tar = parts_calib / f"part{j}" / "calib.tar"
        if not tar.is_file():
            raise VlsensError(f"{tar}: part {j}'s calibration archive is missing (vision.parts.calibration)")
        layers = pulsar2.layer_configs(ops, wide_type, _node_names(f))
        cfg = pulsar2.build_config(_rel(f, root), _rel(tar, root), part["inputs"][0]["name"],
                                   f"{label}/part{j}", layers, method)
        name = f"parts/part{j}.pulsar2.json"
        write_json(out / name, cfg)
        entries.append({"config": name, "input": cfg["input"], "calibration": cfg["quant"]["input_configs"][0]
                        ["calibration_dataset"], **_counts(layers)})
    return entries


def _single_qdq(qdq: Path, out: Path) -> str | None:
    """``out/qdq.onnx``: the QDQ model ``qdq`` (with its external data) as one protobuf, checked by
    reading it back; None where it does not fit one (the reason is the caller's to record)."""
    import onnx

    from vlsens.npu.cut import PROTOBUF_LIMIT

    model = onnx.load(str(qdq))
    if model.ByteSize() >= PROTOBUF_LIMIT:
        return None
    data = model.SerializeToString()
    del model
    (out / QDQ).write_bytes(data)
    if (out / QDQ).read_bytes() != data:
        raise VlsensError(f"{out / QDQ}: read back, it is not the profile's QDQ model {qdq}; nothing was written")
    return QDQ


def _quantized_config(qdq: Path, tmp: Path, where: str, label: str, calib: str, layers: list[dict],
                      method: str) -> dict:
    """``pulsar2_qdq.json`` (``model_type: QuantONNX``) on ``qdq.onnx``, written into ``tmp`` (the
    staged folder that becomes ``where``, relative to the run's root); the record's entry (or why not)."""
    if _single_qdq(qdq, tmp) is None:
        return {"skipped": f"{qdq.name} does not fit one protobuf (2 GiB), which Pulsar2's QuantONNX import reads; "
                           "pulsar2.json (the float graph) and its parts remain"}
    cfg = pulsar2.build_config(f"{where}/{QDQ}", calib, _input_name(qdq), f"{label}-qdq", layers, method,
                               quantized=True)
    write_json(tmp / QDQ_CONFIG, cfg)
    return {"config": QDQ_CONFIG, "input": cfg["input"], "hardware": list(pulsar2.QUANT_ONNX_HARDWARE),
            "weights": "the profile's QDQ model: its weight codes (weight_rounding) and activation scales"}


def _counts(layers: list[dict]) -> dict:
    n = {c["data_type"]: len(c["layer_names"]) for c in layers}
    return {"wide_layers": sum(v for k, v in n.items() if k in ("U16", "S16")), "fp32_layers": n.get("FP32", 0)}


def _rounding_note(settings: dict) -> dict:
    """How the profile's INT8 weights were rounded, and what that means for each toolchain."""
    method = settings.get("weight_rounding", "rtn")
    if method == "rtn":
        return {"method": method, "note": "round to nearest on ONNX Runtime's per-channel grid: what the QDQ model "
                                          "holds (pulsar2_qdq.json compiles it), and the closest model of a "
                                          "toolchain that rounds the float graph (pulsar2.json)"}
    return {"method": method,
            "note": "GPTQ codes on ONNX Runtime's per-channel grid (vlsens.quantize.rounding): the QDQ model holds them, "
                    "so its measured error is the profile's, and pulsar2_qdq.json (QuantONNX) compiles them; on the "
                    "float graph (pulsar2.json) pulsar2 build rounds the weights itself, so its U16 layers were "
                    "chosen for weights that build does not make (it may need more)"}


def smooth_bought(smoothed: dict, unsmoothed: dict) -> dict:
    """What the ``fp32-smooth`` variant's profile bought against the FP32 profile of the same graph
    (both eval.json): ops and weights that left W8A16 and float for W8A8."""
    def counts(e):
        return {"a16_ops": e.get("a16_ops", 0), "float_ops": e.get("float_ops", e["quantizable_ops"] - e["int8_ops"]),
                "a8_weight_share": e.get("a8_weight_share", e["int8_weight_share"]),
                "int8_weight_share": e["int8_weight_share"], "measured": e["measured"]}
    before, after = counts(unsmoothed), counts(smoothed)
    return {"fp32": before, "fp32-smooth": after,
            "a16_ops_returned_to_a8": before["a16_ops"] - after["a16_ops"],
            "float_ops_returned_to_8bit": before["float_ops"] - after["float_ops"],
            "a8_weight_share_gained": after["a8_weight_share"] - before["a8_weight_share"]}


def write_toolchain(profile_dir: str | Path, graph_model: str | Path, calib_tar: str | Path, out_dir: str | Path,
                    root: str | Path, parts_dir: str | Path | None = None, parts_calib: str | Path | None = None,
                    unsmoothed: str | Path | None = None) -> dict:
    """Write the module's folder for one profile into ``out_dir`` (staged; published whole).
    ``root``: ``results/<model>/``, what the configs' paths are relative to; ``unsmoothed``: for an
    ``fp32-smooth`` profile, the FP32 profile's eval.json (the record's ``smooth``: what it bought)."""
    profile_dir, root = Path(profile_dir), Path(root)
    profile = yaml.safe_load((profile_dir / "profile.yaml").read_text())
    evaluation = json.loads((profile_dir / "eval.json").read_text())
    settings = evaluation["settings"]
    wide_type = settings.get("activation_wide") or ""
    ops, method = profile["ops"], settings["calibrate_method"]
    qdq = profile_dir / "model.onnx"
    # compiled models go to axmodel/<graph>/<variant>[/part<j>] under results/<model>/
    label = "axmodel/" + Path(out_dir).resolve().relative_to(root.resolve() / "toolchain").as_posix()
    with atomic_dir(out_dir) as tmp:
        layers = pulsar2.layer_configs(ops, wide_type)
        cfg = pulsar2.build_config(_rel(graph_model, root), _rel(calib_tar, root), _input_name(graph_model),
                                   label, layers, method)
        write_json(tmp / "pulsar2.json", cfg)
        quantized = _quantized_config(qdq, tmp, _rel(out_dir, root), label, _rel(calib_tar, root), layers, method)
        parts = (_part_configs(Path(parts_dir), Path(parts_calib), ops, wide_type, method, root, tmp, label)
                 if parts_dir is not None else [])
        over = qnn.overrides(qdq, wide_type) if wide_type else {}
        write_json(tmp / "qnn_overrides.json", over)
        precisions = [o["precision"] for o in ops.values()]
        record = {
            "target": settings["target"],
            "status": evaluation["status"],
            "activations": {"a8": settings["activation_type"], "a16": wide_type},
            "ops": {"int8": precisions.count("int8"), "int8-a16": precisions.count("int8-a16"),
                    "float": len(precisions) - precisions.count("int8") - precisions.count("int8-a16")},
            "int8_weight_share": evaluation["int8_weight_share"],
            "pulsar2": [{"config": "pulsar2.json", "input": cfg["input"],
                         "calibration": cfg["quant"]["input_configs"][0]["calibration_dataset"], **_counts(layers)},
                        *parts],
            "pulsar2_qdq": quantized,
            "qnn": {"model": _rel(qdq, root), "overrides": "qnn_overrides.json", "a16_tensors": len(over),
                    "opset": qnn.opset(qdq), "measured": evaluation["measured"], "estimate": evaluation["estimate"],
                    "session": evaluation["session"]},
            "checked": CHECKED,
            "weight_rounding": _rounding_note(settings),
        }
        if unsmoothed is not None:
            record["smooth"] = smooth_bought(evaluation, json.loads(Path(unsmoothed).read_text()))
        write_json(tmp / RECORD, record)
    return record
