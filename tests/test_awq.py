"""AWQ per MatMul (``vlsens.quantize.awq``): never above round to nearest on the rows it was fitted
on, below it where channels' activations differ in size; each AWQ MatMul carries its own ``Mul`` by
``1 / s``, which ONNX Runtime runs, the weight readers fold, the bytes count and the switch engine
holds (each op alone equals its one-op model)."""

import numpy as np
import pytest
from conftest import assert_runs_its_weights

from vlsens.core.onnxutil import make_session
from vlsens.quantize import awq, gptq
from vlsens.quantize.nbits import NBitsSettings, quantize, quantized_nodes, weight_matmuls
from vlsens.sensitivity import nbits as nb


def _error(w, x, got):
    d = got[3].astype(np.float64)[:, None] * gptq.dequantized(*got[:3], w.shape[0]) - w
    return float(np.sum((x @ d) ** 2))


def _rows(rng, m, size):
    return (rng.standard_normal((m, size.size)) * size).astype(np.float32)


@pytest.mark.parametrize("bits", [4, 8])
def test_awq_is_round_to_nearest_at_alpha_zero_and_lowers_the_error_where_channels_differ(bits):
    rng = np.random.default_rng(bits)
    k, n = 200, 48  # a padded last block
    w = rng.standard_normal((k, n)).astype(np.float32)
    size = np.exp(rng.normal(0, 1.5, k))  # activations of very different size per channel
    fit, held = _rows(rng, 2000, size), _rows(rng, 500, size)
    h = fit.astype(np.float64).T @ fit
    mag = np.abs(fit).mean(axis=0)
    alpha, inv, errors = awq.search(w, h, mag, bits, 32, True)
    rtn = gptq.codes(w, None, bits, 32, True)
    ones = (*rtn, np.ones(k))
    assert len(errors) == awq.GRID and errors[0] == pytest.approx(_error(w, fit, ones), rel=1e-9)
    assert min(errors) <= errors[0] and alpha > 0 and np.all(inv > 0)
    got = awq.codes(w, h, mag, bits, 32, True)
    assert got[0].max() <= (1 << bits) - 1 and np.all(got[2] == 1 << (bits - 1)) and got[3].dtype == np.float32
    assert np.array_equal(got[3], inv.astype(np.float32))
    for x in (fit, held):
        assert _error(w, x, got) < 0.8 * _error(w, x, ones)
    se = awq.codes(w, h, mag, bits, 32, True, then="se")
    assert np.array_equal(se[3], got[3]) and _error(w, held, se) < _error(w, held, got)
    half = awq.codes(w, h, mag, bits, 32, True, dtype=np.float16)  # the activations' type holds 1 / s
    assert half[3].dtype == np.float16
    with pytest.raises(ValueError, match="then"):
        awq.codes(w, h, mag, bits, 32, True, then="gptq")


