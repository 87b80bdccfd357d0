"""Atomic publication: nothing partial may look complete, nothing private, nothing left behind."""

import os
import stat

import pytest

from vlsens.core.fsutil import (
    atomic_dir,
    copy_file,
    publish,
    remove_stale,
    savez,
    staging_dir,
    stale_entries,
    write_json,
)


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


def test_staging_dir_is_named_after_its_output_and_removed(tmp_path):
    owner = tmp_path / "fp32" / "model.onnx"
    with staging_dir(owner) as tmp:
        assert tmp.parent == owner.parent and tmp.name.startswith(".model.onnx.staging-")
        (tmp / "x").write_text("x")
    assert list((tmp_path / "fp32").iterdir()) == []


def _mode(p):
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_published_files_follow_the_umask(tmp_path, umask):
    """Temporary files are private (0600) when created; what is published is not."""
    old = os.umask(umask)
    try:
        write_json(tmp_path / "a.json", {"a": 1})
        savez(tmp_path / "a.npz", {"x": __import__("numpy").zeros(2)})
        with staging_dir(tmp_path / "out" / "model.onnx") as st:
            (st / "model.onnx").write_text("m")
            os.chmod(st / "model.onnx", 0o600)  # as tempfile or a library may leave it
            publish({tmp_path / "out" / "model.onnx": st / "model.onnx"})
        with atomic_dir(tmp_path / "ckpt") as d:
            (d / "w.safetensors").write_text("w")
            os.chmod(d / "w.safetensors", 0o600)
    finally:
        os.umask(old)
    for f in ("a.json", "a.npz", "out/model.onnx", "ckpt/w.safetensors"):
        assert _mode(tmp_path / f) == 0o666 & ~umask, f
    assert _mode(tmp_path / "ckpt") == 0o777 & ~umask


def test_remove_stale_takes_only_the_jobs_own_leftovers(tmp_path):
    d = tmp_path / "sens"
    d.mkdir()
    mine = [d / ".ort.csv.tmp-abc", d / ".ort.csv.staging-xyz"]
    others = [d / ".inc.csv.staging-q", d / ".ort.csv.data"]  # another job's, and not a temp name
    mine[0].write_text("x")
    mine[1].mkdir()
    (mine[1] / "model.onnx.data").write_text("x")
    others[0].mkdir()
    others[1].write_text("x")
    assert set(stale_entries([d / "ort.csv"])) == set(mine)
    assert set(remove_stale([d / "ort.csv", tmp_path / "missing" / "x"])) == set(mine)
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)


def test_copy_file_never_hard_links(tmp_path):
    (tmp_path / "a").write_bytes(b"0123" * 1000)
    copy_file(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == (tmp_path / "a").read_bytes()
    assert (tmp_path / "a").stat().st_nlink == 1 and (tmp_path / "b").stat().st_nlink == 1


def test_write_json(tmp_path):
    write_json(tmp_path / "a.json", {"b": 1, "a": 2})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_a_cut_or_foreign_array_file_is_one_error_naming_it(tmp_path):
    """Every .npz reader (calibration splits, reference cases, the measure's reference) goes
    through open_npz: a file cut in half, a text file, a missing file and a file without the array
    asked for are one VlsensError naming the file and the command that rebuilds it, not a zipfile
    or numpy traceback; a whole file reads as before."""
    import numpy as np

    from vlsens.core.errors import VlsensError
    from vlsens.data.cases import Cases
    from vlsens.data.samples import ReferenceStore, Samples, save_stacked

    good = tmp_path / "calib.npz"
    save_stacked(good, {"pixel_values": np.arange(24, dtype=np.float32).reshape(2, 3, 4)}, ["a", "b"])
    assert len(Samples.load(good).feeds) == 2
    data = good.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.npz").write_text("not arrays\n")
    for name, load in (("cut.npz", Samples.load), ("text.npz", Samples.load), ("missing.npz", Samples.load),
                       ("cut.npz", Cases.load), ("cut.npz", ReferenceStore), ("calib.npz", Cases.load)):
        with pytest.raises(VlsensError) as e:
            load(tmp_path / name)
        msg = str(e.value)
        assert msg.startswith(f"{tmp_path / name}: ") and f"snakemake --forcerun {tmp_path / name}" in msg, msg
        assert "\n" not in msg
