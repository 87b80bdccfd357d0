"""Engine ``nbits`` (weight-only INT4 / INT8 of the decoder's MatMuls): the switch model equals,
bit for bit, the model ONNX Runtime's MatMulNBitsQuantizer builds for the same assignment."""

import numpy as np
import pytest

from vlsens.core.onnxutil import make_session
from vlsens.quantize.nbits import NBitsSettings, quantize, quantized_nodes, weight_matmuls
from vlsens.sensitivity import nbits as nb


@pytest.fixture(scope="module")
def decoder_engine(graph_builder, tmp_path_factory):
    b = graph_builder("decoder")
    folder = tmp_path_factory.mktemp("nbits")
    settings = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4)
    meta = nb.prepare(b.model("fp32"), b.calib / "eval.npz", folder / "engine", settings, threads=2, logits=True)
    return b, folder, settings, meta


def _outputs(model, samples):
    sess = make_session(model, threads=2)
    return [sess.run(["logits"], feed)[0] for feed in samples.feeds]


def test_every_op_of_the_switch_equals_its_one_op_model(decoder_engine, tmp_path):
    """Through the suffix engine (each op from the cut before it on, the float prefix cached), as
    engine nbits scores; a mixed assignment and the all-float one too."""
    b, folder, settings, meta = decoder_engine
    eng_dir = nb.Prepared(folder / "engine")
    eng = eng_dir.session(b.calib / "eval.npz", threads=2, cache_dir=tmp_path)
    assert eng.suffix is not None and len(eng.suffix.plan.cuts) >= 10  # 15 ops, their own cuts
    samples = eng.samples
    fl = folder / "engine" / nb.FILES["float"]
    ops = [o["name"] for o in meta["ops"]]
    assert len(ops) == 15 and ops[-1] == "/lm_head/MatMul"  # 2 layers x 7 + lm_head
    float_out = _outputs(fl, samples)
    for bits in (4, 8):
        for op in ops:
            one = quantize(fl, folder / f"one-{bits}.onnx", {op: bits}, settings)
            assert set(quantized_nodes(one)) == {op} and quantized_nodes(one)[op]["bits"] == bits
            want = _outputs(one, samples)
            got = list(eng.outputs({op: bits}))
            assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True)), (op, bits)
            # ... and it is not the float model (the switch did switch)
            assert not all(np.array_equal(w, f) for w, f in zip(want, float_out, strict=True)), (op, bits)
    # A mixed assignment: INT4, INT8 and float in one model.
    mixed = {op: (4 if i % 3 == 0 else 8) for i, op in enumerate(ops) if i % 3 != 2}
    built = quantize(fl, folder / "mixed.onnx", mixed, settings)
    assert {k: v["bits"] for k, v in quantized_nodes(built).items()} == mixed
    assert all(np.array_equal(w, g) for w, g in zip(_outputs(built, samples), eng.outputs(mixed), strict=True))
    assert all(np.array_equal(w, g) for w, g in zip(float_out, eng.outputs({}), strict=True))


def test_the_switch_model_holds_no_weight_of_its_own(decoder_engine):
    """Its branches read the all-op models' data files (building it loads no weight: at 3B both
    quantized models and their copies exceeded 23 GB)."""
    import onnx
    from onnx.external_data_helper import _get_initializer_tensors, uses_external_data

    _, folder, _, _ = decoder_engine
    d = folder / "engine"
    assert (d / "switch.onnx.data").stat().st_size == 0
    m = onnx.load(str(d / nb.FILES["switch"]), load_external_data=False)
    files = {e.value for t in _get_initializer_tensors(m) if uses_external_data(t)
             for e in t.external_data if e.key == "location"}
    assert files == {"float.onnx.data", "q4.onnx.data", "q8.onnx.data"}


