"""Weight-only INT4 / INT8 of the two graphs a deploy folder carries besides its decoder: the
embedding table and the dynamic vision graph. At 3B they are 1.24 GB (FP32 table) and 1.34 GB
(FP16 vision) of a folder whose INT4 decoder is about 2 GB, so without them no int4 folder gets
near a third of the FP16 folder's bytes. Besides vlsens' own format (INT4 at the run's
``deploy.nbits``), the formats the peers ship: Olive's Qwen2.5-VL CPU recipe (vision INT4 RTN in
blocks of 128, :data:`INT4_RTN128`; the table INT4) and optimum-intel's default (vision and table
INT8 weight-only per channel, asymmetric: :data:`INT8_WO`, ``bits=8`` with :data:`PER_CHANNEL`).

* **Embedding** (``embedding.onnx`` of the decoder's folder): its table Gather becomes
  ``GatherBlockQuantized`` (com.microsoft; blocks along the hidden axis, one FP32 scale per
  block). INT4 by ONNX Runtime's own ``MatMulNBitsQuantizer`` (``DefaultWeightOnlyQuantConfig``
  with ``op_types_to_quantize=("Gather",)``, the path the model builder takes for quantized
  embeddings); INT8, which that quantizer does not write for a Gather (ONNX Runtime 1.31), by
  :func:`rtn_rows`, its 8-bit MatMul arithmetic, one block a row where the op allows it
  (:func:`table_block`). Gated exactly against the table it holds: every text row equals the
  dequantized table's row (:func:`embedding_reference`), the image rows are transformers'
  features as in the float reference; the error against the checkpoint's table is recorded.
* **Vision** (``vision/dynamic/fp32``): every Linear (the exporter's ``Gemm``, weight ``(N, K)``,
  ``transB=1``) becomes ``MatMul`` + bias ``Add`` (:func:`gemm_to_matmul`, exact in float), then
  every weight MatMul is quantized by :func:`vlsens.quantize.nbits.quantize` (the decoder's
  quantizer) in a :class:`WeightFormat` (bits; algorithm, block size, symmetry and accuracy level
  the run's unless the format sets them; ``MatMulNBits`` pads a K that is not a whole number of
  blocks). Gated like the INT4 decoders (:func:`vlsens.variants.gate_own_weights`): against
  transformers' ``get_image_features`` with every Linear given the dequantized weight the graph
  multiplies by (:func:`vision_weight_reference`).

* **Tied table** (``embedding.onnx`` of an int4 deploy folder, checkpoints with
  ``tie_word_embeddings``): the table Gather reads lm_head's weight where the folder's decoder
  stores it (:func:`tied_embedding`: ``GatherBlockQuantized`` on ``MatMulNBits``' own bytes in
  ``decoder.onnx.data``), so the folder holds the table once, at lm_head's bits; gated exactly on
  lm_head's rows (:func:`gate_tied`).

What ONNX Runtime 1.31 (CPU) accepts, checked by ``tests/test_weight_only.py``: ``MatMulNBits``
at 4 and 8 bits, with or without (uint8) zero points, in blocks of 16 to 256 only
(:data:`MATMULNBITS_BLOCKS`; per channel therefore means one block where K <= 256, else blocks of
256); ``GatherBlockQuantized`` at ``bits=8`` (uint8 values, default zero point 128) in any block a
power of two >= 16, the whole row included.

Memory: the embedding job holds the FP32 table and its quantized copy (about 1.5x the table);
the vision job the vision tower in FP32 twice (the rewrite and the reference model: 2.7 GB each
for Qwen2.5-VL's 669 M vision parameters).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from vlsens.core.errors import VlsensError
from vlsens.data.cases import Case, Cases
from vlsens.export.towers import names
from vlsens.quantize.nbits import FLOAT

log = logging.getLogger(__name__)

EMBEDDING = names.DECODER_EMBEDDING
QUANTIZER = "onnxruntime.quantization MatMulNBitsQuantizer"


# ----------------------------------------------------------------------------------------------
# The embedding table


def table_gather(model):
    """``(Gather node, table initializer)``: the graph's one Gather that reads a 2-D initializer."""
    inits = {i.name: i for i in model.graph.initializer}
    found = [(n, inits[n.input[0]]) for n in model.graph.node
             if n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2]
    if len(found) != 1:
        raise VlsensError(f"expected one Gather of a 2-D table in the embedding graph, found {len(found)}")
    return found[0]


#: ``block_size`` for one block per row (a table) or per output channel (a Linear): as wide as
#: the op allows (:func:`table_block`, :meth:`WeightFormat.block_for`).
PER_CHANNEL = 0


def table_block(width: int, block_size: int) -> int:
    """The block a table of rows ``width`` wide is quantized in: ``block_size``, or for
    :data:`PER_CHANNEL` the widest block ``GatherBlockQuantized`` accepts that tiles a row (its
    shape inference: a power of two >= 16): the row itself where ``width`` is one (2048 at 3B, 64 on
    the tiny preset), else the largest such divisor (3584 = 7 x 512 at 7B: 512)."""
    if block_size != PER_CHANNEL:
        return int(block_size)
    fits = [b for b in (1 << e for e in range(4, width.bit_length())) if width % b == 0]
    if not fits:
        raise VlsensError(f"an embedding table {width} wide has no block GatherBlockQuantized accepts "
                          "(a power of two >= 16 that divides it)")
    return fits[-1]


