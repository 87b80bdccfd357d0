"""The anchors the int4-mixed decoder is compared with: onnxruntime-genai's model builder at
``-p int4`` with one ``algo_config`` (``rtn``, ``k_quant``, ``k_quant_mixed``, the last being the
builder's llama.cpp-style heuristic), each published as a gated decoder variant folder like
:func:`vlsens.precision.nbits.profile_folder`'s.

What ``-p int4`` does, done on the builder's own FP32 graph (``decoder/fp32``, already exported
and gated): the bits of every MatMul are the builder's own placement for the ``algo_config``
(its ``make_matmul_mixed_precision`` and alias table, called, not copied), and the weights are
quantized by the quantizer it calls, ``MatMulNBitsQuantizer``, with the same method, block size,
symmetry and accuracy level (:func:`vlsens.quantize.nbits.quantize`). The result equals the builder's
``-p int4`` graph weight for weight and output for output (``tests/test_nbits.py`` runs the builder
on the tiny preset), without a second export: at 36 layers the builder's own ``-p int4
algo_config=k_quant_mixed`` run was killed above 24 GiB (it holds the checkpoint in torch and the
FP32 graph in memory while k_quant runs in numpy).

The peers' decoders (:func:`nncf_folder`): NNCF's weight compression of the same FP32 graph with
the recipes a user would pick (:data:`NNCF_RECIPES`: NNCF's data-aware INT4 / INT8 split, its AWQ
with scale estimation, optimum-intel's ``--weight-format int4`` default), calibrated on the
decoder's calibration set and gated the same way, on transformers given the weights the graph
multiplies by (:func:`own_weights` reads both ``MatMulNBits`` and NNCF's ``DequantizeLinear``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from pathlib import Path

from vlsens.precision.nbits import MODEL, weight_facts

# NNCF's usage telemetry (openvino-telemetry) is its stub where NNCF_CI is set when nncf is first
# imported (NNCF's own switch): nothing vlsens runs sends anything anywhere
os.environ.setdefault("NNCF_CI", "1")

log = logging.getLogger(__name__)


def builder_bits(algo: str, ops: list[str], num_layers: int) -> tuple[str, dict[str, int]]:
    """``(method, {MatMul: bits})``: the builder's base method for ``algo_config=<algo>`` and its
    bits for each of ``ops`` (INT4 unless its placement upgrades the MatMul)."""
    import types

    import onnxruntime_genai.models.builder  # noqa: F401  (puts the builder's own packages on sys.path)
    from onnxruntime_genai.models.builders.base import Model
    from onnxruntime_genai.models.quantization.quant_config import _LEGACY_ALGO_ALIASES

    method, placement = _LEGACY_ALGO_ALIASES.get(algo, (algo, {}))
    builder = types.SimpleNamespace(num_layers=int(num_layers))  # all its placement reads for these presets
    Model.make_matmul_mixed_precision(builder, placement)
    up = {n: int(c["bits"]) for n, c in builder.int4_customized_weight_config.items()}
    return method, {n: up.get(n, 4) for n in ops}


def builder_folder(checkpoint: str | Path, algo: str, settings, fp32_dir: str | Path, reference: str | Path,
                   out_dir: str | Path, tolerance: dict, exact_tolerance: dict, threads: int = 0) -> dict:
    """The builder's ``-p int4 --extra_options algo_config=<algo>`` decoder with the run's block
    size, accuracy level and symmetry, as a decoder variant folder gated against transformers on
    its own weights (:func:`vlsens.variants.gate_own_weights`)."""
    from dataclasses import replace

    from vlsens.core.onnxutil import copy_model
    from vlsens.export.towers.decoder import builder_version, weight_reference_for
    from vlsens.quantize.nbits import quantize, weight_matmuls
    from vlsens.variants import Gate, variant_folder

    layers = json.loads((Path(checkpoint) / "config.json").read_text())
    layers = int(layers.get("text_config", layers)["num_hidden_layers"])

    def transform(src: Path, feeds, staged: Path) -> dict:
        if src.name != MODEL:
            copy_model(src, staged)
            return {}
        method, bits = builder_bits(algo, [o["name"] for o in weight_matmuls(src)], layers)
        quantize(src, staged, bits, replace(settings, algorithm=method))
        return {**weight_facts(staged),
                "builder": {"precision": "int4", "algo_config": algo, "method": method,
                            "version": builder_version(), "not_int4": {n: b for n, b in bits.items() if b != 4},
                            "how": "the builder's placement (make_matmul_mixed_precision) and quantizer "
                                   "(MatMulNBitsQuantizer) on its FP32 graph, as -p int4 runs them",
                            "extra_options": {"algo_config": algo, "block_size": settings.block_size,
                                              "accuracy_level": settings.accuracy_level,
                                              "is_symmetric": str(settings.symmetric).lower()}}}

    return variant_folder(fp32_dir, reference, out_dir, f"int4-{algo}", transform,
                          Gate(tolerance, threads, reference_for=weight_reference_for(checkpoint),
                               exact_tolerance=exact_tolerance))


# ----------------------------------------------------------------------------------------------
# NNCF's weight compression of the decoder (the peers' decoders)

#: NNCF's ``compress_weights`` settings of the peers a user would pick, by folder name; ``mode``,
#: ``sensitivity_metric`` and ``group_size_fallback`` are the values of NNCF's enums
#: (``CompressWeightsMode``, ``SensitivityMetric``, ``GroupSizeFallbackMode``); ``data_aware``: fed
#: the decoder's calibration set (``nncf.Dataset`` of its feeds), else data-free.
#:
#: ``nncf-ratio``: NNCF's mixed-precision compression: INT4_SYM in groups of 32 on every MatMul
#: (``all_layers``), a ``ratio`` of 0.8 of the weights (by count) at most in INT4, the rest in
#: NNCF's backup INT8_ASYM per channel, the split chosen by NNCF's data-aware sensitivity
#: ``HESSIAN_INPUT_ACTIVATION`` (the average Hessian trace of the layer's output error; NNCF's own
#: default with a dataset would be ``MAX_ACTIVATION_VARIANCE``): the MatMuls in ascending
#: sensitivity go to INT4 until the next one would reach the ratio, so the INT4 share is below 0.8
#: by less than that MatMul's weights. 0.8 is the ratio of several of optimum-intel's tuned configs
#: (zephyr-7b-beta, Llama-3.1-8B, Baichuan2-7B); groups of 32 and symmetric INT4 as the int4 folders.
#:
#: ``nncf-awq``: every MatMul INT4_SYM in groups of 32 (ratio 1.0, ``all_layers``), with NNCF's
#: data-aware AWQ (per-channel scales moved between two MatMuls where NNCF matches its MatMul ->
#: Mul -> MatMul pattern: each layer's up_proj and down_proj here) and scale estimation: the
#: data-aware algorithms optimum-intel's tuned INT4 configs combine (``quant_method`` awq,
#: ``scale_estimation``); NNCF's ONNX backend has no GPTQ.
#:
#: ``nncf-optimum``: what ``optimum-cli export openvino --weight-format int4`` does for a language
#: model without a config of its own: ``_DEFAULT_4BIT_WQ_CONFIG`` of optimum-intel
#: (``optimum/intel/openvino/configuration.py``: bits 4, ``sym`` False, ``group_size`` 128, ``ratio``
#: 1.0, ``all_layers`` None), data-free (no dataset, no AWQ or scale estimation): INT4_ASYM in
#: groups of 128, and with ``all_layers`` off NNCF keeps the embedding and the last layer (here
#: lm_head: the decoder graph has no embedding) in INT8_ASYM per channel. ``_DEFAULT_4BIT_WQ_CONFIGS``
#: (optimum-intel's main branch at e1de5be, August 2026) has entries for Qwen2.5 LMs and Qwen3-VL,
#: none for Qwen2.5-VL, so the default applies. optimum-intel leaves ``group_size_fallback`` unset
#: (NNCF's ``error``: a MatMul whose K is not a multiple of 128 fails the run); Qwen2.5-VL's K
#: (2048 / 11008 at 3B, 3584 / 18944 at 7B) are all multiples of 128, so ``adjust`` (a smaller
#: power-of-two group, at least 32, where K needs it) changes nothing there and lets the tiny
#: preset (K = 64) build: its K = 64 MatMuls get groups of 64 (recorded per MatMul).
NNCF_RECIPES: dict[str, dict] = {
    "nncf-ratio": {"mode": "int4_sym", "group_size": 32, "ratio": 0.8, "all_layers": True,
                   "sensitivity_metric": "hessian_input_activation", "awq": False, "scale_estimation": False,
                   "group_size_fallback": "error", "data_aware": True},
    "nncf-awq": {"mode": "int4_sym", "group_size": 32, "ratio": 1.0, "all_layers": True,
                 "sensitivity_metric": None, "awq": True, "scale_estimation": True,
                 "group_size_fallback": "error", "data_aware": True},
    "nncf-optimum": {"mode": "int4_asym", "group_size": 128, "ratio": 1.0, "all_layers": False,
                     "sensitivity_metric": None, "awq": False, "scale_estimation": False,
                     "group_size_fallback": "adjust", "data_aware": False},
}
#: ``accuracy_level`` of the ``MatMulNBits`` nodes of an NNCF folder: ONNX Runtime's default for
#: the ones it makes of INT4 ``DequantizeLinear`` + ``MatMul`` (``session.qdq_matmulnbits_accuracy_level``),
#: the builder's for CPU
NNCF_ACCURACY_LEVEL = 4
_MATMULNBITS = "MatMulNBits"
_DQ = "DequantizeLinear"


def nncf_recipe(recipe: str) -> str:
    """The folder name of a recipe (``ratio`` or ``nncf-ratio`` -> ``nncf-ratio``)."""
    name = recipe if recipe.startswith("nncf-") else f"nncf-{recipe}"
    if name not in NNCF_RECIPES:
        raise ValueError(f"NNCF recipe {recipe!r}; valid: {sorted(NNCF_RECIPES)}")
    return name


def _nncf_arguments(settings: dict, feeds: list, external_dir: Path) -> dict:
    """``nncf.compress_weights``' keyword arguments for a recipe's ``settings``."""
    import nncf

    advanced = nncf.AdvancedCompressionParameters(
        group_size_fallback_mode=nncf.GroupSizeFallbackMode(settings["group_size_fallback"]),
        backend_params={"external_data_dir": str(external_dir.resolve())})
    metric = settings["sensitivity_metric"]
    return {"mode": nncf.CompressWeightsMode(settings["mode"]), "ratio": settings["ratio"],
            "group_size": settings["group_size"], "all_layers": settings["all_layers"],
            "sensitivity_metric": nncf.SensitivityMetric(metric) if metric else None,
            "awq": settings["awq"], "scale_estimation": settings["scale_estimation"],
            "dataset": nncf.Dataset(list(feeds)) if settings["data_aware"] else None,
            "subset_size": max(len(feeds), 1), "advanced_parameters": advanced}


class _ToLog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        log.log(record.levelno, "nncf: %s", record.getMessage())


@contextlib.contextmanager
def _nncf_logs():
    """NNCF's log records go to this module's logger (its own handler prints to stdout); its
    progress bars (rich, on stdout) are dropped."""
    from nncf.common.logging.logger import nncf_logger

    handlers = nncf_logger.handlers[:]
    nncf_logger.handlers[:] = [_ToLog()]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        nncf_logger.handlers[:] = handlers


def _compress(src_model: str | Path, feeds: list, recipe: str):
    """``(ModelProto, facts)``: NNCF's compression of ``src_model`` (its weights read from its data
    file where NNCF needs them) with ``recipe``, in memory, and the record's ``nncf`` entry."""
    import time
    from collections import Counter

    import nncf
    import onnx

    name = nncf_recipe(recipe)
    settings = NNCF_RECIPES[name]
    src_model = Path(src_model)
    model = onnx.load(str(src_model), load_external_data=False)
    t0 = time.perf_counter()
    with _nncf_logs():
        out = nncf.compress_weights(model, **_nncf_arguments(settings, feeds, src_model.parent))
    seconds = time.perf_counter() - t0
    log.info("%s: NNCF %s compressed %s in %.1f s", name, nncf.__version__, src_model, seconds)
    ops = Counter(n.op_type for n in out.graph.node if n.op_type in ("MatMul", _DQ, _MATMULNBITS))
    return out, {"version": nncf.__version__, "recipe": name, "settings": dict(settings),
                 "calibration_feeds": len(feeds) if settings["data_aware"] else 0,
                 "wrote": dict(sorted(ops.items())), "seconds": seconds}