def test_sensitivity_csv_ranks_every_matmul_and_reads_bytes_from_the_models(decoder_engine, tmp_path):
    import pandas as pd

    b, folder, settings, meta = decoder_engine
    summary = nb.sensitivity(folder / "engine", b.calib / "eval.npz", tmp_path / "nbits.csv", tmp_path / "nbits.json", 2)
    df = pd.read_csv(tmp_path / "nbits.csv")
    assert list(df["rank"]) == list(range(1, 16)) and set(df["op"]) == {o["name"] for o in meta["ops"]}
    assert (df["error_int4"].diff().dropna() <= 0).all()  # ranked by the INT4 error
    # INT8 of an op is at least as good as INT4 of it on every op that matters
    top = df.head(5)
    assert (top["kl_int8"] < top["kl_int4"]).all() and (top["kl_int4"] > 1e-6).all()
    # bytes: INT4 < INT8 < float, as stored (weights, scales, zero points), per op
    assert (df["bytes_int4"] < df["bytes_int8"]).all() and (df["bytes_int8"] < df["bytes_float"]).all()
    q4 = quantized_nodes(folder / "engine" / nb.FILES["q4"])
    assert int(df["bytes_int4"].sum()) == sum(v["bytes"] for v in q4.values()) == summary["bytes"]["int4"]
    assert summary["all_int4"]["kl"] > summary["all_int8"]["kl"] > 0
    assert len(weight_matmuls(b.model("fp32"))) == 15


def test_settings_are_checked():
    with pytest.raises(ValueError, match="nbits.algorithm"):
        NBitsSettings(algorithm="gptq")
    with pytest.raises(ValueError, match="nbits.block_size"):
        NBitsSettings(block_size=24)


def _config_tolerances():
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    return cfg["deploy"]["nbits"]["tolerance"], cfg["parity"]["tolerance"]["fp32"]


NBITS_TOLERANCE, EXACT = _config_tolerances()


@pytest.fixture(scope="module")
def weight_outlier(tmp_path_factory, parity_refs):
    """The tiny checkpoint with a weight outlier in layer 1's down_proj (its input rows x 1000, the
    same up_proj rows / 1000: the function is unchanged), through the decoder's stages, engine
    nbits, the int4-mixed folder and the builder's k_quant_mixed folder."""
    from conftest import build_graph

    from vlsens.deploy.genai.anchors import builder_folder
    from vlsens.export.towers.decoder import weight_reference
    from vlsens.model.presets.build import build_tiny_checkpoint
    from vlsens.precision.nbits import SearchSettings, profile_folder
    from vlsens.variants import Gate

    root = tmp_path_factory.mktemp("nbits-outlier")
    ckpt = build_tiny_checkpoint(root / "ckpt", seed=0, text_outlier={"layer": 1, "channels": 4, "scale": 0.001})
    b = build_graph("decoder", ckpt, root / "decoder", parity_refs)
    settings = NBitsSettings()
    eng = root / "engine"
    nb.prepare(b.model("fp32"), b.calib / "eval.npz", eng, settings, threads=2, logits=True)
    nb.sensitivity(eng, b.calib / "eval.npz", root / "nbits.csv", root / "nbits.json", 2)
    heuristic = builder_folder(ckpt, "k_quant_mixed", settings, b.folder("fp32"), b.reference,
                               root / "k_quant_mixed", NBITS_TOLERANCE, EXACT, threads=2)
    mixed = profile_folder(eng, b.calib / "eval.npz", root / "nbits.csv", b.folder("fp32"), b.reference,
                           root / "int4-mixed", SearchSettings(1e-4, threads=2),
                           Gate(NBITS_TOLERANCE, 2, exact_tolerance=EXACT,
                                reference_for=lambda staged, cases: weight_reference(ckpt, staged["model.onnx"], cases)),
                           heuristic=root / "k_quant_mixed" / "model.onnx")
    return b, root, mixed, heuristic, ckpt