def rtn_rows(table: np.ndarray, block_size: int, symmetric: bool, rows_at_once: int = 16384):
    """``(values uint8, scales float32 (rows, blocks), zero points uint8 (rows, blocks) or None)``:
    INT8 round-to-nearest of ``table`` (rows, width) in blocks of ``block_size`` along each row,
    the arithmetic of ONNX Runtime's 8-bit block quantizer (MLAS ``MlasQuantizeBlockwise``, which
    ``MatMulNBitsQuantizer`` runs for 8-bit weights; ``tests/test_weight_only.py``: byte for byte)
    for blocks wider than the 256 it stops at:

    * symmetric: ``scale = x / -128`` (``x`` the block's value of largest magnitude), zero point
      128, the op's default (None returned);
    * asymmetric: ``scale = (max(hi, 0) - min(lo, 0)) / 255``, zero point
      ``roundf(-min(lo, 0) / scale)``;

    ``q = clamp(roundf(w * (1 / scale) + zero point), 0, 255)`` in float32, ``roundf`` rounding
    half away from zero. ``rows_at_once`` rows at a time (the temporaries of a 3B table)."""
    rows, width = table.shape
    blocks = width // block_size
    q = np.empty((rows, width), np.uint8)
    scales = np.empty((rows, blocks), np.float32)
    zps = None if symmetric else np.empty((rows, blocks), np.uint8)
    for r in range(0, rows, rows_at_once):
        b = np.asarray(table[r:r + rows_at_once], np.float32).reshape(-1, blocks, block_size)
        lo, hi = b.min(-1), b.max(-1)
        if symmetric:
            scale = np.where(np.abs(hi) > np.abs(lo), hi, lo) / np.float32(-128)
            zp = np.full(scale.shape, 128, np.float32)
        else:
            lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
            scale = (hi - lo) / np.float32(255)
            zp = np.clip(_roundf(np.where(scale != 0, -lo / np.where(scale != 0, scale, 1), lo)), 0, 255)
            zps[r:r + rows_at_once] = zp
        with np.errstate(divide="ignore"):
            inv = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
        v = b * inv[..., None] + zp.astype(np.float32)[..., None]
        q[r:r + rows_at_once] = np.clip(_roundf(v), 0, 255).reshape(-1, width)
        scales[r:r + rows_at_once] = scale
    return q, scales, zps


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's ``roundf``: to nearest, halves away from zero (numpy's ``round`` takes halves to even)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) == 0.5, t + np.sign(x), np.round(x))


def quantize_embedding(src: str | Path, dst: str | Path, block_size: int, symmetric: bool, bits: int = 4) -> dict:
    """``dst`` (+ its data file): ``src`` with its table Gather as ``GatherBlockQuantized`` of
    ``bits`` (4 or 8) in blocks of ``block_size`` along each row (:data:`PER_CHANNEL`: one block a
    row, :func:`table_block`). Facts for the record.

    * 4 bits: written by ONNX Runtime's ``MatMulNBitsQuantizer`` (``DefaultWeightOnlyQuantConfig``,
      ``op_types_to_quantize=("Gather",)``): INT4 values (UINT4 and zero points when asymmetric);
    * 8 bits: the quantizer (1.31) leaves a Gather at 8 bits as it is ("Gather only supports 4
      bits") and its 8-bit block routine stops at blocks of 256, while the op's CPU kernel runs
      ``bits=8`` (uint8 values, zero point 128 unless given) at any block a power of two >= 16:
      :func:`rtn_rows`, that routine's arithmetic."""
    import onnx

    from vlsens.core.onnxgraph import tensor_bytes
    from vlsens.core.onnxutil import save_with_external_data

    model = onnx.load(str(src))
    gather, table = table_gather(model)
    shape = [int(d) for d in table.dims]
    block_size = table_block(shape[1], block_size)
    if shape[1] % block_size:
        raise VlsensError(f"deploy.nbits.block_size {block_size} does not divide the embedding width {shape[1]}")
    if bits == 4:
        model, how = _int4_table(model, gather, block_size, symmetric), "MatMulNBitsQuantizer (Gather)"
    elif bits == 8:
        _int8_table(model, gather, table, block_size, symmetric)
        how = "vlsens.precision.weight_only.rtn_rows (the 8-bit arithmetic of MatMulNBitsQuantizer's MLAS routine)"
    else:
        raise VlsensError(f"embedding bits {bits}: 4 or 8")
    save_with_external_data(model, dst)
    qbytes = sum(tensor_bytes(t) for t in model.graph.initializer if t.name.startswith(table.name))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return {"table": table.name, "shape": shape, "op": "GatherBlockQuantized", "bits": bits, "block_size": block_size,
            "per_channel": block_size == shape[1], "symmetric": symmetric, "algorithm": "rtn", "opset": opset,
            "bytes": {"float32": 4 * shape[0] * shape[1], "quantized": qbytes}, "quantizer": how}


