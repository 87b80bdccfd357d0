"""Canonical digests (vlsens.core.canonical): equal for outputs that compute the same thing in other
bytes (a new producer_version, new zip or tar headers, new timings in a record), different for any
change a consumer would see."""

from __future__ import annotations

import json
import tarfile
import time

import numpy as np

from vlsens.core.canonical import digest, equivalent


def _model(path, producer="2.13.0", weight=1.0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((2, 2), weight, dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w])
    m = helper.make_model(g, producer_name="pytorch", producer_version=producer)
    onnx.save(m, str(path))


def test_a_graph_from_a_new_producer_version_is_the_same_graph(tmp_path):
    _model(tmp_path / "a.onnx", "2.13.0")
    _model(tmp_path / "b.onnx", "2.14.0")
    _model(tmp_path / "c.onnx", "2.13.0", weight=2.0)
    assert (tmp_path / "a.onnx").read_bytes() != (tmp_path / "b.onnx").read_bytes()
    assert equivalent(tmp_path / "a.onnx", tmp_path / "b.onnx")
    assert not equivalent(tmp_path / "a.onnx", tmp_path / "c.onnx")


def test_arrays_compare_by_value_not_by_container(tmp_path):
    a = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    np.savez(tmp_path / "a.npz", **a)
    time.sleep(1.1)  # a zip member's header carries its time (2 s resolution)
    np.savez_compressed(tmp_path / "b.npz", **a)
    np.savez(tmp_path / "c.npz", x=a["x"].astype(np.float64))
    assert equivalent(tmp_path / "a.npz", tmp_path / "b.npz")
    assert not equivalent(tmp_path / "a.npz", tmp_path / "c.npz")  # the dtype is what a consumer reads


def test_tar_members_compare_by_name_and_bytes(tmp_path):
    (tmp_path / "x_0.npy").write_bytes(b"abc")
    for name in ("a.tar", "b.tar"):
        with tarfile.open(tmp_path / name, "w") as t:
            info = t.gettarinfo(tmp_path / "x_0.npy", "x_0.npy")
            info.mtime = 1 if name == "a.tar" else 2
            with open(tmp_path / "x_0.npy", "rb") as fh:
                t.addfile(info, fh)
    assert (tmp_path / "a.tar").read_bytes() != (tmp_path / "b.tar").read_bytes()
    assert equivalent(tmp_path / "a.tar", tmp_path / "b.tar")


def test_records_ignore_timings_and_versions_but_not_results(tmp_path):
    base = {"passed": True, "metrics": {"min_cosine": 0.99999}, "seconds": 1.0, "versions": {"torch": "2.13.0"},
            "files": {"model.onnx": {"bytes": 10, "sha256": "aa"}}}
    (tmp_path / "a.json").write_text(json.dumps(base))
    (tmp_path / "b.json").write_text(json.dumps({**base, "seconds": 2.5, "versions": {"torch": "2.14.0"},
                                                 "files": {"model.onnx": {"bytes": 10, "sha256": "bb"}}}))
    (tmp_path / "c.json").write_text(json.dumps({**base, "metrics": {"min_cosine": 0.99998}}))
    assert equivalent(tmp_path / "a.json", tmp_path / "b.json")
    assert not equivalent(tmp_path / "a.json", tmp_path / "c.json")


def test_folders_compare_file_by_file_without_bookkeeping(tmp_path):
    for name, producer in (("a", "2.13.0"), ("b", "2.14.0")):
        d = tmp_path / name
        (d / ".vlsens").mkdir(parents=True)
        _model(d / "model.onnx", producer)
        (d / ".vlsens" / "model.onnx.json").write_text(name)
        (d / ".snakemake_timestamp").write_text(name)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    (tmp_path / "b" / "extra.txt").write_text("x")
    assert digest(tmp_path / "a") != digest(tmp_path / "b")


def test_a_record_may_name_its_own_timing_keys_and_file_sizes_do_not_count(tmp_path):
    timed = {"plans": {"p1": {"error": 0.05, "measured": {"ms": 0.09, "q1": 0.08, "q3": 0.11, "steps": 30}}},
             "volatile_keys": ["error", "q1", "q3"]}
    (tmp_path / "a.json").write_text(json.dumps(timed))
    again = json.loads(json.dumps(timed))
    again["plans"]["p1"].update(error=-0.2, measured={"ms": 0.15, "q1": 0.14, "q3": 0.2, "steps": 30})
    (tmp_path / "b.json").write_text(json.dumps(again))
    assert equivalent(tmp_path / "a.json", tmp_path / "b.json")
    again["plans"]["p1"]["measured"]["steps"] = 31  # not a time: a change
    (tmp_path / "c.json").write_text(json.dumps(again))
    assert not equivalent(tmp_path / "a.json", tmp_path / "c.json")
    # "error" is a result where a record does not say otherwise
    (tmp_path / "d.json").write_text(json.dumps({"error": 0.05}))
    (tmp_path / "e.json").write_text(json.dumps({"error": 0.06}))
    assert not equivalent(tmp_path / "d.json", tmp_path / "e.json")
    # the size of a listed file (one holding a time of its own) is not the record's content; a size elsewhere is
    (tmp_path / "f.json").write_text(json.dumps({"files": {"plan.yaml": {"bytes": 1457}}, "bytes": 10}))
    (tmp_path / "g.json").write_text(json.dumps({"files": {"plan.yaml": {"bytes": 1456}}, "bytes": 10}))
    (tmp_path / "h.json").write_text(json.dumps({"files": {"plan.yaml": {"bytes": 1456}}, "bytes": 11}))
    assert equivalent(tmp_path / "f.json", tmp_path / "g.json")
    assert not equivalent(tmp_path / "g.json", tmp_path / "h.json")


def test_raw_files_compare_byte_for_byte(tmp_path):
    from vlsens.core.canonical import differences, same_file

    data = bytes(range(256)) * 70_000  # 17.9 MB: more than one 16 MB chunk
    for name, body in (("a.bin", data), ("b.bin", data), ("c.bin", data[:-1] + b"\x00"), ("d.bin", data[:-1])):
        (tmp_path / name).write_bytes(body)
    assert same_file(tmp_path / "a.bin", tmp_path / "b.bin")
    assert not same_file(tmp_path / "a.bin", tmp_path / "c.bin")  # the last byte, in the second chunk
    assert not same_file(tmp_path / "a.bin", tmp_path / "d.bin")  # another size
    for folder, body in (("x", data), ("y", data[:-1] + b"\x00")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.onnx.data").write_bytes(body)
    assert differences(tmp_path / "x", tmp_path / "y") == ["model.onnx.data"]