def _kl(model, b, eng_dir):
    from vlsens.core.metrics import Metrics

    e = nb.Prepared(eng_dir)
    samples, ref = e.session(b.calib / "eval.npz").samples, e.reference()
    sess, acc = make_session(model, threads=2), Metrics(True)
    for i, feed in enumerate(samples.feeds):
        acc.add(sess.run(["logits"], feed)[0], ref[i], samples.valid[i])
    return acc.result()["kl"]


def test_planted_weight_outlier_keeps_its_matmul_wide_and_the_heuristic_loses(weight_outlier):
    import pandas as pd

    b, root, mixed, heuristic, _ = weight_outlier
    planted = "/model/layers.1/mlp/down_proj/MatMul"
    df = pd.read_csv(root / "nbits.csv")
    # rank 1, and alone in INT4 it misses the target the whole decoder is held to
    assert df.iloc[0]["op"] == planted and df.iloc[0]["error_int4"] > 1e-4 > df.iloc[1]["error_int4"]
    bits = mixed["extra"]["graphs"]["model.onnx"]["bits"]
    assert bits[planted] in (8, 0)  # INT8 or float, never INT4
    wide = [n for n in weight_matmuls(b.model("fp32")) if bits.get(n["name"]) != 4]
    assert 1 <= len(wide) <= 5, wide  # that op and a few others (of 15); the other two thirds stay INT4
    hb = heuristic["extra"]["graphs"]["model.onnx"]["bits"]
    assert hb[planted] == 4  # llama.cpp's rule upgrades layer 0 of 2 (and lm_head), not this one
    kl_mixed = _kl(root / "int4-mixed" / "model.onnx", b, root / "engine")
    kl_heur = _kl(root / "k_quant_mixed" / "model.onnx", b, root / "engine")
    assert kl_mixed <= 1e-4 < kl_heur, (kl_mixed, kl_heur)  # the profile meets the target, the heuristic does not
    # At equal or fewer bytes, in the same arithmetic, a clearly lower error than the heuristic's.
    # (The goal is at most half; on this 2-layer model the best found is 0.61x: lm_head,
    # a third of the weights, dominates what any assignment within the heuristic's bytes can save.)
    same = mixed["extra"]["graphs"]["model.onnx"]["search"]["at_heuristic_bytes"]
    assert same["other_weight_bytes"] == heuristic["extra"]["graphs"]["model.onnx"]["weight_bytes"]
    assert abs(same["other_error"] - kl_heur) < 1e-12
    assert same["vlsens_weight_bytes"] <= same["other_weight_bytes"]
    assert same["vlsens_error"] <= 0.7 * same["other_error"], same
    assert "/model/layers.1/mlp/down_proj/MatMul" in same["vlsens_not_int4"]
    search = mixed["extra"]["graphs"]["model.onnx"]["search"]
    assert search["built"] == search["estimate"]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("algorithm", ["rtn", "k_quant"])
