"""Weight-only INT4 / INT8 of the deploy folders' embedding table (GatherBlockQuantized) and vision
Linears (MatMulNBits), in vlsens' own format and the formats peers ship (Olive's INT4 RTN block
128, optimum-intel's INT8 per channel): built by ONNX Runtime's quantizer (or its arithmetic), run
by ONNX Runtime and onnxruntime-genai, gated on their own weights."""

import json

import numpy as np
import onnx
import pytest
from conftest import TOL_FP32

from vlsens.core.errors import ParityError, VlsensError
from vlsens.core.onnxutil import make_session
from vlsens.data.cases import Cases
from vlsens.precision.weight_only import (
    INT4_RTN128,
    INT8_WO,
    PER_CHANNEL,
    dequantize_table,
    embedding_folder,
    gemm_to_matmul,
    rtn_rows,
    vision_folder,
)
from vlsens.quantize.nbits import NBitsSettings

TOL_INT4 = {"min_cosine": 0.98, "max_rel_error": 0.3}


def _image_token(ckpt) -> int:
    return int(json.loads((ckpt / "config.json").read_text())["image_token_id"])


@pytest.mark.parametrize("block_size", [32, 64])
def test_int4_embedding_is_exact_on_its_own_table_and_a_quarter_of_the_bytes(graph_builder, tmp_path, block_size):
    b = graph_builder("decoder")
    out = tmp_path / "emb"
    rec = embedding_folder(b.folder("fp32"), b.reference, out, block_size, True, _image_token(b.ckpt), TOL_FP32,
                           threads=2)
    assert rec["passed"] and rec["metrics"]["max_rel_error"] < 1e-6  # a lookup of the table it holds
    fr = rec["extra"]["float_reference"]["metrics"]  # against the checkpoint's table: INT4 noise, measured
    assert 0.99 < fr["min_cosine"] < 1 - 1e-6
    m = onnx.load(str(out / "embedding.onnx"), load_external_data=False)
    assert [n.op_type for n in m.graph.node].count("GatherBlockQuantized") == 1
    facts = rec["extra"]["graphs"]["embedding.onnx"]
    rows, cols = facts["shape"]
    # INT4 values and one FP32 scale per block: 0.5 + 4 / block_size bytes per weight
    assert facts["bytes"]["quantized"] == rows * cols // 2 + 4 * rows * cols // block_size
    assert (out / "embedding.onnx.data").stat().st_size == facts["bytes"]["quantized"]
    # the dequantized table is the checkpoint's within one INT4 step per block (half a step but
    # where +absmax clips to 7 steps, the block's -absmax taking -8)
    ref = onnx.load(str(b.folder("fp32") / "embedding.onnx"))
    w = onnx.numpy_helper.to_array(next(t for t in ref.graph.initializer if t.name == facts["table"]))
    dq = dequantize_table(out / "embedding.onnx")
    step = np.abs(w.reshape(rows, -1, block_size)).max(-1, keepdims=True) / 8  # the extreme maps to -8
    err = np.abs(dq - w).reshape(rows, -1, block_size)
    assert (err <= step + 1e-6).all() and err.mean() < (step / 4).mean()
    # ONNX Runtime's kernel gathers exactly those rows
    ids = np.array([[0, 5, rows - 1, 3]], np.int64)
    got = make_session(out / "embedding.onnx").run(None, {"input_ids": ids,
                                                          "image_features": np.zeros((0, cols), np.float32)})[0]
    np.testing.assert_array_equal(got[0], dq[ids[0]])


def test_int4_embedding_gate_fails_and_writes_nothing(graph_builder, tmp_path):
    """A wrong image token id puts text rows where transformers put image features: the gate
    fails and no folder appears."""
    b = graph_builder("decoder")
    with pytest.raises(ParityError):
        embedding_folder(b.folder("fp32"), b.reference, tmp_path / "emb", 32, True, _image_token(b.ckpt) + 1,
                         TOL_FP32, threads=2)
    assert not (tmp_path / "emb" / "embedding.onnx").exists()


