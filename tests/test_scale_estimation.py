"""Scale estimation (``vlsens.quantize.scale_estimation``): each block's scale chosen by the
MatMul's output error; never above round to nearest's on the rows it was fitted on, below it where
a block's inputs differ in size, and a decoder built with it runs the codes its graph holds."""

import numpy as np
import pytest
from conftest import assert_runs_its_weights

from vlsens.quantize import gptq, scale_estimation
from vlsens.quantize.nbits import NBitsSettings, quantize, weight_matmuls


def _error(w, x, q, s, z, k):
    return float(np.sum((x @ (gptq.dequantized(q, s, z, k) - w)) ** 2))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_each_block_is_never_worse_than_round_to_nearest_and_better_where_inputs_differ(bits, symmetric):
    rng = np.random.default_rng(bits)
    k, n = 200, 48  # 200: a padded last block
    w = rng.standard_normal((k, n)).astype(np.float32)
    size = np.exp(rng.normal(0, 1.0, k))  # channels of very different size: some matter much more
    fit, held = ((rng.standard_normal((m, k)) * size).astype(np.float32) for m in (2000, 500))
    h = fit.astype(np.float64).T @ fit
    rtn = gptq.codes(w, None, bits, 32, symmetric)
    se = scale_estimation.codes(w, h, bits, 32, symmetric)
    assert se[0].shape == rtn[0].shape and se[1].dtype == np.float32 and se[2].dtype == np.uint8
    assert se[0].max() <= (1 << bits) - 1
    if symmetric:
        assert np.all(se[2] == 1 << (bits - 1))  # the zero point stays
    # per block and column, on the fitted rows: never above round to nearest
    dr = gptq.dequantized(*rtn, k) - w
    ds = gptq.dequantized(*se, k) - w
    for b in range(-(-k // 32)):
        r = slice(32 * b, min(32 * b + 32, k))
        hb = h[r, r]
        er = np.sum((hb @ dr[r]) * dr[r], axis=0)
        es = np.sum((hb @ ds[r]) * ds[r], axis=0)
        assert np.all(es <= er * (1 + 1e-6) + 1e-9)
    for x in (fit, held):
        assert _error(w, x, *se, k) < 0.95 * _error(w, x, *rtn, k)


@pytest.fixture(scope="module")
def decoder(graph_builder):
    return graph_builder("decoder")


def test_a_decoder_by_scale_estimation_runs_its_codes_and_keeps_them_in_the_store(decoder, tmp_path):
    """Every MatMul INT4 by scale estimation on the calibration split: ONNX Runtime's MatMulNBits
    computes the weights the codes stand for (the float graph with them, the same logits), the
    bytes are round to nearest's, and a run's store returns the same codes apart from GPTQ's."""

    from vlsens.core.onnxgraph import dequantize_matmulnbits
    from vlsens.core.onnxutil import data_path

    fl = decoder.model("fp32")
    ops = weight_matmuls(fl)
    settings = NBitsSettings(algorithm="rtn", block_size=32, accuracy_level=0)
    bits = {o["name"]: 4 for o in ops}
    store = gptq.Store(tmp_path / "store", fl, decoder.calib / "calib.npz", writable=True)
    cal = gptq.Calibration(decoder.calib / "calib.npz", store)
    built = quantize(fl, tmp_path / "se.onnx", bits, settings, algorithms=dict.fromkeys(bits, "scale_estimation"),
                     calibration=cal)
    rtn = quantize(fl, tmp_path / "rtn.onnx", bits, settings)
    assert data_path(built).stat().st_size == data_path(rtn).stat().st_size  # the same blocks
    weights = assert_runs_its_weights(built, fl, decoder.calib / "eval.npz", tmp_path)
    o = ops[0]
    kept = store.load(o, 4, settings, "scale_estimation")
    assert kept is not None and store.load(o, 4, settings) is None  # GPTQ's key is another
    again = quantize(fl, tmp_path / "again.onnx", bits, settings,
                     algorithms=dict.fromkeys(bits, "scale_estimation"), calibration=cal)
    assert dict(dequantize_matmulnbits(again)).keys() == weights.keys()
    for name, w in dequantize_matmulnbits(again):
        np.testing.assert_array_equal(w, weights[name])


def test_gptq_with_estimated_scales_lowers_gptqs_error_and_keeps_its_codes_on_the_grid():
    """GPTQ whose blocks take scale estimation's scale (``gptq_se``): on inputs of correlated
    channels of very different size, a lower output error than GPTQ's on rows neither saw; without
    a Hessian it is round to nearest (nothing to estimate with)."""
    rng = np.random.default_rng(5)
    k, n = 192, 64
    w = rng.standard_normal((k, n)).astype(np.float32)
    mix = (rng.standard_normal((k, k)) * 0.3 + np.eye(k)) * np.exp(rng.normal(0, 1.0, k))
    fit, held = ((rng.standard_normal((m, k)) @ mix).astype(np.float32) for m in (2000, 500))
    h = fit.astype(np.float64).T @ fit
    g = gptq.codes(w, h, 4, 32, True)
    gs = gptq.codes(w, h, 4, 32, True, estimate_scales=True)
    assert gs[0].max() <= 15 and np.all(gs[2] == 8)
    assert _error(w, held, *gs, k) < 0.95 * _error(w, held, *g, k)
    none = gptq.codes(w, None, 4, 32, True, estimate_scales=True)
    assert all(np.array_equal(a, b) for a, b in zip(none, gptq.codes(w, None, 4, 32, True)))