def _int4_table(model, gather, block_size: int, symmetric: bool):
    """``model`` with the table Gather ``gather`` as INT4 ``GatherBlockQuantized``, by
    ``MatMulNBitsQuantizer`` (it raises the opset to 21 for the INT4 tensor type)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    ops, axes = ("Gather",), (("Gather", 1),)
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=4,
                                          op_types_to_quantize=ops, quant_axes=axes)
    q = MatMulNBitsQuantizer(model, block_size=block_size, is_symmetric=symmetric, algo_config=config,
                             op_types_to_quantize=ops, quant_axes=axes)
    with contextlib.redirect_stdout(io.StringIO()):
        q.process()
    out = q.model.model if hasattr(q.model, "model") else q.model
    kinds = [n.op_type for n in out.graph.node if n.op_type in ("Gather", "GatherBlockQuantized")
             and n.output[0] == gather.output[0]]
    if kinds != ["GatherBlockQuantized"]:
        raise VlsensError(f"MatMulNBitsQuantizer left the table Gather {gather.name} as {kinds}")
    return out


def _int8_table(model, gather, table, block_size: int, symmetric: bool) -> None:
    """``model`` (in place) with the table Gather ``gather`` as ``GatherBlockQuantized`` (bits 8,
    gather axis 0, quantize axis 1) on :func:`rtn_rows` of ``table``: uint8 ``<table>_Q8``,
    ``<table>_scales`` and, asymmetric, uint8 ``<table>_zero_points``."""
    from onnx import helper, numpy_helper

    axis = next((helper.get_attribute_value(a) for a in gather.attribute if a.name == "axis"), 0)
    if axis != 0:
        raise VlsensError(f"{gather.name}: Gather along axis {axis}: not a table lookup")
    q, scales, zps = rtn_rows(numpy_helper.to_array(table), block_size, symmetric)
    ins = [numpy_helper.from_array(q, f"{table.name}_Q8"), numpy_helper.from_array(scales, f"{table.name}_scales")]
    if zps is not None:
        ins.append(numpy_helper.from_array(zps, f"{table.name}_zero_points"))
    del q, scales, zps
    names = [ins[0].name, gather.input[1], *[t.name for t in ins[1:]]]
    node = helper.make_node("GatherBlockQuantized", names, [gather.output[0]], name=f"{gather.name}_Q8",
                            domain="com.microsoft", bits=8, block_size=block_size, gather_axis=0, quantize_axis=1)
    _splice(model, gather, table.name, [node], ins)


def dequantize_table(model_path: str | Path) -> np.ndarray:
    """The FP32 table a ``GatherBlockQuantized`` graph gathers from, as its contrib-op spec
    defines it: ``(data - zero_point) * scale`` per block of ``block_size`` along
    ``quantize_axis``; without ``zero_points`` the op's default: 0 for INT4, 8 for UINT4, 128 for
    8-bit uint8 values (``bits`` 8)."""
    import onnx
    from onnx import numpy_helper

    path = Path(model_path)
    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    nodes = [n for n in m.graph.node if n.op_type == "GatherBlockQuantized"]
    if len(nodes) != 1:
        raise VlsensError(f"{path}: expected one GatherBlockQuantized, found {len(nodes)}")
    n = nodes[0]
    a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
    if int(a.get("quantize_axis", 1)) != 1 or int(a.get("gather_axis", 0)) != 0:
        raise VlsensError(f"{path}: {n.name} quantizes axis {a.get('quantize_axis')}: not a layout vlsens reads")
    bs, data = int(a["block_size"]), inits[n.input[0]]
    default = {onnx.TensorProto.INT4: 0, onnx.TensorProto.UINT4: 8}.get(data.data_type)
    if data.data_type == onnx.TensorProto.UINT8 and int(a.get("bits", 4)) == 8:
        default = 128
    if default is None:
        raise VlsensError(f"{path}: {n.name} holds {int(a.get('bits', 4))}-bit values of type {data.data_type}: "
                          "not a layout vlsens reads")
    q = numpy_helper.to_array(data).astype(np.float32)
    scale = numpy_helper.to_array(inits[n.input[2]]).astype(np.float32)
    rows, cols = q.shape
    zp = (numpy_helper.to_array(inits[n.input[3]]).astype(np.float32) if len(n.input) > 3 and n.input[3]
          else np.full_like(scale, default))
    w = (q.reshape(rows, -1, bs) - zp.reshape(rows, -1, 1)) * scale.reshape(rows, -1, 1)
    return np.ascontiguousarray(w.reshape(rows, cols), np.float32)


def embedding_reference(graph: str | Path, cases: Cases, image_token_id: int) -> Cases:
    """The embedding cases' expected outputs for the table ``graph`` holds: each text position's
    row of the dequantized table (the lookup transformers' ``nn.Embedding`` does), each image
    position's row unchanged (transformers' image features, merged as in the float reference)."""
    return _with_table(dequantize_table(graph), cases, image_token_id,
                       "the dequantized table of the graph (GatherBlockQuantized's spec)")


def _with_table(table: np.ndarray, cases: Cases, image_token_id: int, what: str) -> Cases:
    out = Cases(source=f"{what} at the text positions; image positions: {cases.source}")
    for c in cases:
        ids = c.inputs["input_ids"]
        expected = np.array(c.expected, np.float32, copy=True)
        text = ids != image_token_id
        expected[text] = table[ids[text]]
        out.add(Case(c.name, c.graph, c.inputs, expected, c.valid, c.logits, c.meta))
    return out


def embedding_cases(reference: str | Path) -> Cases:
    """The embedding graph's cases of the decoder's reference (none: an error naming the file)."""
    every = Cases.load(reference)
    cases = Cases(every.for_graph(EMBEDDING), source=every.source)
    if not len(cases):
        raise VlsensError(f"{reference}: no cases of {EMBEDDING}")
    return cases


def embedding_folder(decoder_dir: str | Path, reference: str | Path, out_dir: str | Path, block_size: int,
                     symmetric: bool, image_token_id: int, exact_tolerance: dict, threads: int = 0,
                     bits: int = 4) -> dict:
    """``out_dir/embedding.onnx``: the decoder folder's embedding graph with an INT4 or INT8 table
    (``bits``; ``block_size`` :data:`PER_CHANNEL`: one block a row, :func:`quantize_embedding`),
    gated on the embedding cases of ``reference`` against its own table at ``exact_tolerance``
    (FP32's), with the error against the checkpoint's table recorded; published with its record
    (variant ``embedding-int<bits>``), or nothing."""
    from vlsens.core.artifacts import publish_models, verify
    from vlsens.core.fsutil import staging_dir
    from vlsens.export import parity

    decoder_dir, out_dir = Path(decoder_dir), Path(out_dir)
    src = verify(decoder_dir / EMBEDDING)
    cases = embedding_cases(reference)
    with staging_dir(out_dir / EMBEDDING) as tmp:
        staged = {EMBEDDING: tmp / EMBEDDING}
        facts = quantize_embedding(src, staged[EMBEDDING], block_size, symmetric, bits)
        own = embedding_reference(staged[EMBEDDING], cases, image_token_id)
        per_input, providers, vs_float = parity.measure(staged, own, threads, "cpu", also=cases)
        extra = {"source": str(src), "graphs": {EMBEDDING: facts},
                 "float_reference": {"reference": cases.source, "note": f"the INT{bits} table against the "
                                     "checkpoint's own: the quantization error, measured, not gated",
                                     **parity.summary(vs_float), "per_input": vs_float}}
        record = parity.make_record(out_dir, f"embedding-int{bits}", per_input, exact_tolerance, own.source,
                                    providers, extra)
        parity.gate(record)
        publish_models(staged, record, out_dir, main=EMBEDDING)
    log.info("embedding: %d -> %d bytes; against the checkpoint's table min cosine %.6f", facts["bytes"]["float32"],
             facts["bytes"]["quantized"], extra["float_reference"]["metrics"]["min_cosine"])
    return record


# ----------------------------------------------------------------------------------------------
# The tied table (``deploy.nbits.embedding: tied``)


TIED_INPUTS = ("tied_table", "tied_scales", "tied_zero_points")


def _alias(t, name: str, dims, data_type: int):
    """A tensor proto that reads ``t``'s bytes where they are (its external data reference) as
    another shape / element type (the same bytes: a reinterpretation, no copy; a small tensor the
    decoder holds inline, under :data:`vlsens.core.onnxutil.INLINE_MAX_BYTES`, is copied)."""
    import onnx

    from vlsens.core.onnxutil import INLINE_MAX_BYTES

    if not any(e.key == "location" for e in t.external_data) and len(t.raw_data) >= INLINE_MAX_BYTES:
        raise VlsensError(f"{t.name}: {len(t.raw_data)} bytes inline; the tied table reads the decoder's data file")
    a = onnx.TensorProto()
    a.CopyFrom(t)
    a.name = name
    del a.dims[:]
    a.dims.extend(int(d) for d in dims)
    a.data_type = data_type
    return a


def tied_embedding(decoder: str | Path, embedding: str | Path, dst: str | Path) -> dict:
    """``dst`` (beside ``decoder``, no data file of its own): the embedding graph ``embedding``
    with its table Gather reading the decoder's ``lm_head`` weight where it is stored, in
    ``decoder``'s data file: for checkpoints that tie the two (``tie_word_embeddings``), the
    table is lm_head's weight, so the folder carries it once.

    * lm_head ``MatMulNBits``: :func:`_tied_quantized`;
    * lm_head float ``MatMul`` (weight (K, N)): ``Gather`` along axis 1 and a Transpose.

    Every row it gathers is the row lm_head multiplies by: gate it with :func:`tied_reference`."""
    import onnx

    from vlsens.quantize.nbits import lm_head

    decoder, dst = Path(decoder), Path(dst)
    if decoder.parent.resolve() != dst.parent.resolve():
        raise VlsensError(f"{dst}: the tied embedding graph must sit beside {decoder} (it reads its data file)")
    node, dinits = lm_head(onnx.load(str(decoder), load_external_data=False))
    em = onnx.load(str(embedding), load_external_data=False)
    gather, table = table_gather(em)
    vocab, hidden = (int(d) for d in table.dims)
    _inline_constants(em, table.name, Path(embedding).parent)
    ins, nodes, facts, (k, n) = (_tied_quantized if node.op_type == "MatMulNBits" else _tied_float)(node, dinits,
                                                                                                   gather)
    if (n, k) != (vocab, hidden):
        raise VlsensError(f"{decoder}: lm_head {node.name} is {k}x{n}; the embedding table is {vocab}x{hidden}: "
                          "not a tied table")
    _splice(em, gather, table.name, nodes, ins)
    data = decoder.with_name(decoder.name + ".data")
    _check_reads(ins, data)
    onnx.save_model(em, str(dst))
    shared = sum(int({e.key: e.value for e in t.external_data}.get("length", 0)) for t in ins)
    return {**facts, "reads": data.name, "shared_bytes": shared, "own_bytes": 0, "shape": [vocab, hidden],
            "float32_bytes": 4 * vocab * hidden}


def _inline_constants(em, table: str, folder: Path) -> None:
    """The embedding graph's initializers other than ``table`` (its small constants), loaded
    inline from ``folder`` (in place): the tied graph has no data file of its own."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for t in em.graph.initializer:
        if t.name != table and uses_external_data(t):
            load_external_data_for_tensor(t, str(folder))
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT


def _tied_quantized(node, dinits: dict, gather) -> tuple[list, list, dict, tuple[int, int]]:
    """``(initializers, nodes, facts, (K, N))`` replacing ``gather`` for a ``MatMulNBits`` lm_head
    (``B`` (N, blocks, block_size * bits / 8), ``scales``, optional ``zero_points``):
    ``GatherBlockQuantized`` (com.microsoft; ``bits``, ``block_size``, gather axis 0, quantize axis
    1; the same zero point default) on the same bytes read as (N, blocks * block_size * bits / 8)
    uint8, (N, blocks) scales and packed zero points, then a Slice when K is not a whole number of
    blocks (the layout the model builder's ``shared_embeddings`` uses inside one graph)."""
    from onnx import TensorProto, helper

    out = gather.output[0]
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    k, n, bits, bs = int(a["K"]), int(a["N"]), int(a["bits"]), int(a["block_size"])
    if len(node.input) > 4 and node.input[4]:
        raise VlsensError(f"{node.name}: g_idx: not a layout GatherBlockQuantized reads")
    blocks = -(-k // bs)
    ins = [_alias(dinits[node.input[1]], TIED_INPUTS[0], (n, blocks * bs * bits // 8), TensorProto.UINT8),
           _alias(dinits[node.input[2]], TIED_INPUTS[1], (n, blocks), dinits[node.input[2]].data_type)]
    if len(node.input) > 3 and node.input[3]:
        zp = dinits[node.input[3]]
        if zp.data_type != TensorProto.UINT8:
            raise VlsensError(f"{node.name}: zero points of type {zp.data_type}: not a layout vlsens reads")
        ins.append(_alias(zp, TIED_INPUTS[2], (n, -(-blocks * bits // 8)), TensorProto.UINT8))
    gathered = out if blocks * bs == k else f"{out}_padded"
    nodes = [helper.make_node("GatherBlockQuantized", [ins[0].name, gather.input[1], *[t.name for t in ins[1:]]],
                              [gathered], name=f"{gather.name}BlockQuantized", domain="com.microsoft",
                              bits=bits, block_size=bs, gather_axis=0, quantize_axis=1)]
    if gathered != out:
        consts = [helper.make_tensor(f"{out}_{x}", TensorProto.INT64, [1], [v])
                  for x, v in (("start", 0), ("end", k), ("axis", -1))]
        ins += consts
        nodes.append(helper.make_node("Slice", [gathered, *[c.name for c in consts]], [out],
                                      name=f"{gather.name}/Slice"))
    facts = {"lm_head": node.name, "bits": bits, "block_size": bs, "op": "GatherBlockQuantized"}
    return ins, nodes, facts, (k, n)


def _tied_float(node, dinits: dict, gather) -> tuple[list, list, dict, tuple[int, int]]:
    """As :func:`_tied_quantized` for a float ``MatMul`` lm_head (weight (K, N)): ``Gather`` along
    axis 1 and a Transpose."""
    from onnx import helper

    out = gather.output[0]
    w = dinits[node.input[1]]
    k, n = (int(d) for d in w.dims)
    ins = [_alias(w, TIED_INPUTS[0], (k, n), w.data_type)]
    nodes = [helper.make_node("Gather", [ins[0].name, gather.input[1]], [f"{out}_kfirst"], axis=1,
                              name=f"{gather.name}Columns"),
             helper.make_node("Transpose", [f"{out}_kfirst"], [out], perm=[1, 2, 0], name=f"{gather.name}/Transpose")]
    return ins, nodes, {"lm_head": node.name, "bits": 0, "op": "Gather (axis 1) + Transpose"}, (k, n)


def _splice(em, gather, table: str, nodes: list, ins: list) -> None:
    """``em`` with ``nodes`` in ``gather``'s place and ``ins`` for the table ``table`` (in place)."""
    from onnx import helper

    body = []
    for x in em.graph.node:
        body.extend(nodes if x is gather else [x])
    kept = [t for t in em.graph.initializer if t.name != table]
    del em.graph.node[:]
    em.graph.node.extend(body)
    del em.graph.initializer[:]
    em.graph.initializer.extend(kept + ins)
    if not any(o.domain == "com.microsoft" for o in em.opset_import):
        em.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _check_reads(ins: list, data: Path) -> None:
    """Every external reference of ``ins`` lies in the decoder's data file ``data``."""
    size = data.stat().st_size
    for t in ins:
        ext = {e.key: e.value for e in t.external_data}
        if ext.get("location") and (ext["location"] != data.name or int(ext["offset"]) + int(ext["length"]) > size):
            raise VlsensError(f"{t.name}: reads {ext} beyond {data.name} ({size} bytes)")


def tied_reference(decoder: str | Path, cases: Cases, image_token_id: int) -> Cases:
    """The embedding cases' expected outputs for a tied table: each text position's row of lm_head's
    weight as the decoder multiplies by it; image positions unchanged."""
    from vlsens.quantize.nbits import lm_head_table

    return _with_table(lm_head_table(decoder), cases, image_token_id,
                       f"lm_head's weight as {Path(decoder).name} multiplies by it")


def gate_tied(folder: str | Path, reference: str | Path, image_token_id: int, exact_tolerance: dict,
              threads: int = 0) -> dict:
    """Gate a folder's tied ``embedding.onnx`` on the decoder's embedding cases (``reference``)
    against lm_head's own rows at ``exact_tolerance`` (FP32's); the error against the checkpoint's
    table measured, not gated. Raises :class:`~vlsens.core.errors.ParityError` when it misses."""
    from vlsens.export import parity

    folder = Path(folder)
    cases = embedding_cases(reference)
    own = tied_reference(folder / "decoder.onnx", cases, image_token_id)
    per_input, providers, vs_float = parity.measure({EMBEDDING: folder / EMBEDDING}, own, threads, "cpu", also=cases)
    extra = {"float_reference": {"reference": cases.source, "note": "the tied table against the checkpoint's own: "
                                 "lm_head's quantization error, measured, not gated",
                                 **parity.summary(vs_float), "per_input": vs_float}}
    record = parity.make_record(folder, "embedding-tied", per_input, exact_tolerance, own.source, providers, extra)
    parity.gate(record)
    return record


# ----------------------------------------------------------------------------------------------
# The vision graph


def _matmul_name(gemm_name: str) -> str:
    m = re.match(r"^(.*)Gemm(_\d+)?$", gemm_name)
    return f"{m[1]}MatMul{m[2] or ''}" if m else f"{gemm_name}/MatMul"


def gemm_to_matmul(model) -> dict[str, str]:
    """Rewrite, in place, every ``Gemm`` of ``model`` (weights loaded) whose B is an initializer
    into ``MatMul(A, B')`` (+ ``Add(C)``), ``B'`` the ``(K, N)`` weight, so that ONNX Runtime's
    weight-only quantizer (MatMul only) reaches the Linears of an exported vision tower.
    ``alpha``/``beta`` other than 1 and ``transA`` raise. Returns ``{MatMul name: B's name}`` (the
    exporter names B after the Linear's parameter, ``<module>.weight``)."""
    from collections import Counter

    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    # a weight read by one node only is freed as soon as it is transposed (the tower's weights
    # are held once, not twice)
    readers = Counter(x for n in model.graph.node for x in n.input)
    nodes, names, done = [], {}, {}
    for n in model.graph.node:
        if n.op_type != "Gemm" or n.input[1] not in inits:
            nodes.append(n)
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        if float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0 or int(a.get("transA", 0)):
            raise VlsensError(f"{n.name}: Gemm with alpha/beta != 1 or transA: not a Linear vlsens rewrites")
        key = (n.input[1], int(a.get("transB", 0)))
        if key not in done:
            w = numpy_helper.to_array(inits[n.input[1]])
            w = np.ascontiguousarray(w.T if key[1] else w)
            done[key] = f"{n.input[1]}_KxN" if key[1] else f"{n.input[1]}_KN"
            model.graph.initializer.append(numpy_helper.from_array(w, done[key]))
            del w
            if readers[n.input[1]] == 1:
                inits[n.input[1]].ClearField("raw_data")
        mm = _matmul_name(n.name)
        names[mm] = n.input[1]
        has_bias = len(n.input) > 2 and n.input[2]
        mid = f"{n.output[0]}_matmul" if has_bias else n.output[0]
        nodes.append(helper.make_node("MatMul", [n.input[0], done[key]], [mid], name=mm))
        if has_bias:
            nodes.append(helper.make_node("Add", [mid, n.input[2]], [n.output[0]], name=f"{mm}/Bias"))
    still = {x for n in nodes for x in n.input}
    sources = {k for k, _ in done}
    kept = [t for t in model.graph.initializer if t.name in still or t.name not in sources]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return names


def linears(model) -> list[dict]:
    """The Linears :func:`gemm_to_matmul` and :func:`quantize_vision` reach, read from the graph
    alone (a path or ModelProto; no weight loaded): ``{"name": MatMul name, "K", "N", "weight": the
    initializer's name}`` in graph order (a ``Gemm`` by the name its MatMul will have, a ``MatMul``
    on a 2-D initializer by its own)."""
    import onnx
    from onnx import helper

    m = onnx.load(str(model), load_external_data=False) if not hasattr(model, "graph") else model
    inits = {i.name: i for i in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if len(n.input) < 2 or n.input[1] not in inits or len(inits[n.input[1]].dims) != 2:
            continue
        rows, cols = (int(d) for d in inits[n.input[1]].dims)
        if n.op_type == "Gemm":
            trans = int({x.name: helper.get_attribute_value(x) for x in n.attribute}.get("transB", 0))
            out.append({"name": _matmul_name(n.name), "K": cols if trans else rows, "N": rows if trans else cols,
                        "weight": n.input[1]})
        elif n.op_type == "MatMul":
            out.append({"name": n.name, "K": rows, "N": cols, "weight": n.input[1]})
    return out


def linear_module(model, weight_name: str):
    """transformers' Linear behind an exported weight ``<module path>.weight`` (the checkpoint's
    names; transformers 5 nests the towers under ``model.``)."""
    path = weight_name.removesuffix(".weight")
    for p in (path, f"model.{path}"):
        with contextlib.suppress(AttributeError):
            return model.get_submodule(p)
    raise VlsensError(f"{weight_name}: no module {path} in {type(model).__name__}")


def linear_for(model, weight_name: str, name: str, w, source):
    """transformers' Linear behind ``weight_name`` (:func:`linear_module`), checked to hold the
    transpose of ``w`` (K, N), the weight ``source``'s node ``name`` multiplies by; VlsensError
    naming both otherwise."""
    linear = linear_module(model, weight_name)
    if tuple(linear.weight.shape) != (w.shape[1], w.shape[0]):
        raise VlsensError(f"{source}: {name} is {w.shape[0]}x{w.shape[1]}; {weight_name} holds "
                          f"{tuple(linear.weight.shape)} (transposed)")
    return linear


def vision_weight_reference(checkpoint, graph: str | Path, cases: Cases, weights: dict[str, str]) -> Cases:
    """``cases`` (the dynamic vision graph's) with transformers' features recomputed after every
    Linear that ``graph`` quantized is given the dequantized weight it multiplies by; ``weights``:
    ``{MatMul name: exported weight name}`` (:func:`gemm_to_matmul`)."""
    import torch

    from vlsens.core.onnxgraph import dequantize_matmulnbits
    from vlsens.export.towers.vision_fixed import image_features
    from vlsens.model.loading import VISION_PART, load_model

    model = load_model(checkpoint, attn_implementation="eager", part=VISION_PART)
    replaced = 0
    for name, w in dequantize_matmulnbits(graph):
        linear = linear_for(model, weights[name], name, w, graph)
        linear.weight = torch.nn.Parameter(torch.from_numpy(w.T.copy()), requires_grad=False)
        replaced += 1
    log.info("%s: %d quantized weights in transformers' vision tower; recomputing %d cases", graph, replaced, len(cases))
    out = Cases(source=f"transformers {type(model.model).__name__}.get_image_features (PyTorch, float32) with the "
                       f"graph's own weights: {replaced} Linears dequantized (vlsens.core.onnxgraph.dequantize_matmulnbits)")
    for c in cases:
        pv = torch.from_numpy(c.inputs["patches"])
        grid = torch.tensor(c.meta["grid_thw"], dtype=torch.long)
        feats = image_features(model, pv, grid, video=c.name.startswith("clip-"))
        out.add(Case(c.name, c.graph, c.inputs, np.concatenate(feats), c.valid, c.logits, c.meta))
    del model
    return out


#: The block sizes ONNX Runtime's CPU ``MatMulNBits`` kernel loads (1.31: its constructor
#: enforces 16, 32, 64, 128 or 256, at 4 and at 8 bits): a per-channel block of a wider K does not.
MATMULNBITS_BLOCKS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class WeightFormat:
    """A weight-only format of the vision graph's Linears: the variant folder's ``name``, ``bits``
    (4 or 8), and where not None the ``algorithm``, ``block_size``, ``symmetric`` and
    ``accuracy_level`` that replace the run's (``deploy.nbits``, :class:`~vlsens.quantize.nbits.NBitsSettings`).
    ``block_size`` :data:`PER_CHANNEL`: one block per output channel where ``MatMulNBits`` has one
    that wide (:meth:`block_for`)."""

    name: str = "int4"
    bits: int = 4
    algorithm: str | None = None
    block_size: int | None = None
    symmetric: bool | None = None
    accuracy_level: int | None = None

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise ValueError(f"weight format {self.name}: bits {self.bits}; 4 or 8")
        if self.block_size not in (None, PER_CHANNEL, *MATMULNBITS_BLOCKS):
            raise ValueError(f"weight format {self.name}: block size {self.block_size}; MatMulNBits runs "
                             f"{list(MATMULNBITS_BLOCKS)} (or PER_CHANNEL)")

    def block_for(self, k: int, run) -> int:
        """The block of a Linear of ``k`` inputs: the format's, else the run's; per channel the
        narrowest of :data:`MATMULNBITS_BLOCKS` that holds ``k`` (K padded to it, one scale a
        column), past 256 blocks of 256 (Qwen2.5-VL's vision K: 1280, 3420 and 5120)."""
        if self.block_size is None:
            return run.block_size
        if self.block_size != PER_CHANNEL:
            return self.block_size
        return next((b for b in MATMULNBITS_BLOCKS if b >= k), MATMULNBITS_BLOCKS[-1])

    def settings(self, run, k: int):
        """The :class:`~vlsens.quantize.nbits.NBitsSettings` a Linear of ``k`` inputs is quantized at."""
        mine = {"algorithm": self.algorithm, "symmetric": self.symmetric, "accuracy_level": self.accuracy_level}
        return replace(run, block_size=self.block_for(k, run), **{f: v for f, v in mine.items() if v is not None})


#: Olive's Qwen2.5-VL CPU recipe for the vision graph: INT4 RTN in blocks of 128.
INT4_RTN128 = WeightFormat("int4-rtn128", 4, algorithm="rtn", block_size=128)
#: optimum-intel's default for vision and embeddings: INT8 weight-only, per channel, asymmetric
#: (NNCF's INT8_ASYM); RTN, ``MatMulNBits`` zero points; float activations (``accuracy_level`` 0:
#: OpenVINO's weight-only INT8 dequantizes the weights and keeps activations float, where the
#: CPU's level 4 would quantize them to INT8 per block: 60x the KL on the tiny preset, 5.4e-5 against 9.1e-7).
INT8_WO = WeightFormat("int8-wo", 8, algorithm="rtn", block_size=PER_CHANNEL, symmetric=False, accuracy_level=0)
#: The formats by variant name (``int4``: the run's own settings).
FORMATS = {f.name: f for f in (WeightFormat(), INT4_RTN128, INT8_WO)}
#: A vision graph whose Linears each have their own format (a plan's ``vision_ops``).
MIXED = "mixed"


def quantize_vision(src: str | Path, staged: str | Path, settings,
                    fmt: WeightFormat | int | None = None,
                    per_op: Mapping[str, WeightFormat | None] | None = None) -> tuple[dict, dict[str, str]]:
    """``staged`` (+ data file): the FP32 vision graph ``src`` with every Linear weight-only
    quantized in format ``fmt`` (None: the run's ``settings`` at INT4; an int: those bits) on
    ``settings`` (:func:`gemm_to_matmul`, then :func:`vlsens.quantize.nbits.quantize`, once per
    block size and width the formats give the Linears). ``per_op`` (a mixed graph): every Linear's
    own format by MatMul name (None: left float), instead of ``fmt`` for all; a Linear it misses,
    or a name the graph lacks, is a VlsensError. Returns ``(facts, {MatMul name: exported weight name})``."""
    import shutil

    import onnx

    from vlsens.core.onnxutil import copy_model, save_with_external_data
    from vlsens.quantize.nbits import quantize, weight_matmuls

    fmt = fmt if isinstance(fmt, WeightFormat) else WeightFormat(bits=fmt or 4, name=f"int{fmt or 4}")
    staged = Path(staged)
    work = staged.parent / ".float"
    work.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src))
    weights = gemm_to_matmul(model)
    current = save_with_external_data(model, work / "model.onnx")
    del model
    ops = weight_matmuls(current)
    if per_op is not None:
        names = {o["name"] for o in ops}
        missing, extra = sorted(names - set(per_op)), sorted(set(per_op) - names)
        if missing or extra:
            shutil.rmtree(work)
            raise VlsensError(f"{src}: a mixed vision graph names every Linear's MatMul: missing {missing[:5]} "
                              f"({len(missing)}), extra {extra[:5]} ({len(extra)})")
    formats = {o["name"]: (per_op[o["name"]] if per_op is not None else fmt) for o in ops}
    groups: dict = {}
    for o in ops:
        f = formats[o["name"]]
        if f is not None:
            groups.setdefault((f.settings(settings, o["K"]), f.bits), []).append(o["name"])
    for i, ((at, bits), group) in enumerate(groups.items()):
        dst = staged if i == len(groups) - 1 else work / f"step{i}.onnx"
        current = quantize(current, dst, dict.fromkeys(group, bits), at)
    if not groups:
        copy_model(current, staged)
    shutil.rmtree(work)
    if per_op is not None:
        return _mixed_facts(staged, ops, formats, settings, weights), weights
    return _vision_facts(staged, ops, fmt, settings, weights), weights


class VisionSplice:
    """Vision graphs that differ from one float graph (``base``: :func:`quantize_vision`'s float
    form, every Linear a MatMul, wrapped or not) only in which Linears are weight-only, each written
    as a graph file beside ``base`` (:meth:`write`): its float weights are read from ``base``'s
    data file, each quantized Linear's ``MatMulNBits`` node and tensors are taken from a graph of
    ``sources`` (format name -> a graph :func:`quantize_vision` wrote from the same float graph with
    every Linear in that format, on ``settings``). The run's formats are data-free (RTN, k_quant:
    :class:`~vlsens.quantize.nbits.NBitsSettings` admits no other), which quantize each Linear on its
    own, so a Linear's node is the one :func:`quantize_vision` writes for it in any mix
    (``tests/test_chain.py``: the same tensors, the same measure). A variant's own files are its
    graph and its quantized tensors, where :func:`quantize_vision` and
    :func:`~vlsens.deploy.genai.folder.wrap_vision` write the whole graph three times (2.7 GB each
    at 3B): for measuring many mixes of one graph, not for shipping (a variant reads another
    graph's data file)."""

    def __init__(self, base: str | Path, sources: Mapping[str, str | Path], settings):
        import onnx

        self.base, self.settings = Path(base), settings
        self.model = onnx.load(str(self.base), load_external_data=False)
        self.ops = {o["name"]: o for o in linears(self.model)}
        self.sources: dict[str, tuple[Path, dict, dict]] = {}
        for fmt, path in sources.items():
            self._check_source(fmt, Path(path))
            m = onnx.load(str(path), load_external_data=False)
            nodes = {n.name.rsplit("_Q", 1)[0]: n for n in m.graph.node if n.op_type == "MatMulNBits"}
            missing = sorted(set(self.ops) - set(nodes))
            if missing:
                raise VlsensError(f"{path}: Linears not quantized: {missing[:5]} ({len(missing)}); a source of "
                                  f"format {fmt} quantizes every Linear of {self.base}")
            self.sources[fmt] = (Path(path), nodes, {t.name: t for t in m.graph.initializer})

    def _check_source(self, fmt: str, path: Path) -> None:
        """A source whose record (``parity.json`` beside it, where it has one: its variant job's)
        names another format or other settings than this run's would put another graph's nodes in
        the variants: refused."""
        import json

        record = path.with_name("parity.json")
        if fmt not in FORMATS:
            raise VlsensError(f"vision format {fmt!r}: one of {sorted(FORMATS)}")
        if not record.is_file():
            return
        f = json.loads(record.read_text()).get("extra", {}).get("graphs", {}).get(path.name)
        if f is not None and (f.get("format") != fmt or f.get("run_settings") != self.settings.as_dict()):
            raise VlsensError(f"{path}: quantized as {f.get('format')!r} on {f.get('run_settings')}, not as "
                              f"{fmt!r} on the run's {self.settings.as_dict()}; rebuild it (its variant job)")

    def write(self, name: str, per_op: Mapping[str, str | None]) -> tuple[Path, int]:
        """``<name>.onnx`` (+ its data file) beside ``base``: every Linear of ``per_op`` (MatMul name
        -> a format of ``sources``, or None: float) in its format, and the bytes the graph would
        ship as one file (its graph plus every tensor it reads; :func:`quantize_vision`'s graph of
        the same mix differs only in its data offsets' digits)."""
        import onnx

        from vlsens.core.onnxutil import DataFile, _chunks, _external_range, data_path, external_extents
        from vlsens.quantize.nbits import splice_quantized

        unknown = sorted(set(per_op) - set(self.ops))
        if unknown:
            raise VlsensError(f"{self.base}: not Linears of the vision graph: {unknown[:5]} ({len(unknown)})")
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        dst = self.base.with_name(f"{name}.onnx")
        changed = {op: f for op, f in per_op.items() if f is not None}
        graph_inputs = {i.name for i in model.graph.input}
        done = {}
        with DataFile(data_path(dst)) as out:
            for node in model.graph.node:
                if node.name not in changed:
                    continue
                src, qnodes, inits = self.sources[changed[node.name]]
                q = onnx.NodeProto()
                q.CopyFrom(qnodes[node.name])
                if q.input[0] != node.input[0] and q.input[0] not in graph_inputs:  # the patch embedding: the graph's input
                    raise VlsensError(f"{src}: {q.name} reads {q.input[0]}, not its MatMul's input (an input scale): "
                                      "a spliced vision graph takes weight-only nodes alone")
                tensors = []
                for x in q.input[1:]:
                    if x not in inits:
                        continue
                    t = onnx.TensorProto()
                    t.CopyFrom(inits[x])
                    if t.data_location == onnx.TensorProto.EXTERNAL:
                        path, offset, length = _external_range(t, src.parent)
                        out.add(t, _chunks(path, offset, length))
                    tensors.append(t)
                done[node.name] = (q, tensors)
        splice_quantized(model, done)  # in each MatMul's place; the float weights nothing reads dropped
        onnx.save_model(model, str(dst))
        shipped = dst.stat().st_size + sum(n for spans in external_extents(model, dst.parent).values() for _, n in spans)
        return dst, shipped

    def remove(self, name: str) -> None:
        """A variant's own files."""
        from vlsens.core.onnxutil import data_path

        dst = self.base.with_name(f"{name}.onnx")
        dst.unlink(missing_ok=True)
        data_path(dst).unlink(missing_ok=True)


def _mixed_facts(staged: Path, ops: list[dict], formats: Mapping, settings, weights: dict[str, str]) -> dict:
    """The record's facts of a mixed vision graph: per Linear its format, bits and bytes as stored."""
    from vlsens.quantize.nbits import float_bytes, quantized_nodes

    q, fb = quantized_nodes(staged), float_bytes(ops)
    linears = {o["name"]: {"format": formats[o["name"]].name if formats[o["name"]] else "float",
                           "bits": formats[o["name"]].bits if formats[o["name"]] else FLOAT,
                           "weight_bytes": q[o["name"]]["bytes"] if o["name"] in q else fb[o["name"]],
                           "float32_bytes": fb[o["name"]]} for o in ops}
    count = Counter(v["format"] for v in linears.values())
    return {"format": MIXED, "linears": len(weights), "formats": dict(sorted(count.items())),
            "weight_bytes": sum(v["weight_bytes"] for v in linears.values()),
            "float32_bytes": sum(v["float32_bytes"] for v in linears.values()), "run_settings": settings.as_dict(),
            "by_linear": linears,
            "quantizer": f"{QUANTIZER} (vlsens.quantize.nbits.quantize) after vlsens.precision.weight_only.gemm_to_matmul",
            "weights": weights}


def _vision_facts(staged: Path, ops: list[dict], fmt: WeightFormat, settings, weights: dict[str, str]) -> dict:
    """The record's facts of a quantized vision graph: its format, the run's settings, and per K
    (the Linears' input width) the block, the number of Linears and their weight bytes as stored
    (values, scales, zero points) and in float32."""
    from vlsens.quantize.nbits import float_bytes, quantized_nodes

    q, fb = quantized_nodes(staged), float_bytes(ops)
    by_k: dict[str, dict] = {}
    for o in ops:
        row = by_k.setdefault(str(o["K"]), {"block_size": fmt.block_for(o["K"], settings), "linears": 0,
                                            "weight_bytes": 0, "float32_bytes": 0})
        row["linears"] += 1
        row["weight_bytes"] += q[o["name"]]["bytes"]
        row["float32_bytes"] += fb[o["name"]]
    at = fmt.settings(settings, max(o["K"] for o in ops)).as_dict()
    blocks = {r["block_size"] for r in by_k.values()}
    return {"format": fmt.name, "linears": len(weights), "bits": fmt.bits, "algorithm": at["algorithm"],
            "symmetric": at["symmetric"], "accuracy_level": at["accuracy_level"],
            "block_size": blocks.pop() if len(blocks) == 1 else "per-channel",
            "per_channel": fmt.block_size == PER_CHANNEL, "by_k": by_k,
            "weight_bytes": sum(r["weight_bytes"] for r in by_k.values()),
            "float32_bytes": sum(r["float32_bytes"] for r in by_k.values()), "run_settings": settings.as_dict(),
            "quantizer": f"{QUANTIZER} (vlsens.quantize.nbits.quantize) after vlsens.precision.weight_only.gemm_to_matmul",
            "weights": weights}


def vision_folder(checkpoint, src_dir: str | Path, reference: str | Path, out_dir: str | Path, settings,
                  tolerance: dict, exact_tolerance: dict, threads: int = 0,
                  fmt: WeightFormat | Mapping[str, WeightFormat | None] | None = None) -> dict:
    """The dynamic vision graph with weight-only Linears in format ``fmt`` (None: INT4 at the run's
    ``settings``, variant ``int4``), or each in its own (``fmt`` a mapping MatMul name -> format or
    None for float, variant :data:`MIXED`), as a variant folder named after the format, gated
    against transformers on its own weights (:func:`vlsens.variants.gate_own_weights`)."""
    from vlsens.variants import Gate, variant_folder

    per_op = fmt if isinstance(fmt, Mapping) else None
    fmt = WeightFormat() if per_op is not None or fmt is None else fmt
    found: dict[str, str] = {}

    def transform(src: Path, feeds, staged: Path) -> dict:
        facts, weights = quantize_vision(src, staged, settings, fmt, per_op)
        found.update(weights)
        return facts

    def own(staged, cases):
        return vision_weight_reference(checkpoint, staged["model.onnx"], cases, found)

    return variant_folder(src_dir, reference, out_dir, MIXED if per_op is not None else fmt.name, transform,
                          Gate(tolerance, threads, reference_for=own, exact_tolerance=exact_tolerance))