def nncf_decoder(src_model: str | Path, dst_model: str | Path, feeds: list, recipe: str) -> dict:
    """``dst_model`` (+ its data file, published together, the graph last): NNCF's weight
    compression of the decoder graph ``src_model`` with ``recipe`` (:data:`NNCF_RECIPES`),
    calibrated on ``feeds`` (the decoder's own inputs: ``inputs_embeds``, ``attention_mask``,
    ``position_ids``, an empty cache) where the recipe is data-aware, as NNCF writes it. NNCF
    3.4's ONNX backend writes, on an opset >= 21 graph (the builder's is 22), each compressed
    weight as a ``DequantizeLinear`` before the float ``MatMul``: INT4 / UINT4 blocked (``axis``
    0, ``block_size`` the group) for the primary mode, UINT8 per output channel with zero points
    for the INT8_ASYM backup. Facts: :func:`nncf_weight_facts` and ``nncf`` (version, recipe,
    settings, op types written, seconds)."""
    from vlsens.core.fsutil import publish, staging_dir
    from vlsens.core.onnxutil import data_path, save_with_external_data

    model, facts = _compress(src_model, feeds, recipe)
    dst_model = Path(dst_model)
    with staging_dir(dst_model) as tmp:
        save_with_external_data(model, tmp / dst_model.name)
        del model
        publish({data_path(dst_model): data_path(tmp / dst_model.name), dst_model: tmp / dst_model.name},
                last=dst_model)
    return {**nncf_weight_facts(dst_model), "nncf": facts}