def test_equal_activations_give_no_scale():
    """Every channel the same size: every alpha is s = 1, round to nearest itself."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    x = rng.standard_normal((500, 64)).astype(np.float32)
    got = awq.codes(w, x.T.astype(np.float64) @ x, np.ones(64), 4, 32, True)
    assert np.all(got[3] == 1)
    assert all(np.array_equal(a, b) for a, b in zip(got[:3], gptq.codes(w, None, 4, 32, True), strict=True))


@pytest.fixture(scope="module")
def decoder(graph_builder):
    return graph_builder("decoder")


def test_a_decoder_by_awq_runs_its_scales_and_its_codes(decoder, tmp_path, monkeypatch):
    """Every MatMul INT4 by AWQ: each but the head gets a Mul ``<op>_awq`` by its ``1 / s``; ONNX
    Runtime's output is the float graph's with the weights the readers return (the scale folded
    in); each op's bytes are round to nearest's plus its vector; the store gives the same graph."""
    import onnx

    from vlsens.core.onnxgraph import dequantize_matmulnbits

    fl = decoder.model("fp32")
    ops = weight_matmuls(fl)
    settings = NBitsSettings(algorithm="rtn", block_size=32, accuracy_level=0)
    bits = {o["name"]: 4 for o in ops}
    calib = decoder.calib / "calib.npz"
    cal = gptq.Calibration(calib, gptq.Store(tmp_path / "store", fl, calib, writable=True))
    built = quantize(fl, tmp_path / "awq.onnx", bits, settings, algorithms=dict.fromkeys(bits, "awq"), calibration=cal)
    rtn = quantize(fl, tmp_path / "rtn.onnx", bits, settings)
    graph = onnx.load(str(built), load_external_data=False)
    muls = {n.name for n in graph.graph.node if n.op_type == "Mul" and n.name.endswith(awq.SUFFIX)}
    head = "/lm_head/MatMul"
    # alpha = 0 (s = 1) is a choice too: that op gets no Mul; the head never does
    assert head + awq.SUFFIX not in muls and len(muls) >= len(ops) // 2
    assert muls <= {o["name"] + awq.SUFFIX for o in ops}
    q_awq, q_rtn = quantized_nodes(built), quantized_nodes(rtn)
    for o in ops:
        extra = 4 * o["K"] if o["name"] + awq.SUFFIX in muls else 0
        assert q_awq[o["name"]]["bytes"] == q_rtn[o["name"]]["bytes"] + extra, o["name"]
    weights = assert_runs_its_weights(built, fl, decoder.calib / "eval.npz", tmp_path)
    monkeypatch.setattr(gptq, "hessians", lambda *a, **k: pytest.fail("AWQ computed again beside the store"))
    again = quantize(fl, tmp_path / "again.onnx", bits, settings, algorithms=dict.fromkeys(bits, "awq"),
                     calibration=gptq.Calibration(calib, gptq.Store(tmp_path / "store", fl, calib)))
    for name, w in dequantize_matmulnbits(again):
        np.testing.assert_array_equal(w, weights[name])


def test_every_awq_op_of_the_switch_equals_its_one_op_model(decoder, tmp_path):
    """The engine whose INT4 branches are AWQ's (Mul and MatMulNBits in the branch): each op alone,
    and a mixed assignment, equal the models quantize() builds for them, bit for bit."""
    fl0 = decoder.model("fp32")
    settings = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4)
    names = [o["name"] for o in weight_matmuls(fl0)]
    calib = decoder.calib / "calib.npz"
    nb.prepare(fl0, decoder.calib / "eval.npz", tmp_path / "engine", settings, threads=2, logits=True,
               how=nb.Quantizing({4: dict.fromkeys(names, "awq")}, calib))
    eng = nb.Prepared(tmp_path / "engine").session(decoder.calib / "eval.npz", threads=2, cache_dir=tmp_path / "c")
    fl = tmp_path / "engine" / nb.FILES["float"]

    def outputs(model):
        sess = make_session(model, threads=2)
        return [sess.run(["logits"], feed)[0] for feed in eng.samples.feeds]

    import onnx

    q4 = onnx.load(str(tmp_path / "engine" / nb.FILES["q4"]), load_external_data=False)
    scaled = {n.name[:-len(awq.SUFFIX)] for n in q4.graph.node if n.op_type == "Mul" and n.name.endswith(awq.SUFFIX)}
    assert len(scaled & set(names[:3])) >= 2, scaled  # the branches hold AWQ's Mul
    for op in names[:3] + names[-1:]:
        one = quantize(fl, tmp_path / "one.onnx", {op: 4}, settings, algorithms={op: "awq"}, calibration=calib)
        assert all(np.array_equal(w, g) for w, g in zip(outputs(one), eng.outputs({op: 4}), strict=True)), op
    mixed = {op: (4 if i % 2 else 8) for i, op in enumerate(names)}
    built = quantize(fl, tmp_path / "mixed.onnx", mixed, settings,
                     algorithms={op: "awq" for op, b in mixed.items() if b == 4}, calibration=calib)
    assert all(np.array_equal(w, g) for w, g in zip(outputs(built), eng.outputs(mixed), strict=True))