def test_dequantize_reads_the_weight_matmulnbits_multiplies_by(tmp_path, bits, symmetric, algorithm):
    """At accuracy_level 0 (float activations) ONNX Runtime's MatMulNBits equals x @ W for the
    dequantized W bit for bit: the layout is read the way the kernel reads it (K of 4 blocks; also
    80, not a multiple of the block, with symmetric RTN: the only setting whose quantizer handles an
    odd block count; the others fail packing their zero points)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vlsens.core.onnxgraph import dequantize_matmulnbits as dequantize
    from vlsens.core.onnxutil import save_with_external_data

    rng = np.random.default_rng(bits)
    for k in (128, 80) if symmetric and algorithm == "rtn" else (128,):
        w = rng.standard_normal((k, 48)).astype(np.float32)
        g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W")])
        save_with_external_data(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
                                tmp_path / f"f{k}.onnx")
        settings = NBitsSettings(algorithm=algorithm, block_size=32, symmetric=symmetric, accuracy_level=0)
        q = quantize(tmp_path / f"f{k}.onnx", tmp_path / f"q{k}.onnx", {"mm": bits}, settings)
        assert any(n.op_type == "MatMulNBits" for n in onnx.load(str(q), load_external_data=False).graph.node)
        ((name, deq),) = list(dequantize(q))
        x = rng.standard_normal((3, k)).astype(np.float32)
        assert name == "mm" and deq.shape == (k, 48)
        assert np.array_equal(make_session(q).run(None, {"x": x})[0], x @ deq)
        err = np.abs(deq - w).max()  # a quantized weight: close to W, not W
        assert 0 < err < (0.5 if bits == 4 else 0.03)


def test_int4_gate_compares_with_the_graphs_own_weights_and_fails_a_bad_one(weight_outlier, tmp_path):
    """The int4 folders' gate: with float activations the graph equals transformers on its own
    dequantized weights at FP32's tolerance (the planted outlier makes INT4 far from the float
    model, which is measured apart); one MatMul's scales doubled and the gate fails, no folder."""
    from vlsens.core.errors import ParityError
    from vlsens.core.onnxutil import copy_model
    from vlsens.export.towers.decoder import weight_reference
    from vlsens.variants import Gate, variant_folder

    b, root, mixed, heuristic, ckpt = weight_outlier
    for rec in (mixed, heuristic):
        ex = rec["extra"]["exact"]
        assert ex["passed"] and ex["metrics"]["min_cosine"] >= EXACT["min_cosine"]
        assert ex["metrics"]["max_rel_error"] <= EXACT["max_rel_error"]
        assert rec["reference"].startswith("transformers") and "own weights" in rec["reference"]
        # the quantization error against the checkpoint's model: recorded, larger than the kernel's
        fl = rec["extra"]["float_reference"]["metrics"]
        assert fl["max_rel_error"] > rec["metrics"]["max_rel_error"] > ex["metrics"]["max_rel_error"]
    # A graph whose weights are not the ones transformers is given: int4-mixed's graph (the planted
    # MatMul wide) against the heuristic's weights (it at INT4).
    def other_graph(source, feeds, staged):
        copy_model(root / "int4-mixed" / source.name if source.name == "model.onnx" else source, staged)
        return {}

    with pytest.raises(ParityError, match="float activations"):
        variant_folder(root / "k_quant_mixed", b.reference, tmp_path / "bad", "int4-bad", other_graph,
                       Gate(NBITS_TOLERANCE, 2, exact_tolerance=EXACT,
                            reference_for=lambda staged, cases: weight_reference(
                                ckpt, root / "k_quant_mixed" / "model.onnx", cases)))
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_the_anchors_equal_the_builders_own_int4_graphs(weight_outlier, tmp_path):
    """vlsens.deploy.genai.anchors builds -p int4 from the builder's FP32 graph with the builder's own
    placement and quantizer: the same MatMulNBits nodes, attributes and weights as the builder's
    own -p int4 export (algo_config=k_quant_mixed, the run's settings)."""
    import onnx

    from vlsens.core.onnxutil import tensor_array
    from vlsens.export.towers.decoder import build_decoder

    b, root, mixed, heuristic, ckpt = weight_outlier
    theirs = build_decoder(ckpt, tmp_path, precision="int4",
                           options={"algo_config": "k_quant_mixed", "block_size": 32, "accuracy_level": 4,
                                    "is_symmetric": "true"})
    mine = root / "k_quant_mixed" / "model.onnx"

    def nodes(path):
        m = onnx.load(str(path), load_external_data=False)
        inits = {i.name: i for i in m.graph.initializer}
        return {n.name: ({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute},
                         [tensor_array(inits[x], path.parent) for x in n.input[1:] if x])
                for n in m.graph.node if n.op_type == "MatMulNBits"}

    a, t = nodes(mine), nodes(theirs)
    assert sorted(a) == sorted(t) and len(a) == 15
    assert sum(attrs["bits"] == 8 for attrs, _ in a.values()) == 3  # lm_head, layer 0's v_proj and down_proj
    for name in a:
        assert a[name][0] == t[name][0], name
        assert all(np.array_equal(x, y) for x, y in zip(a[name][1], t[name][1], strict=True)), name