def _dq_matmuls(m) -> dict[str, dict]:
    """``{MatMul name: facts}`` of the MatMuls of graph ``m`` whose weight is a
    ``DequantizeLinear`` of 2-D integer initializers: its node, bits, group (-1: per channel),
    symmetry (no zero point), K, N and bytes as stored."""
    from onnx import TensorProto

    from vlsens.core.onnxgraph import producers, tensor_bytes

    inits = {i.name: i for i in m.graph.initializer}
    made = producers(m.graph.node)
    out = {}
    for n in m.graph.node:
        dq = made.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if dq is None or dq.op_type != _DQ or dq.input[0] not in inits or len(inits[dq.input[0]].dims) != 2:
            continue
        q = inits[dq.input[0]]
        block = next((a.i for a in dq.attribute if a.name == "block_size"), 0)
        out[n.name] = {"node": dq, "bits": 4 if q.data_type in (TensorProto.INT4, TensorProto.UINT4) else 8,
                       "group_size": int(block) or -1, "symmetric": len(dq.input) < 3 or not dq.input[2],
                       "K": int(q.dims[0]), "N": int(q.dims[1]),
                       "bytes": sum(tensor_bytes(inits[x]) for x in dq.input if x in inits)}
    return out


def nncf_weight_facts(model) -> dict:
    """:func:`vlsens.precision.nbits.weight_facts` (``bits`` of every weight MatMul, 0: float, and
    ``weight_bytes`` as stored) of a graph (a path or ModelProto) whose quantized MatMuls are
    ``MatMulNBits`` or ``DequantizeLinear`` + ``MatMul`` (NNCF's), with ``layout`` (per MatMul:
    format, bits, group (-1: per channel), symmetry, K, N) and ``int4_fraction``, the share of the
    weights (by count, NNCF's definition of ``ratio``) stored in 4 bits."""
    import onnx

    from vlsens.quantize.nbits import weight_matmuls

    m = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    facts = weight_facts(m)
    layout = {o["name"]: {"format": "float", "bits": 0, "K": o["K"], "N": o["N"]} for o in weight_matmuls(m)}
    inits = {i.name for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == _MATMULNBITS:
            a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            layout[n.name.rsplit("_Q", 1)[0]] = {
                "format": _MATMULNBITS, "bits": int(a["bits"]), "group_size": int(a["block_size"]),
                "symmetric": not (len(n.input) > 3 and n.input[3] in inits), "K": int(a["K"]), "N": int(a["N"])}
    dq = _dq_matmuls(m)
    for name, d in dq.items():
        layout[name] = {"format": _DQ, "bits": d["bits"], "group_size": d["group_size"], "symmetric": d["symmetric"],
                        "K": d["K"], "N": d["N"]}
    total = sum(v["K"] * v["N"] for v in layout.values())
    return {"bits": {**facts["bits"], **{n: d["bits"] for n, d in dq.items()}},
            "weight_bytes": facts["weight_bytes"] + sum(d["bytes"] for d in dq.values()), "layout": layout,
            "int4_fraction": sum(v["K"] * v["N"] for v in layout.values() if v["bits"] == 4) / max(total, 1)}


def _int_values(t, weights_dir: str | Path | None):
    """An integer initializer's values; INT4 / UINT4 unpacked (two a byte, the first in the low
    bits, as ONNX packs them; INT4 sign-extended), its data file in ``weights_dir``."""
    import numpy as np
    from onnx import TensorProto, numpy_helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from vlsens.core.onnxutil import tensor_array

    if t.data_type not in (TensorProto.INT4, TensorProto.UINT4):
        return np.asarray(tensor_array(t, weights_dir))
    n = int(np.prod(t.dims)) if len(t.dims) else 1
    if uses_external_data(t) and not t.HasField("raw_data"):
        info = ExternalDataInfo(t)
        raw = np.memmap(Path(weights_dir) / info.location, np.uint8, "r", offset=int(info.offset or 0),
                        shape=(int(info.length) if info.length is not None else (n + 1) // 2,))
    elif t.HasField("raw_data"):
        raw = np.frombuffer(t.raw_data, np.uint8)
    else:
        return np.asarray(numpy_helper.to_array(t)).astype(np.int8)
    v = np.empty(raw.size * 2, np.int8)
    v[0::2], v[1::2] = raw & 0x0F, raw >> 4
    v = v[:n]
    if t.data_type == TensorProto.INT4:
        v = (v ^ 8) - 8
    return v.reshape(tuple(t.dims))


def _dequantized(dq, inits: dict, weights_dir: str | Path | None):
    """The float32 tensor a ``DequantizeLinear`` of initializers yields, by ONNX's definition:
    ``(q - zero_point) * scale``, the parameters per tensor, per ``axis`` or in blocks of
    ``block_size`` along it."""
    import numpy as np
    from onnx import helper

    from vlsens.core.onnxutil import tensor_array

    a = {x.name: helper.get_attribute_value(x) for x in dq.attribute}
    q = _int_values(inits[dq.input[0]], weights_dir).astype(np.float32)
    axis, block = int(a.get("axis", 1)) % q.ndim, int(a.get("block_size", 0))

    def spread(p):
        p = np.asarray(p, np.float32)
        if p.size == 1:
            return p.reshape(())
        if block:
            return np.take(np.repeat(p, block, axis=axis), np.arange(q.shape[axis]), axis=axis)
        return p.reshape([-1 if d == axis else 1 for d in range(q.ndim)])

    scale = spread(tensor_array(inits[dq.input[1]], weights_dir))
    zp = spread(_int_values(inits[dq.input[2]], weights_dir)) if len(dq.input) > 2 and dq.input[2] else 0.0
    return (q - zp) * scale


def own_weights(model: str | Path):
    """``(float MatMul name, W)`` for every quantized weight MatMul of the graph ``model`` (a path;
    its data file memory-mapped): ``W`` (K, N) float32, the weight it multiplies by, of a
    ``MatMulNBits`` (:func:`vlsens.core.onnxgraph.dequantize_matmulnbits`) or a ``DequantizeLinear``
    of initializers feeding a ``MatMul`` (NNCF's). One weight in memory at a time."""
    import numpy as np
    import onnx

    from vlsens.core.onnxgraph import dequantize_matmulnbits

    model = Path(model)
    yield from dequantize_matmulnbits(model)
    m = onnx.load(str(model), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    for name, d in _dq_matmuls(m).items():
        yield name, np.ascontiguousarray(_dequantized(d["node"], inits, model.parent))


def _matmulnbits(matmul, d: dict, inits: dict, accuracy_level: int, weights_dir):
    """``(MatMulNBits node, its initializers)`` computing ``matmul`` whose weight is the 2-D INT4 /
    UINT4 ``DequantizeLinear`` (blocked along K) of ``d`` (:func:`_dq_matmuls`): the 4-bit values
    stored unsigned (INT4 + 8, whose zero point 8 is ``MatMulNBits``' default), ``(N, blocks,
    block / 2)`` bytes, scales and zero points per (column, block); None for a layout it cannot
    hold (blocks not along K, a block size that is not a power of two >= 16)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from vlsens.core.onnxutil import tensor_array

    dq, k, n, bs = d["node"], d["K"], d["N"], d["group_size"]
    axis = next((int(a.i) for a in dq.attribute if a.name == "axis"), 1) % 2
    if axis != 0 or bs < 16 or bs & (bs - 1):
        return None
    shift = 8 if inits[dq.input[0]].data_type == TensorProto.INT4 else 0
    blocks = -(-k // bs)
    q = np.zeros((blocks * bs, n), np.uint8)
    q[:k] = _int_values(inits[dq.input[0]], weights_dir).astype(np.int16) + shift
    q = np.ascontiguousarray(q.T).reshape(n, blocks, bs)
    base = dq.input[0]
    tensors = [numpy_helper.from_array(q[..., 0::2] | (q[..., 1::2] << 4), f"{base}_B"),
               numpy_helper.from_array(np.ascontiguousarray(
                   np.asarray(tensor_array(inits[dq.input[1]], weights_dir)).reshape(blocks, n).T).reshape(-1),
                   f"{base}_scales")]
    if len(dq.input) > 2 and dq.input[2]:
        zp = np.zeros((n, blocks + blocks % 2), np.uint8)
        zp[:, :blocks] = (_int_values(inits[dq.input[2]], weights_dir).astype(np.int16) + shift).reshape(blocks, n).T
        tensors.append(numpy_helper.from_array((zp[:, 0::2] | (zp[:, 1::2] << 4)).reshape(-1), f"{base}_zero_points"))
    node = helper.make_node(_MATMULNBITS, [matmul.input[0], *(t.name for t in tensors)], [matmul.output[0]],
                            name=f"{matmul.name}_Q4", domain="com.microsoft", K=k, N=n, bits=4, block_size=bs,
                            accuracy_level=int(accuracy_level))
    return node, tensors


def fuse_int4(model, accuracy_level: int = NNCF_ACCURACY_LEVEL, weights_dir: str | Path | None = None) -> list[str]:
    """Replace, in ``model`` (a ModelProto), every ``MatMul`` fed by an INT4 / UINT4 blocked
    ``DequantizeLinear`` of initializers read by nothing else (NNCF's 4-bit weights) with the
    ``MatMulNBits`` node ONNX Runtime itself makes of the pair when it loads the graph on the CPU
    (its DQ -> MatMulNBits fusion, ``accuracy_level`` the session's
    ``session.qdq_matmulnbits_accuracy_level``, default 4): the same values, scales and zero
    points, named ``<MatMul>_Q4`` (:func:`vlsens.quantize.nbits.quantized_nodes`). The graph then
    computes what it did under ONNX Runtime, and says so itself. Returns the MatMuls replaced."""
    import onnx

    from vlsens.core.onnxgraph import consumers

    inits = {i.name: i for i in model.graph.initializer}
    users = consumers(model.graph.node)
    made, fused = {}, []  # {the weight DequantizeLinear's output: MatMulNBits}
    for name, d in _dq_matmuls(model).items():
        readers = users.get(d["node"].output[0], [])
        got = (_matmulnbits(readers[0], d, inits, accuracy_level, weights_dir)
               if d["bits"] == 4 and len(readers) == 1 else None)
        if got is not None:
            made[d["node"].output[0]] = got[0]
            fused.append(name)
            model.graph.initializer.extend(got[1])
    gone = {x for n in model.graph.node if n.op_type == _DQ and n.output[0] in made for x in n.input}
    nodes = [made.get(n.input[1], n) if n.op_type == "MatMul" else n for n in model.graph.node
             if not (n.op_type == _DQ and n.output[0] in made)]
    kept = [t for t in model.graph.initializer if t.name not in gone]
    for field, items in ((model.graph.node, nodes), (model.graph.initializer, kept)):
        del field[:]
        field.extend(items)
    if made and "com.microsoft" not in {o.domain for o in model.opset_import}:
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return fused


OWN_WEIGHTS_SOURCE = ("transformers Qwen2_5_VLForConditionalGeneration (PyTorch, float32, eager) with the graph's own "
                      "weights: every MatMulNBits and DequantizeLinear weight dequantized into its Linear "
                      "(vlsens.deploy.genai.anchors.own_weights)")


def own_weight_reference(checkpoint, graph: str | Path, cases):
    """``cases`` with the decoder's expected logits recomputed by transformers given, in each
    Linear the graph quantized, the weight the graph multiplies by (:func:`own_weights`: its
    ``MatMulNBits`` and its ``DequantizeLinear`` weights, NNCF's INT8 backup among them); the
    embedding graph's cases unchanged. The reference of :func:`nncf_folder`'s gate, as
    :func:`vlsens.export.towers.decoder.weight_reference` is the builder's."""
    import numpy as np
    import torch

    from vlsens.core.errors import VlsensError
    from vlsens.data.cases import Case, Cases
    from vlsens.export.towers.decoder import forward_case, linear_of
    from vlsens.model.loading import load_model

    model = load_model(checkpoint, attn_implementation="eager", part="text")
    given = []
    for matmul, w in own_weights(graph):
        linear = model.get_submodule(linear_of(matmul))
        if tuple(linear.weight.shape) != w.T.shape:
            raise VlsensError(f"{graph}: {matmul}'s weight is {w.shape[0]}x{w.shape[1]}; {linear_of(matmul)} holds "
                              f"{tuple(linear.weight.shape)} (its transpose expected)")
        linear.weight = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(w.T)), requires_grad=False)
        given.append(matmul)
    log.info("%s: %d own weights given to transformers' model", graph, len(given))
    out = Cases(source=f"{OWN_WEIGHTS_SOURCE} ({len(given)} weights)")
    for c in cases:
        out.add(Case(c.name, c.graph, c.inputs, forward_case(model, c.inputs), c.valid, c.logits, c.meta)
                if c.graph == MODEL else c)
    return out


def nncf_folder(checkpoint: str | Path, recipe: str, fp32_dir: str | Path, reference: str | Path,
                calib_npz: str | Path, out_dir: str | Path, tolerance: dict, exact_tolerance: dict,
                threads: int = 0) -> dict:
    """NNCF's weight compression of the builder's FP32 decoder (``decoder/fp32``) with ``recipe``
    (:data:`NNCF_RECIPES`; ``ratio`` or ``nncf-ratio``), calibrated on the decoder's calibration
    set ``calib_npz`` (its prefill feeds, empty cache), as a decoder variant folder named after the
    recipe (``model.onnx``; ``embedding.onnx`` copied) gated against transformers on its own
    weights (:func:`own_weight_reference`, :func:`vlsens.variants.gate_own_weights`), like
    :func:`builder_folder`'s.

    The INT4 weights ship as the ``MatMulNBits`` nodes ONNX Runtime's CPU provider makes of NNCF's
    INT4 ``DequantizeLinear`` + ``MatMul`` pairs at load (:func:`fuse_int4`, ``accuracy_level``
    :data:`NNCF_ACCURACY_LEVEL`): what the graph computes is unchanged, and the gate's exact half
    (``accuracy_level`` 0, float activations) reaches them; a ``DequantizeLinear`` + ``MatMul``
    graph would be quantized to INT8 activations by that fusion in both halves. NNCF's INT8
    backup (per channel) stays ``DequantizeLinear`` + ``MatMul``, which ONNX Runtime runs in
    float. Facts: :func:`nncf_weight_facts` and ``nncf`` (:func:`nncf_decoder`'s, with ``fused``)."""
    from vlsens.core.onnxutil import copy_model, save_with_external_data
    from vlsens.data.samples import Samples
    from vlsens.variants import Gate, variant_folder

    name = nncf_recipe(recipe)

    def transform(src: Path, feeds, staged: Path) -> dict:
        if src.name != MODEL:
            copy_model(src, staged)
            return {}
        model, facts = _compress(src, Samples.load(calib_npz, src).feeds, name)
        fused = fuse_int4(model, NNCF_ACCURACY_LEVEL)
        save_with_external_data(model, staged)
        del model
        return {**nncf_weight_facts(staged),
                "nncf": {**facts, "fused": {"matmuls": len(fused), "accuracy_level": NNCF_ACCURACY_LEVEL,
                                            "how": "NNCF's INT4 DequantizeLinear + MatMul as the MatMulNBits ONNX "
                                                   "Runtime's CPU provider makes of them at load"}}}

    return variant_folder(fp32_dir, reference, out_dir, name, transform,
                          Gate(tolerance, threads, exact_tolerance=exact_tolerance,
                               reference_for=lambda staged, cases: own_weight_reference(checkpoint, staged[MODEL],
                                                                                        cases)))
