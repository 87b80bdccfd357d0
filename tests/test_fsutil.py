"""Atomic publication: nothing partial may look complete."""

import pytest

from vlsens.fsutil import atomic_dir, publish, staging_dir, write_json


def test_publish_moves_the_model_last(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "model.onnx").write_text("m")
    out = tmp_path / "out"
    # The data file is missing from the stage: publishing fails before the model appears.
    with pytest.raises(FileNotFoundError):
        publish({out / "model.onnx.data": stage / "model.onnx.data", out / "model.onnx": stage / "model.onnx"},
                last=out / "model.onnx")
    assert not (out / "model.onnx").exists()
    (stage / "model.onnx.data").write_text("d")
    publish({out / "model.onnx": stage / "model.onnx", out / "model.onnx.data": stage / "model.onnx.data"},
            last=out / "model.onnx")
    assert (out / "model.onnx").read_text() == "m" and (out / "model.onnx.data").read_text() == "d"


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "ckpt"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("killed")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(target) as tmp:
        (tmp / "config.json").write_text("{}")
    assert (target / "config.json").is_file()


def test_staging_dir_is_removed(tmp_path):
    with staging_dir(tmp_path / "fp32") as tmp:
        (tmp / "x").write_text("x")
    assert list((tmp_path / "fp32").iterdir()) == []


def test_write_json(tmp_path):
    write_json(tmp_path / "a.json", {"b": 1, "a": 2})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
