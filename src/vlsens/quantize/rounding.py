"""Weight rounding of the QDQ models a run builds: ONNX Runtime's round to nearest, or GPTQ on
ONNX Runtime's own grid (``quant.weight_rounding``).

``quantize_static`` writes each quantized weight as integer codes on a grid it derives from the
weight alone (per output channel: a scale and a zero point; ``int8`` weights symmetric in
``-127 .. 127``), rounding each weight to the nearest code. GPTQ keeps that grid, scale and zero
point as ONNX Runtime computed them, and chooses the codes instead: one input row at a time, each
row's rounding error pushed onto the rows not yet rounded through the inverse Hessian ``X^T X`` of
the op's calibration inputs (:func:`vlsens.quantize.gptq.channel_codes`), so that the op's output
error ``||X (W_q - W)||`` is small rather than the weight's. At W8A16 the weights' rounding is most
of what is left (the Qwen2.5-VL-3B vision tower: 0.00075 of the all-W8A16 model's 0.00078 of
cosine; GPTQ on the same grid: 0.00021, docs/benchmarks/npu-weights-3b.md).

A weight's codes are a function of the float model, the calibration samples and the grid, never of
which other ops are quantized, so they are computed once: the sensitivity engine's ``prepare`` fits
them on its all-op QDQ model (:func:`fit`) and keeps them beside the calibration cache
(:data:`CODES`, listed in ``engine.json``); every QDQ model built from that cache afterwards (the
engine's switch model, each profile, the QNN model the toolchain ships) gets them written over
ONNX Runtime's (:func:`apply`, called by :func:`vlsens.quantize.qdq.quantize`), after a check that
the model's grid is the one they were fitted on. So the engine's estimate is still the built model.

Ops GPTQ cannot serve keep round to nearest and are listed with why: a Conv whose kernel does not
cover its whole input (its rows would be im2col patches; the patch embedding's Conv covers it).

Memory: the float model's pass over one calibration sample with every quantized op's input as an
output; then one input's rows (calibration positions x width, float64), its Hessian (width^2 x 8
bytes, three copies while factored) and one weight in float64. Disk: the captured rows (positions x
the sum of the distinct inputs' widths x 4 bytes; 3.8 GB for the 3B vision tower's 4 calibration
images at 448x448).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: ``quant.weight_rounding`` values (``auto`` resolves to one of them: :func:`vlsens.quantize.target.resolve`)
ROUNDINGS = ("rtn", "gptq")
#: The codes' file, beside the calibration cache they belong with.
CODES = "weight_codes.npz"


def codes_path(cache: str | Path) -> Path:
    """Where the GPTQ codes of the run whose calibration cache is ``cache`` are kept."""
    return Path(cache).with_name(CODES)


@dataclass
class Slot:
    """One quantized weight of a QDQ model: the op reading it, its codes' initializer, the grid."""

    op: str
    codes: object  # TensorProto
    scale: np.ndarray
    zero: np.ndarray
    axis: int


def slots(model, weights_dir: str | Path) -> dict[str, Slot]:
    """``{op name: Slot}`` for every MatMul / Gemm / Conv of ``model`` (a QDQ ModelProto, loaded
    without its data) whose weight comes from a DequantizeLinear of an initializer."""
    from vlsens.core.onnxgraph import producers
    from vlsens.core.onnxutil import tensor_array

    inits = {i.name: i for i in model.graph.initializer}
    producer = producers(model.graph.node)
    out = {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.input) < 2:
            continue
        dq = producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        scale = np.asarray(tensor_array(inits[dq.input[1]], weights_dir), np.float32).reshape(-1)
        zero = (np.asarray(tensor_array(inits[dq.input[2]], weights_dir)).reshape(-1) if len(dq.input) > 2
                else np.zeros(scale.shape, np.int64))
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        out[node.name] = Slot(node.name, inits[dq.input[0]], scale, zero, axis)
    return out


def to_kn(w: np.ndarray, axis: int) -> np.ndarray:
    """A weight as K x N: its channel ``axis`` last, the other axes flattened in order (MatMul
    ``K x N``, Gemm ``transB`` ``N x K``, Conv ``O x I x k...``: rows in the order of its patches)."""
    axis = axis % w.ndim
    moved = np.moveaxis(w, axis, -1)
    return moved.reshape(-1, moved.shape[-1])