def test_gemm_to_matmul_is_exact_in_float(graph_builder, tmp_path):
    from vlsens.core.onnxutil import save_with_external_data

    b = graph_builder("vision/dynamic")
    m = onnx.load(str(b.model("fp32")))
    gemms = sum(n.op_type == "Gemm" for n in m.graph.node)
    names = gemm_to_matmul(m)
    assert len(names) == gemms > 0 and not any(n.op_type == "Gemm" for n in m.graph.node)
    assert all(w.endswith(".weight") for w in names.values())
    path = save_with_external_data(m, tmp_path / "model.onnx")
    case = next(iter(Cases.load(b.reference)))
    want = make_session(b.model("fp32")).run(None, case.inputs)[0]
    got = make_session(path).run(None, case.inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int4_vision_is_gated_on_its_own_weights(graph_builder, tmp_path):
    b = graph_builder("vision/dynamic")
    settings = NBitsSettings(algorithm="rtn", block_size=32)
    rec = vision_folder(b.ckpt, b.folder("fp32"), b.reference, tmp_path / "int4", settings, TOL_INT4, TOL_FP32,
                        threads=2)
    assert rec["passed"] and rec["extra"]["exact"]["passed"]
    assert rec["extra"]["exact"]["metrics"]["max_rel_error"] < 1e-5  # float activations: exact to rounding
    fr = rec["extra"]["float_reference"]["metrics"]
    assert fr["min_cosine"] < rec["metrics"]["min_cosine"]  # the quantization error shows against the checkpoint
    m = onnx.load(str(tmp_path / "int4" / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in m.graph.node]
    facts = rec["extra"]["graphs"]["model.onnx"]
    assert ops.count("MatMulNBits") == facts["linears"] > 0 and "Gemm" not in ops
    src = (b.folder("fp32") / "model.onnx.data").stat().st_size
    assert (tmp_path / "int4" / "model.onnx.data").stat().st_size < 0.4 * src


def test_int4_vision_gate_catches_a_wrong_weight(graph_builder, tmp_path, monkeypatch):
    """Two same-shaped Linears swapped in the reference's mapping: the graph no longer computes
    what transformers does with its weights, so the exact gate fails and nothing is written."""
    from vlsens.precision import weight_only

    b = graph_builder("vision/dynamic")
    real = weight_only.quantize_vision

    def swapped(src, staged, settings, fmt=None, per_op=None):
        facts, weights = real(src, staged, settings, fmt, per_op)
        qkv = sorted(k for k in weights if "attn/qkv" in k)
        weights[qkv[0]], weights[qkv[1]] = weights[qkv[1]], weights[qkv[0]]
        return facts, weights

    monkeypatch.setattr(weight_only, "quantize_vision", swapped)
    with pytest.raises(ParityError, match="own weights"):
        vision_folder(b.ckpt, b.folder("fp32"), b.reference, tmp_path / "int4", NBitsSettings(algorithm="rtn"),
                      TOL_INT4, TOL_FP32, threads=2)
    assert not (tmp_path / "int4" / "model.onnx").exists()


# ----------------------------------------------------------------------------------------------
# INT8 tables and the peers' vision formats


def _table(b):
    ref = onnx.load(str(b.folder("fp32") / "embedding.onnx"))
    gather = next(n for n in ref.graph.node if n.op_type == "Gather")
    return onnx.numpy_helper.to_array(next(t for t in ref.graph.initializer if t.name == gather.input[0]))


@pytest.mark.parametrize("block_size", [16, 64, 128, 256])
@pytest.mark.parametrize("symmetric", [True, False])
def test_rtn_rows_is_onnx_runtimes_8bit_block_quantizer_byte_for_byte(symmetric, block_size):
    """Where ONNX Runtime's 8-bit block routine runs (blocks up to 256; the table transposed is a
    MatMul weight, each row one output column), rtn_rows writes the same values, scales and zero
    points: the per-row INT8 table is that arithmetic on a wider block. Rows of zeros, of one sign
    and of a single spike included."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    rng = np.random.default_rng(block_size)
    t = (rng.standard_normal((700, 512)) * rng.random((700, 1)) * 3).astype(np.float32)
    t[0], t[1], t[2] = 0, np.abs(t[2]), -np.abs(t[3])
    t[4, 7] = 50.0
    ort_q = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric,
                                                                    bits=8))
    packed, scales, zp = ort_q.qbits_block_quant(np.ascontiguousarray(t.T))
    q, s, z = rtn_rows(t, block_size, symmetric, rows_at_once=256)  # several chunks
    np.testing.assert_array_equal(q, packed.reshape(q.shape))
    np.testing.assert_array_equal(s, scales)
    assert z is None if symmetric else np.array_equal(z, zp)


def _one_node_session(node, inits, inp, out_shape):
    """An ONNX Runtime CPU session of one contrib node (float output)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = helper.make_graph([node], "g", [inp], [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT,
                                                                              out_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=10)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def test_onnx_runtime_runs_the_formats_and_refuses_wider_matmul_blocks():
    """What the formats rest on (ONNX Runtime's CPU kernels): MatMulNBits at 8 bits with uint8 zero
    points in each block of MATMULNBITS_BLOCKS and no wider (a per-channel block of K = 1280 does
    not load); GatherBlockQuantized at 8 bits in a block as wide as a 3B table's row (2048), with
    the default zero point 128 when none is given."""
    from onnx import TensorProto, helper, numpy_helper

    from vlsens.precision.weight_only import MATMULNBITS_BLOCKS

    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1280])
    for block in (*MATMULNBITS_BLOCKS, 1280, 512):
        blocks = -(-1280 // block)
        inits = [numpy_helper.from_array(rng.integers(0, 256, (8, blocks, block), dtype=np.uint8), "B"),
                 numpy_helper.from_array(rng.random(8 * blocks, dtype=np.float32), "S"),
                 numpy_helper.from_array(rng.integers(0, 256, (8, blocks), dtype=np.uint8), "Z")]
        node = helper.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["y"], domain="com.microsoft", K=1280, N=8,
                                bits=8, block_size=block)
        if block in MATMULNBITS_BLOCKS:
            _one_node_session(node, inits, x, [1, 8]).run(None, {"x": np.ones((1, 1280), np.float32)})
        else:
            with pytest.raises(Exception, match="block sizes 16, 32, 64, 128, and 256"):
                _one_node_session(node, inits, x, [1, 8])
    q, scale = rng.integers(0, 256, (5, 2048), dtype=np.uint8), rng.random((5, 1), dtype=np.float32)
    node = helper.make_node("GatherBlockQuantized", ["T", "ids", "S"], ["y"], domain="com.microsoft", bits=8,
                            block_size=2048, gather_axis=0, quantize_axis=1)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2])
    sess = _one_node_session(node, [numpy_helper.from_array(q, "T"), numpy_helper.from_array(scale, "S")], ids,
                             [2, 2048])
    got = sess.run(None, {"ids": np.array([3, 0], np.int64)})[0]
    np.testing.assert_array_equal(got, ((q.astype(np.float32) - 128) * scale)[[3, 0]])


