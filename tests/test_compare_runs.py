"""bench/compare_runs.py, the before/after check of a refactoring: it leaves out what names the
moment or the writer, and nothing that the computation decides."""

import importlib.util
import json

import numpy as np
import onnx
from conftest import REPO
from onnx import TensorProto, helper, numpy_helper

spec = importlib.util.spec_from_file_location("compare_runs", REPO / "bench" / "compare_runs.py")
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)


def _model(path, weight: float, producer: str):
    w = numpy_helper.from_array(np.full((2, 2), weight, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w])
    onnx.save(helper.make_model(graph, producer_name="vlsens", producer_version=producer), str(path))


def _tree(root, kl=1e-5, seconds=3.0, tok_s=150.0, weight=1.0, producer="0.1+abc", module="vlsens.towers.text"):
    root.mkdir()
    (root / "eval.json").write_text(json.dumps({"mean_kl": kl, "seconds": seconds, "files": {"m.onnx": {"sha256": producer}},
                                                "reference": f"{module}.Text"}))
    (root / "int4.md").write_text(f"| folder | KL | tok/s |\n| --- | ---: | ---: |\n| int4-mixed | {kl} | {tok_s} |\n")
    np.savez(root / "calib.npz", x=np.arange(4, dtype=np.float32))
    _model(root / "m.onnx", weight, producer)
    return root


def test_the_writer_and_the_moment_are_left_out(tmp_path):
    a = _tree(tmp_path / "a")
    b = _tree(tmp_path / "b", seconds=9.0, tok_s=99.0, producer="0.1+def", module="vlsens.export.towers.text")
    assert cr.compare(a, b) == []


def test_what_the_computation_decides_is_compared(tmp_path):
    a = _tree(tmp_path / "a")
    assert any("mean_kl" in d for d in cr.compare(a, _tree(tmp_path / "kl", kl=2e-5)))
    assert any("m.onnx" in d for d in cr.compare(a, _tree(tmp_path / "w", weight=1.5)))
    assert any("int4.md" in d for d in cr.compare(a, _tree(tmp_path / "md", kl=1e-5 + 1e-12)))
    assert any("reference" in d for d in cr.compare(a, _tree(tmp_path / "m", module="vlsens.other")))
    c = _tree(tmp_path / "c")
    np.savez(c / "calib.npz", x=np.arange(4, dtype=np.float32) + 1e-7)
    assert cr.compare(a, c) == ["calib.npz: array x differs"]