def from_kn(kn: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    axis = axis % len(shape)
    moved = list(shape)
    moved.append(moved.pop(axis))
    return np.moveaxis(kn.reshape(moved), -1, axis)


def code_range(codes_dtype, settings) -> tuple[int, int]:
    """The codes ONNX Runtime's weight grid takes: symmetric for signed weights (its default
    ``WeightSymmetric``), 7-bit with ``reduce_range``."""
    from onnx import helper
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qtype = helper.np_dtype_to_tensor_dtype(np.dtype(codes_dtype))
    signed = np.issubdtype(np.dtype(codes_dtype), np.signedinteger)
    qmin, qmax = get_qmin_qmax_for_qType(qtype, reduce_range=settings.reduce_range, symmetric=signed)
    return int(qmin), int(qmax)


def rtn(kn: np.ndarray, slot: Slot, qmin: int, qmax: int) -> np.ndarray:
    """Round to nearest on the slot's grid, as ONNX Runtime's QuantizeLinear computes it (float32)."""
    c = np.round(kn.astype(np.float32) / slot.scale[None, :]) + slot.zero[None, :].astype(np.float32)
    return np.clip(c, qmin, qmax)


def _patch_width(node, shapes: dict) -> int | None:
    """The row width of a Conv whose kernel covers its whole input (one row per patch), else None."""
    attrs = {a.name: a for a in node.attribute}
    kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else None
    shape = shapes.get(node.input[0])
    if kernel is None or shape is None or any(not isinstance(d, int) for d in shape[1:]):
        return None
    if (attrs["group"].i if "group" in attrs else 1) != 1 or any(p for p in getattr(attrs.get("pads"), "ints", [])):
        return None
    if list(shape[2:]) != kernel:
        return None
    return int(np.prod(shape[1:]))


def _input_shapes(model) -> dict:
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model)
    out = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info]:
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return out