@pytest.mark.parametrize("symmetric", [False, True])
def test_int8_per_row_embedding_is_exact_on_its_own_table_and_closer_than_int4(graph_builder, tmp_path, symmetric):
    """INT8 GatherBlockQuantized, one block a row (PER_CHANNEL: the tiny table is 64 wide, a power
    of two, so the block is the row): ONNX Runtime's CPU kernel gathers the dequantized table's
    rows exactly, the bytes are a quarter of FP32's plus one scale (and zero point) a row, and the
    table is nearer the checkpoint's than the INT4 one (block 32) in every row."""
    b = graph_builder("decoder")
    token = _image_token(b.ckpt)
    rec = embedding_folder(b.folder("fp32"), b.reference, tmp_path / "int8", PER_CHANNEL, symmetric, token, TOL_FP32,
                           threads=2, bits=8)
    assert rec["passed"] and rec["metrics"]["max_rel_error"] < 1e-6 and rec["variant"] == "embedding-int8"
    facts = rec["extra"]["graphs"]["embedding.onnx"]
    rows, cols = facts["shape"]
    assert (facts["bits"], facts["block_size"], facts["per_channel"], facts["symmetric"]) == (8, cols, True, symmetric)
    # one uint8 a weight, one FP32 scale a row, asymmetric one uint8 zero point a row
    assert facts["bytes"]["quantized"] == rows * cols + 4 * rows + (0 if symmetric else rows)
    m = onnx.load(str(tmp_path / "int8" / "embedding.onnx"), load_external_data=False)
    inline = sum(len(t.raw_data) for t in m.graph.initializer if t.name.startswith(facts["table"]))  # small ones
    assert (tmp_path / "int8" / "embedding.onnx.data").stat().st_size + inline == facts["bytes"]["quantized"]
    (node,) = [n for n in m.graph.node if n.op_type == "GatherBlockQuantized"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["bits"], attrs["block_size"], len(node.input)) == (8, cols, 3 if symmetric else 4)
    dq = dequantize_table(tmp_path / "int8" / "embedding.onnx")
    ids = np.array([[i for i in range(rows) if i != token]], np.int64)  # every text row
    got = make_session(tmp_path / "int8" / "embedding.onnx").run(
        None, {"input_ids": ids, "image_features": np.zeros((0, cols), np.float32)})[0]
    np.testing.assert_array_equal(got[0], dq[ids[0]])  # as the kernel gathers them
    w = _table(b)
    # one step of its own row at most (half a step but at the clipped end of a row), a quarter on average
    step = (np.abs(w).max(1, keepdims=True) / 128 if symmetric
            else (np.maximum(w.max(1, keepdims=True), 0) - np.minimum(w.min(1, keepdims=True), 0)) / 255)
    assert (np.abs(dq - w) <= step * (1 + 1e-5)).all() and (np.abs(dq - w) / step).mean() < 0.3
    embedding_folder(b.folder("fp32"), b.reference, tmp_path / "int4", 32, True, token, TOL_FP32, threads=2)
    err8, err4 = np.abs(dq - w).max(1), np.abs(dequantize_table(tmp_path / "int4" / "embedding.onnx") - w).max(1)
    assert (err8 < err4).all() and err8.mean() < err4.mean() / 4
    fr = rec["extra"]["float_reference"]["metrics"]
    assert fr["min_cosine"] > 0.9999 and fr["min_cosine"] < 1


