"""GPTQ weight codes on ONNX Runtime's QDQ grid (``quant.weight_rounding``, vlsens.quantize.rounding).

Unit: the fixed-grid GPTQ loop is round to nearest on a diagonal Hessian and lowers the output error
on correlated inputs. On ORT's own QDQ models (MatMul, Gemm with ``transB``, a patch Conv): the grid
read back reproduces ORT's codes exactly, the codes written stay on it, and a model the codes do
not belong to is refused. On the held-out NPU tower (vlsens.npu tests' checkpoint): the engine with
GPTQ codes estimates its built profile exactly, and its all-W8A16 model is closer to float than
round to nearest's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import default_config, run_settings


def _one_op_models(root, rng):
    """A float model with a MatMul, a Gemm (transB) and a patch Conv (kernel = its input), its
    calibration feeds (correlated inputs) and ORT's all-op QDQ model of it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vlsens.core.onnxutil import save_with_external_data
    from vlsens.data.samples import FeedReader, Samples
    from vlsens.quantize.qdq import calibrate, quantize

    k, n = 48, 40
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w_mm"),
             numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "w_gemm"),
             numpy_helper.from_array(rng.standard_normal((k, 3, 4, 4)).astype(np.float32), "w_conv"),
             numpy_helper.from_array(np.array([-1, 3, 4, 4], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["patches"], name="reshape"),
             helper.make_node("Conv", ["patches", "w_conv"], ["c"], name="conv", kernel_shape=[4, 4]),
             helper.make_node("Flatten", ["c"], ["cf"], name="flatten"),
             helper.make_node("MatMul", ["cf", "w_mm"], ["m"], name="matmul"),
             helper.make_node("Gemm", ["m", "w_gemm"], ["y"], name="gemm", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 48])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    fl = save_with_external_data(model, root / "float.onnx")
    mix = rng.standard_normal((48, 48)).astype(np.float32)  # correlated inputs: GPTQ has something to use
    feeds = [{"x": (rng.standard_normal((64, 48)) @ mix).astype(np.float32)} for _ in range(4)]
    calib = root / "calib.npz"
    Samples(feeds).save(calib)
    settings = run_settings(**{"quant.target": "qnn"})
    calibrate(fl, root / "calibration.json", settings, FeedReader(Samples(feeds)), root)
    rtn = quantize(fl, root / "rtn" / "model.onnx", ["conv", "matmul", "gemm"],
                   dataclasses.replace(settings, weight_rounding="rtn"), root / "calibration.json")
    assert onnx.load(str(rtn), load_external_data=False)
    return fl, calib, feeds, rtn, settings


def test_fixed_grid_gptq_is_round_to_nearest_on_a_diagonal_hessian_and_better_on_correlated_inputs():
    from vlsens.quantize.gptq import channel_codes

    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 24))
    scale = np.abs(w).max(0) / 127
    zero = np.zeros(24)
    diag = np.diag(rng.uniform(0.5, 2.0, 96))
    q = channel_codes(w, diag, scale, zero, -127, 127)
    assert np.array_equal(q, np.clip(np.round(w / scale), -127, 127))
    x = rng.standard_normal((500, 96)) @ rng.standard_normal((96, 96))
    h = x.T @ x
    q = channel_codes(w, h, scale, zero, -127, 127)
    assert q.min() >= -127 and q.max() <= 127
    err = lambda c: float(np.sum((x @ (c * scale - w)) ** 2))  # noqa: E731
    assert err(q) < 0.5 * err(np.clip(np.round(w / scale), -127, 127))