def test_quantizing_in_batches_changes_nothing(decoder_engine, tmp_path):
    """One MatMul per quantizer run (as a real-size decoder's batches are) or all in one: the
    same graph file and the same weight bytes."""
    import filecmp

    import onnx

    b, folder, settings, meta = decoder_engine
    fl = folder / "engine" / nb.FILES["float"]
    bits = {o["name"]: (8 if i % 4 == 0 else 4) for i, o in enumerate(meta["ops"]) if i % 5 != 4}
    one = quantize(fl, tmp_path / "one.onnx", bits, settings)
    each = quantize(fl, tmp_path / "each.onnx", bits, settings, batch_bytes=1)
    assert filecmp.cmp(f"{one}.data", f"{each}.data", shallow=False)
    graphs = []
    for path in (one, each):
        m = onnx.load(str(path), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = "data"
        graphs.append(m.SerializeToString())
    assert graphs[0] == graphs[1]


@pytest.mark.parametrize("algorithm,symmetric", [("k_quant", True), ("rtn", False)])
def test_an_odd_block_count_with_zero_points_is_quantized_as_onnx_runtime_quantizes_its_blocks(tmp_path, algorithm,
                                                                                             symmetric):
    """ONNX Runtime's writer fails on 4-bit zero points of an odd number of blocks per column
    (Qwen2.5-VL's vision down_proj: K 3420, 107 blocks of 32). vlsens quantizes one block more of
    zero rows and drops it: every real block is what ONNX Runtime makes of the same rows in an
    even-block weight, and ONNX Runtime runs the node to the dequantized weight's product."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from vlsens.core.onnxgraph import dequantize_matmulnbits
    from vlsens.core.onnxutil import save_with_external_data
    from vlsens.quantize.nbits import NBitsSettings, quantize

    rng = np.random.default_rng(0)
    k, n, even = 3420, 64, 3392  # 107 blocks of 32; the first 106 alone
    w = rng.standard_normal((k, n)).astype(np.float32)
    settings = NBitsSettings(algorithm=algorithm, symmetric=symmetric)

    def one(weight, name):
        kk = weight.shape[0]
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, kk])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
                              [numpy_helper.from_array(weight, "w")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 9
        fl = save_with_external_data(m, tmp_path / name / "float.onnx")
        (tmp_path / name / "q").mkdir()
        return quantize(fl, tmp_path / name / "q" / "model.onnx", {"mm": 4}, settings)

    odd, ref = one(w, "odd"), one(w[:even].copy(), "even")

    def tensors(model):
        m = onnx.load(str(model))
        node = next(x for x in m.graph.node if x.op_type == "MatMulNBits")
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        return node, [inits[x] for x in node.input[1:] if x in inits]

    (node, got), (_, want) = tensors(odd), tensors(ref)
    assert next(a.i for a in node.attribute if a.name == "K") == k
    blocks = -(-k // 32)
    assert got[0].shape[:2] == (n, blocks) and np.array_equal(got[0][:, :106], want[0])
    assert np.array_equal(got[1].reshape(n, -1)[:, :106], want[1].reshape(n, -1))
    if len(want) > 2:  # the packed zero points: 53 whole bytes the same, the 54th holds block 107's
        assert np.array_equal(got[2].reshape(n, -1)[:, :53], want[2].reshape(n, -1)[:, :53])
    x = rng.standard_normal((3, k)).astype(np.float32)
    y = ort.InferenceSession(str(odd), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (_, deq), = dequantize_matmulnbits(odd)
    exact = x @ deq
    assert deq.shape == (k, n) and np.abs(y - exact).max() < 0.02 * np.abs(exact).max()  # INT8 activations (level 4)
    assert np.abs(deq - w).max() < 0.25 * np.abs(w).max()  # INT4 of each block