def _nbits_nodes(path):
    """``[(K, N, bits, block_size, has zero points)]`` of a graph's MatMulNBits nodes."""
    m = onnx.load(str(path), load_external_data=False)
    out = []
    for n in m.graph.node:
        if n.op_type == "MatMulNBits":
            a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            out.append((a["K"], a["N"], a["bits"], a["block_size"], len(n.input) > 3 and bool(n.input[3])))
    return out


def _stored_bytes(k, n, bits, block, zp):
    """MatMulNBits' bytes as its spec lays them out: K padded to whole blocks of values, one FP32
    scale a block, zero points packed like the values (a byte each at 8 bits, two a byte at 4)."""
    blocks = -(-k // block)
    return n * (blocks * block * bits // 8 + 4 * blocks + (-(-blocks * bits // 8) if zp else 0))


@pytest.fixture(scope="module")
def peer_vision(graph_builder, tmp_path_factory):
    """The tiny dynamic vision graph in the peers' two formats (int4-rtn128, int8-wo)."""
    b = graph_builder("vision/dynamic")
    root = tmp_path_factory.mktemp("peer-vision")
    run = NBitsSettings(algorithm="k_quant", block_size=32, symmetric=True)  # the run's: the formats set their own
    return b, {f.name: (root / f.name, vision_folder(b.ckpt, b.folder("fp32"), b.reference, root / f.name, run,
                                                     TOL_INT4, TOL_FP32, threads=2, fmt=f))
               for f in (INT4_RTN128, INT8_WO)}


@pytest.mark.parametrize("fmt", [INT4_RTN128, INT8_WO], ids=lambda f: f.name)
def test_peer_vision_formats_pass_their_gates_at_their_bytes(peer_vision, fmt):
    """int4-rtn128 (Olive's recipe: RTN, blocks of 128, symmetric as the run's) and int8-wo
    (optimum-intel's: RTN, a block per output channel, asymmetric with zero points) pass the exact
    gate against transformers on their own weights, also where K (64) is not a whole block of 128
    (MatMulNBits pads K with zeros; the dequantized weight drops the padding).

    Bytes, scales and zero points counted, against the Linears' FP32 weights: int4-rtn128 at
    (64 + 4) / 512 = 0.133 where K is a multiple of 128, 2 x that where K = 64 (half a block of
    padding); int8-wo per channel (K <= 256 on the tiny preset) (K + 5) / 4K: 0.270 at K = 64, 0.255
    at K = 256."""
    b, built = peer_vision
    out, rec = built[fmt.name]
    assert rec["passed"] and rec["extra"]["exact"]["passed"] and rec["variant"] == fmt.name
    assert rec["extra"]["exact"]["metrics"]["max_rel_error"] < 1e-5
    assert rec["extra"]["float_reference"]["metrics"]["min_cosine"] < rec["metrics"]["min_cosine"]
    facts = rec["extra"]["graphs"]["model.onnx"]
    nodes = _nbits_nodes(out / "model.onnx")
    assert len(nodes) == facts["linears"] > 0 and {n[2] for n in nodes} == {fmt.bits}
    # int8-wo: float activations (OpenVINO's weight-only INT8), int4-rtn128: the run's INT8 activations
    assert facts["bits"] == fmt.bits and facts["algorithm"] == "rtn"
    assert facts["accuracy_level"] == (0 if fmt is INT8_WO else 4)
    ks = sorted({k for k, *_ in nodes})
    assert ks == [64, 128, 256] and any(k % 128 for k in ks)
    if fmt is INT4_RTN128:
        assert {n[3] for n in nodes} == {128} and not any(n[4] for n in nodes) and facts["symmetric"] is True
        want_ratio = {64: 68 / 256, 128: 68 / 512, 256: 2 * 68 / 1024}
        lo, hi = 1 / 8, 0.27
    else:
        assert all(block == k for k, _, _, block, _ in nodes) and all(n[4] for n in nodes)
        assert facts["symmetric"] is False and facts["per_channel"] and facts["block_size"] == "per-channel"
        want_ratio = {k: (k + 5) / (4 * k) for k in ks}
        lo, hi = 1 / 4, 0.27
    stored = sum(_stored_bytes(*n) for n in nodes)
    assert facts["weight_bytes"] == stored
    for k, row in facts["by_k"].items():
        assert row["weight_bytes"] / row["float32_bytes"] == pytest.approx(want_ratio[int(k)], rel=1e-9)
        assert row["block_size"] == (128 if fmt is INT4_RTN128 else int(k))
    assert lo < facts["weight_bytes"] / facts["float32_bytes"] < hi
    src = (b.folder("fp32") / "model.onnx.data").stat().st_size
    assert (out / "model.onnx.data").stat().st_size < (0.4 if fmt.bits == 4 else 0.5) * src


def test_a_mixed_vision_graph_gives_each_linear_its_own_format(peer_vision, tmp_path):
    """A plan's mixed vision graph: every Linear at its own format (INT4 blocks of 128, INT8 per
    channel, float), gated on its own weights like the uniform graphs, each quantized Linear
    byte for byte the node its format's uniform graph holds; a Linear left out is refused."""
    from vlsens.precision.weight_only import MIXED, gemm_to_matmul, linears, quantize_vision
    from vlsens.quantize.nbits import quantized_nodes, weight_matmuls

    b, built = peer_vision
    names = sorted(quantized_nodes(built["int8-wo"][0] / "model.onnx"))
    # the Linears read from the graph alone are the MatMuls gemm_to_matmul makes of it
    model = onnx.load(str(b.folder("fp32") / "model.onnx"))
    weights = gemm_to_matmul(model)
    found = linears(b.folder("fp32") / "model.onnx")
    assert [{k: o[k] for k in ("name", "K", "N")} for o in found] == [{k: o[k] for k in ("name", "K", "N")}
                                                                      for o in weight_matmuls(model)]
    assert {o["name"]: o["weight"] for o in found} == weights  # each Linear's exported weight, as the rewrite names it
    assert sorted(o["name"] for o in linears(b.folder("fp32") / "model.onnx")) == names
    per_op = {n: (INT4_RTN128, INT8_WO, None)[i % 3] for i, n in enumerate(names)}
    run = NBitsSettings(algorithm="k_quant", block_size=32, symmetric=True)
    rec = vision_folder(b.ckpt, b.folder("fp32"), b.reference, tmp_path / "mixed", run, TOL_INT4, TOL_FP32,
                        threads=2, fmt=per_op)
    assert rec["passed"] and rec["extra"]["exact"]["passed"] and rec["variant"] == MIXED
    facts = rec["extra"]["graphs"]["model.onnx"]
    assert facts["formats"] == {"float": len(names[2::3]), "int4-rtn128": len(names[0::3]),
                                "int8-wo": len(names[1::3])}
    got = quantized_nodes(tmp_path / "mixed" / "model.onnx")
    assert sorted(got) == sorted(n for n, f in per_op.items() if f is not None)
    for fmt in (INT4_RTN128, INT8_WO):
        uniform = quantized_nodes(built[fmt.name][0] / "model.onnx")
        for n in (n for n, f in per_op.items() if f is fmt):
            assert got[n]["bits"] == fmt.bits and got[n]["bytes"] == uniform[n]["bytes"]
            assert facts["by_linear"][n]["weight_bytes"] == uniform[n]["bytes"]
    m = onnx.load(str(tmp_path / "mixed" / "model.onnx"), load_external_data=False)
    assert sum(n.op_type == "MatMul" and n.name in per_op for n in m.graph.node) == len(names[2::3])
    with pytest.raises(VlsensError, match="missing"):
        quantize_vision(b.folder("fp32") / "model.onnx", tmp_path / "bad" / "model.onnx", run,
                        per_op=dict(list(per_op.items())[1:]))


def test_int8_vision_is_nearer_the_checkpoint_than_int4(peer_vision):
    """Against transformers' float features, the int8-wo graph as shipped is closer than the
    int4-rtn128 one: the formats' quantization error, measured."""
    _, built = peer_vision
    fr = {name: rec["extra"]["float_reference"]["metrics"] for name, (_, rec) in built.items()}
    assert fr["int8-wo"]["min_cosine"] > fr["int4-rtn128"]["min_cosine"]
    assert fr["int8-wo"]["max_rel_error"] < fr["int4-rtn128"]["max_rel_error"]


def test_folders_of_the_peer_formats_run_in_onnxruntime_genai(peer_vision, graph_builder, parity_refs, tmp_path):
    """Two deploy folders around the FP32 decoder: the INT8 per-row table with the int8-wo vision
    graph, and the INT4 table with the int4-rtn128 one. onnxruntime-genai loads each
    (GatherBlockQuantized at 8 and 4 bits, MatMulNBits at 8 bits with zero points and at 4 with K
    padded) and generates through vlsens.deploy.genai.runtime.Chat; teacher-forced on the FP32
    folder's tokens, the INT8 folder's logits are the nearer to the FP32 folder's."""
    from vlsens.deploy.genai.assemble import assemble
    from vlsens.deploy.genai.evaluate import eval_cases
    from vlsens.deploy.genai.runtime import Chat

    vis, built = peer_vision
    dec = graph_builder("decoder")
    token = _image_token(dec.ckpt)
    embedding_folder(dec.folder("fp32"), dec.reference, tmp_path / "emb8", PER_CHANNEL, False, token, TOL_FP32,
                     threads=2, bits=8)
    embedding_folder(dec.folder("fp32"), dec.reference, tmp_path / "emb4", 32, True, token, TOL_FP32, threads=2)
    parts = {"fp32": (dec.folder("fp32") / "embedding.onnx", vis.model("fp32")),
             "int8": (tmp_path / "emb8" / "embedding.onnx", built["int8-wo"][0] / "model.onnx"),
             "int4": (tmp_path / "emb4" / "embedding.onnx", built["int4-rtn128"][0] / "model.onnx")}
    case = next(c for c in eval_cases(parity_refs, tmp_path / "images") if len(c["images"]) == 1)
    image = case["images"][0]["path"]
    tokens, logits = {}, {}
    for name, (embedding, vision) in parts.items():
        assemble(tmp_path / name, dec.ckpt, dec.model("fp32"), embedding, vision, tmp_path / f"work-{name}")
        m = onnx.load(str(tmp_path / name / "embedding.onnx"), load_external_data=False)
        assert name == "fp32" or [n.op_type for n in m.graph.node].count("GatherBlockQuantized") == 1
        chat = Chat(tmp_path / name)
        tokens[name] = chat.tokens(case["prompt"], [image], max_new_tokens=8)
        assert len(tokens[name]) == 8, (name, tokens[name])
        logits[name] = chat.forced_logits(chat.prompt(case["prompt"], 1), [image],
                                          tokens.get("fp32", tokens[name]))
        chat.close()
    d8, d4 = (np.abs(logits[n] - logits["fp32"]).max() for n in ("int8", "int4"))
    assert 0 < d8 < d4, (d8, d4)


def test_formats_pick_their_blocks_and_keep_the_runs_other_settings():
    """Per channel: one block where K fits a MatMulNBits block (K padded up to it), blocks of 256
    past that (Qwen2.5-VL 3B's vision K: 1280, 3420, 5120); a table's row where its width is a
    power of two (3B: 2048), else the widest power of two that tiles it (7B: 3584 = 7 x 512)."""
    from vlsens.precision.weight_only import FORMATS, WeightFormat, table_block

    run = NBitsSettings(algorithm="k_quant", block_size=32, symmetric=True, accuracy_level=4)
    assert [INT8_WO.block_for(k, run) for k in (64, 100, 256, 1280, 3420, 5120)] == [64, 128, 256, 256, 256, 256]
    assert INT8_WO.settings(run, 1280) == NBitsSettings("rtn", 256, False, 0)
    assert INT4_RTN128.settings(run, 64) == NBitsSettings("rtn", 128, True, 4)
    assert FORMATS["int4"].settings(run, 1280) == run and set(FORMATS) == {"int4", "int4-rtn128", "int8-wo"}
    with pytest.raises(ValueError, match="block size 512"):
        WeightFormat("wide", 8, block_size=512)
    assert [table_block(w, PER_CHANNEL) for w in (64, 2048, 3584)] == [64, 2048, 512]
    assert table_block(2048, 32) == 32
    with pytest.raises(VlsensError, match="no block"):
        table_block(100, PER_CHANNEL)