def test_gptq_codes_keep_onnx_runtimes_grid_and_lower_the_error(tmp_path):
    import onnx

    from vlsens.core.onnxutil import make_session, tensor_array
    from vlsens.quantize import rounding
    from vlsens.quantize.qdq import quantize

    rng = np.random.default_rng(3)
    fl, calib, feeds, rtn_model, settings = _one_op_models(tmp_path, rng)
    assert settings.weight_rounding == "gptq"  # auto on qnn
    record = rounding.fit(fl, calib, rtn_model, rounding.codes_path(tmp_path / "calibration.json"), settings,
                          tmp_path / "rows")
    assert record["ops"] == 3 and record["kept_rtn"] == {}  # the Conv covers its whole input: one row per patch
    assert record["output_error_vs_rtn"]["max"] < 1.0
    gptq_model = quantize(fl, tmp_path / "gptq" / "model.onnx", ["conv", "matmul", "gemm"], settings,
                          tmp_path / "calibration.json")
    rtn_slots = rounding.slots(onnx.load(str(rtn_model), load_external_data=False), rtn_model.parent)
    gptq_slots = rounding.slots(onnx.load(str(gptq_model), load_external_data=False), gptq_model.parent)
    assert set(gptq_slots) == {"conv", "matmul", "gemm"}
    for op, s in gptq_slots.items():
        r = rtn_slots[op]
        assert np.array_equal(s.scale, r.scale) and np.array_equal(s.zero, r.zero) and s.axis == r.axis
        a, b = tensor_array(s.codes, gptq_model.parent), tensor_array(r.codes, rtn_model.parent)
        assert a.dtype == b.dtype and a.shape == b.shape and not np.array_equal(a, b)
        assert a.min() >= -127 and a.max() <= 127
    # at 16-bit activations the weights' rounding is most of the error: GPTQ's codes lower it
    ref, err = make_session(fl), {}
    for name, s in (("rtn", dataclasses.replace(settings, weight_rounding="rtn")), ("gptq", settings)):
        m = quantize(fl, tmp_path / f"{name}16" / "model.onnx", ["conv", "matmul", "gemm"], s,
                     tmp_path / "calibration.json", all_wide=True)
        sess = make_session(m, basic=True)
        err[name] = sum(float(np.sum((sess.run(None, f)[0] - ref.run(None, f)[0]) ** 2)) for f in feeds)
    assert err["gptq"] < 0.5 * err["rtn"]


def test_codes_refuse_a_model_of_another_grid(tmp_path):
    import onnx
    from onnx import numpy_helper

    from vlsens.quantize import rounding

    rng = np.random.default_rng(4)
    fl, calib, _, rtn_model, settings = _one_op_models(tmp_path, rng)
    codes = rounding.codes_path(tmp_path / "calibration.json")
    rounding.fit(fl, calib, rtn_model, codes, settings, tmp_path / "rows")
    model = onnx.load(str(rtn_model), load_external_data=True)
    for init in model.graph.initializer:
        if init.name.endswith("_scale") and "w_mm" in init.name:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
    other = tmp_path / "other.onnx"
    onnx.save(model, str(other))
    with pytest.raises(ValueError, match="matmul's weight grid is not the one"):
        rounding.apply(other, codes)


def test_weight_rounding_resolves_per_target():
    from vlsens.core.errors import ConfigError
    from vlsens.quantize.target import resolve

    assert "weight_rounding" not in resolve(default_config())  # rtn: the settings of older runs unchanged
    assert resolve(default_config(**{"quant.target": "qnn"}))["weight_rounding"] == "gptq"
    assert resolve(default_config(**{"quant.target": "npu"}))["weight_rounding"] == "gptq"  # pulsar2_qdq.json
    assert "weight_rounding" not in resolve(default_config(**{"quant.target": "npu", "quant.weight_rounding": "rtn"}))
    with pytest.raises(ConfigError, match="quant.weight_rounding"):
        resolve(default_config(**{"quant.weight_rounding": "awq"}))


def test_entropy_calibration_clips_where_minmax_does_not(tmp_path):
    """ORT's Entropy calibrator with its default bins returns MinMax's ranges; vlsens's entropy
    searches TensorRT's 2048 bins: every range within MinMax's, some narrower (a heavy tail)."""
    import dataclasses
    import json

    from vlsens.data.samples import FeedReader, Samples
    from vlsens.quantize.qdq import calibrate

    rng = np.random.default_rng(1)
    fl, _, feeds, _, settings = _one_op_models(tmp_path, rng)
    feeds = [{"x": f["x"] * np.where(rng.random(f["x"].shape) < 0.002, 40.0, 1.0).astype(np.float32)} for f in feeds]

    def ranges(method):
        cache = tmp_path / f"{method}.json"
        calibrate(fl, cache, dataclasses.replace(settings, calibrate_method=method), FeedReader(Samples(feeds)), tmp_path)
        data = json.loads(cache.read_text())["data"]

        def value(x):
            x = x["data"] if isinstance(x, dict) else x
            return float(x[0] if isinstance(x, list) else x)

        return {k: (value(v["lowest"]), value(v["highest"])) for k, v in data.items()}

    mm, ent = ranges("minmax"), ranges("entropy")
    assert set(mm) == set(ent)
    assert all(mm[k][0] - 1e-6 <= ent[k][0] and ent[k][1] <= mm[k][1] + 1e-6 for k in mm), (mm, ent)
    assert any(ent[k][1] - ent[k][0] < 0.8 * (mm[k][1] - mm[k][0]) for k in mm), (mm, ent)