def _plan(float_model: Path, qdq: dict[str, Slot]):
    """Per op of ``qdq``: (float weight initializer, input tensor, row width), and the ops GPTQ
    cannot serve with why."""
    import onnx

    model = onnx.load(str(float_model), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    shapes = _input_shapes(model)
    plan, skipped = {}, {}
    for node in model.graph.node:
        if node.name not in qdq:
            continue
        w = inits[node.input[1]]
        k = int(np.prod(w.dims)) // int(w.dims[qdq[node.name].axis])
        width = k
        if node.op_type == "Conv":
            width = _patch_width(node, shapes)
            if width != k:
                skipped[node.name] = "a Conv whose kernel does not cover its whole input (im2col rows): round to nearest"
                continue
        plan[node.name] = (w, node.input[0], width)
    return plan, skipped


def fit(float_model: str | Path, calibration: str | Path, qdq_model: str | Path, out: str | Path, settings,
        scratch: str | Path, threads: int = 0) -> dict:
    """GPTQ codes for every quantized weight of ``qdq_model`` (ONNX Runtime's QDQ model of
    ``float_model``, every op quantized), on its own grid, with the Hessians of ``float_model``'s
    inputs to each op over ``calibration`` (a Samples npz): written to ``out`` (:data:`CODES`).
    Returns the record: ops, those kept at round to nearest and why, and each op's output error on
    the calibration rows, GPTQ over round to nearest."""
    import onnx

    from vlsens.core.fsutil import savez
    from vlsens.core.onnxutil import tensor_array
    from vlsens.quantize.gptq import channel_codes, hessians

    t0 = time.perf_counter()
    float_model, qdq_model = Path(float_model), Path(qdq_model)
    Path(scratch).mkdir(parents=True, exist_ok=True)
    qdq = slots(onnx.load(str(qdq_model), load_external_data=False), qdq_model.parent)
    plan, skipped = _plan(float_model, qdq)
    by_input: dict[str, list[str]] = {}
    for op, (_, t, _) in plan.items():
        by_input.setdefault(t, []).append(op)
    widths = {t: plan[ops[0]][2] for t, ops in by_input.items()}
    arrays, ratios, names = {}, {}, []
    for t, h, _ in hessians(float_model, calibration, list(by_input), scratch, threads, widths):
        for op in by_input[t]:
            slot = qdq[op]
            ort_codes = np.asarray(tensor_array(slot.codes, qdq_model.parent))
            kn = to_kn(np.asarray(tensor_array(plan[op][0], float_model.parent), np.float32), slot.axis)
            qmin, qmax = code_range(ort_codes.dtype, settings)
            _check_grid(op, kn, slot, qmin, qmax, ort_codes)
            q = channel_codes(kn, h, slot.scale, slot.zero, qmin, qmax)
            ratios[op] = _error(kn, q, rtn(kn, slot, qmin, qmax), slot, h)
            j = len(names)
            names.append(op)
            arrays[f"codes{j}"] = from_kn(q, ort_codes.shape, slot.axis).astype(ort_codes.dtype)
            arrays[f"scale{j}"], arrays[f"zero{j}"] = slot.scale, slot.zero
    arrays["ops"] = np.array(names, dtype=str)
    savez(out, arrays)
    r = np.array([ratios[o] for o in names]) if names else np.ones(1)
    record = {"method": "gptq", "ops": len(names), "kept_rtn": skipped,
              "output_error_vs_rtn": {"geomean": float(np.exp(np.mean(np.log(np.maximum(r, 1e-30))))),
                                      "min": float(r.min()), "max": float(r.max())},
              "seconds": time.perf_counter() - t0}
    log.info("GPTQ weight codes: %d ops (%d kept at round to nearest), output error %.3gx round to nearest "
             "(geometric mean), %.0f s", len(names), len(skipped), record["output_error_vs_rtn"]["geomean"],
             record["seconds"])
    return record


def _check_grid(op: str, kn: np.ndarray, slot: Slot, qmin: int, qmax: int, codes: np.ndarray) -> None:
    """Round to nearest on the grid as read must give ONNX Runtime's own codes: else the grid (its
    axis, range or arithmetic) is not the one ONNX Runtime used, and GPTQ on it would not be either."""
    ours = rtn(kn, slot, qmin, qmax)
    theirs = to_kn(np.asarray(codes), slot.axis)
    if ours.shape != theirs.shape or not np.array_equal(ours, theirs.astype(np.float32)):
        bad = int(np.sum(ours != theirs)) if ours.shape == theirs.shape else -1
        raise ValueError(f"{op}: round to nearest on the QDQ model's grid ({qmin}..{qmax}, axis {slot.axis}) gives "
                         f"other codes than ONNX Runtime wrote ({bad} differ): GPTQ cannot keep its grid")


def _error(kn, q, r, slot: Slot, h) -> float:
    """Output error ``tr(D^T H D)`` of the GPTQ codes over that of round to nearest's."""
    s, z = slot.scale.astype(np.float64), slot.zero.astype(np.float64)
    num = den = 0.0
    for c in range(0, kn.shape[1], 1024):
        w = kn[:, c:c + 1024].astype(np.float64)
        dg = (q[:, c:c + 1024] - z[c:c + 1024]) * s[c:c + 1024] - w
        dr = (r[:, c:c + 1024] - z[c:c + 1024]) * s[c:c + 1024] - w
        num += float(np.sum((h @ dg) * dg))
        den += float(np.sum((h @ dr) * dr))
    return num / den if den > 0 else 1.0


def verified(codes: str | Path) -> Path:
    """``codes``, once it exists and its SHA-256 is the one the engine that wrote it recorded
    (``engine.json``'s ``files`` beside it, where there is one): a missing file raises
    FileNotFoundError, an edited or damaged one ArtifactError."""
    from vlsens.core.artifacts import find_record
    from vlsens.core.errors import ArtifactError
    from vlsens.core.fsutil import file_sha256

    codes = Path(codes)
    if not codes.is_file():
        raise FileNotFoundError(f"{codes}: the GPTQ weight codes (weight_rounding: gptq) are missing; the sensitivity "
                                "engine's prepare step writes them beside its calibration cache")
    found = find_record(codes)  # engine.json, where it lists them
    if found is not None and file_sha256(codes) != found[1]["files"][codes.name]["sha256"]:
        raise ArtifactError(f"{codes}: its SHA-256 is not the one {found[0]} recorded (the file was changed after the "
                            "engine wrote it); build the engine again")
    return codes


def apply(qdq_model: str | Path, codes: str | Path) -> int:
    """Write the GPTQ codes of ``codes`` (:func:`fit`'s file) over ONNX Runtime's in ``qdq_model``,
    for each op it quantizes, in place (the data file's bytes where the codes live there, else the
    graph). Raises where a model's grid is not the one the codes were fitted on. Returns how many
    weights were written."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from vlsens.core.fsutil import atomic_file

    qdq_model = Path(qdq_model)
    model = onnx.load(str(qdq_model), load_external_data=False)
    have = slots(model, qdq_model.parent)
    inline = written = 0
    with np.load(codes, allow_pickle=False) as z:
        for j, op in enumerate(z["ops"].tolist()):
            slot = have.get(op)
            if slot is None:
                continue
            if not (np.array_equal(slot.scale, z[f"scale{j}"]) and np.array_equal(slot.zero, z[f"zero{j}"])):
                raise ValueError(f"{qdq_model}: {op}'s weight grid is not the one its GPTQ codes in {codes} were fitted "
                                 "on (another calibration, float model or settings): rebuild the engine")
            data = np.ascontiguousarray(z[f"codes{j}"])
            if tuple(data.shape) != tuple(slot.codes.dims):
                raise ValueError(f"{qdq_model}: {op}'s codes are {tuple(slot.codes.dims)}, {codes} holds {data.shape}")
            if uses_external_data(slot.codes) and not slot.codes.HasField("raw_data"):
                info = ExternalDataInfo(slot.codes)
                if info.length and int(info.length) != data.nbytes:
                    raise ValueError(f"{qdq_model}: {op}'s codes take {info.length} bytes, not {data.nbytes}")
                with open(qdq_model.parent / info.location, "r+b") as f:
                    f.seek(int(info.offset or 0))
                    f.write(data.tobytes())
            else:
                slot.codes.ClearField("int32_data")
                slot.codes.raw_data = data.tobytes()
                inline += 1
            written += 1
    if inline:
        with atomic_file(qdq_model) as tmp:
            onnx.save_model(model, str(tmp))
    return written
