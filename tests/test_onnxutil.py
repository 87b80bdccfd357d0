"""ONNX file layout: vlsens' one-data-file layout from any exporter's layout, tensor by tensor."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vlsens.core.onnxutil import INLINE_MAX_BYTES, data_path, resave, save_with_external_data


def _model(rng):
    w1 = rng.standard_normal((64, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    small = np.arange(4, dtype=np.int64)  # below the threshold: stays inline
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                           numpy_helper.from_array(small, "small")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]), {"w1": w1, "w2": w2, "small": small}


def test_resave_joins_one_file_per_tensor_into_one_data_file(tmp_path):
    model, arrays = _model(np.random.default_rng(0))
    src = tmp_path / "raw" / "model.onnx"
    src.parent.mkdir()
    onnx.save_model(model, str(src), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    assert len(list(src.parent.iterdir())) > 2  # the legacy exporter's layout above 2 GB
    dst = resave(src, tmp_path / "out" / "model.onnx")
    assert sorted(p.name for p in dst.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    loaded = onnx.load(str(dst))
    got = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k], v)
    inline = {t.name for t in onnx.load(str(dst), load_external_data=False).graph.initializer
              if t.data_location != TensorProto.EXTERNAL}
    assert inline == {"small"}
    assert data_path(dst).stat().st_size == arrays["w1"].nbytes + arrays["w2"].nbytes


def test_resave_brings_external_constant_attributes_back_inline(tmp_path):
    """Above 2 GB the legacy exporter also writes Constant nodes' values to files of their own."""
    value = np.arange(512, dtype=np.float32)
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(value, "c_value"))
    add = helper.make_node("Add", ["x", "c"], ["y"])
    g = helper.make_graph([const, add], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    src = tmp_path / "raw" / "model.onnx"
    src.parent.mkdir()
    onnx.save_model(model, str(src), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0,
                    convert_attribute=True)
    dst = resave(src, tmp_path / "out" / "model.onnx")
    for p in src.parent.iterdir():
        p.unlink()  # nothing may still point there
    onnx.checker.check_model(str(dst))
    import onnxruntime as ort

    y = ort.InferenceSession(str(dst)).run(None, {"x": np.ones(512, dtype=np.float32)})[0]
    np.testing.assert_array_equal(y, value + 1)


def test_save_with_external_data_round_trips(tmp_path):
    model, arrays = _model(np.random.default_rng(1))
    dst = save_with_external_data(model, tmp_path / "model.onnx")
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(dst)).graph.initializer}
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k], v)
    assert data_path(dst).stat().st_size >= INLINE_MAX_BYTES
    onnx.checker.check_model(str(dst))


def test_onnx_writer_appends_and_check_compact_refuses_it(tmp_path):
    """onnx's external-data writer appends to an existing data file of the same name (how ORT's
    quantizer saves): the second model's data file then holds the first one's bytes too. Every
    vlsens writer checks its output and refuses that; its own writer starts each file empty."""
    import copy

    import pytest

    from vlsens.core.errors import ArtifactError
    from vlsens.core.onnxutil import check_compact

    model, _ = _model(np.random.default_rng(2))
    dst = tmp_path / "model.onnx"
    for _ in range(2):
        onnx.save_model(copy.deepcopy(model), str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=0)
    referenced = (64 * 32 + 32 * 8) * 4 + 4 * 8
    assert data_path(dst).stat().st_size == 2 * referenced  # the first copy stayed in the file
    with pytest.raises(ArtifactError, match=rf"{referenced} of its {2 * referenced} bytes are referenced by no tensor"):
        check_compact(dst)
    for _ in range(2):
        save_with_external_data(copy.deepcopy(model), dst)
    assert check_compact(dst) == data_path(dst).stat().st_size  # compact, written twice
    # a tensor pointing past the end of its file is an incomplete model
    with open(data_path(dst), "r+b") as f:
        f.truncate(data_path(dst).stat().st_size - 8)
    with pytest.raises(ArtifactError, match="incomplete"):
        check_compact(dst)
