"""Calibration tensors: processor parity, disjoint split, NPU tar, clear errors for bad images."""

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from conftest import tower_of

from vlsens.core.errors import ImageError
from vlsens.data.calibration import load_split, read_tar
from vlsens.data.images import ImageRef, open_rgb, resolve_images
from vlsens.data.inputs import write_manifests
from vlsens.export import stages
from vlsens.model.vision import Geometry, patchify, processor_inputs


def build_calibration(ckpt, refs, h, w, out, n_calib, n_eval, skip_unreadable=False):
    """The fixed-size tower's calibration set (+ its NPU archive) of ``refs`` at h x w."""
    tower = tower_of(f"vision/{h}x{w}", **{"vision.sizes": [f"{h}x{w}"]})
    manifest = write_manifests(out.parent / f"{out.name}-inputs", None, refs, refs, None)["calibration_images"]
    settings = {**tower.calibration_settings(), "num_calib": n_calib, "num_eval": n_eval,
                "skip_unreadable": skip_unreadable}
    m = stages.calibration(tower, ckpt, {"images": manifest}, out, settings)
    stages.npu_archive(out / "calib.npz", out / "eval.npz", out / "calib.tar", out / "eval.tar")
    return m


@pytest.fixture(scope="module")
def calib_224(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("calib")
    build_calibration(tiny_ckpt, resolve_images("builtin"), 224, 224, out, n_calib=5, n_eval=3)
    return out


def test_split_is_disjoint_and_complete(calib_224):
    m = json.loads((calib_224 / "manifest.json").read_text())
    by = {s: [i for i in m["samples"] if i["split"] == s] for s in ("calib", "eval")}
    assert len(by["calib"]) == 5 and len(by["eval"]) == 3 and m["counts"] == {"calib": 5, "eval": 3}
    assert not {i["sha256"] for i in by["calib"]} & {i["sha256"] for i in by["eval"]}
    assert not {i["source"] for i in by["calib"]} & {i["source"] for i in by["eval"]}
    for s in ("calib", "eval"):
        with np.load(calib_224 / f"{s}.npz") as z:
            assert [str(n) for n in z["names"]] == [i["name"] for i in by[s]]


def test_tensors_equal_the_processor_output(calib_224, tiny_ckpt):
    from vlsens.model.processor import load_image_processor

    m = json.loads((calib_224 / "manifest.json").read_text())
    evals = [i for i in m["samples"] if i["split"] == "eval"]
    pixels = load_split(calib_224 / "eval.npz")
    assert pixels.shape == (3, 3, 224, 224) and pixels.dtype == np.float32
    proc = load_image_processor(tiny_ckpt)
    hf = processor_inputs(proc, [open_rgb(ImageRef(i["source"], i["name"])) for i in evals], 224, 224)
    np.testing.assert_array_equal(patchify(torch.from_numpy(pixels), Geometry()).numpy(), hf["pixel_values"])


def test_tar_of_npy_matches_npz(calib_224):
    np.testing.assert_array_equal(read_tar(calib_224 / "calib.tar"), load_split(calib_224 / "calib.npz"))
    np.testing.assert_array_equal(read_tar(calib_224 / "eval.tar"), load_split(calib_224 / "eval.npz"))


def _images_with_a_corrupt_one(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    for r in resolve_images("builtin")[:4]:
        shutil.copy(r.path, d / r.name)
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not an image")
    return resolve_images(str(d))


def test_corrupt_image_fails_naming_the_file(tiny_ckpt, tmp_path):
    refs = _images_with_a_corrupt_one(tmp_path)
    with pytest.raises(ImageError, match=r"broken\.png.*skip_unreadable"):
        build_calibration(tiny_ckpt, refs, 224, 224, tmp_path / "out", 2, 1)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_corrupt_image_can_be_skipped(tiny_ckpt, tmp_path, caplog):
    refs = _images_with_a_corrupt_one(tmp_path)
    with caplog.at_level(logging.WARNING):
        m = build_calibration(tiny_ckpt, refs, 224, 224, tmp_path / "out", 2, 2, skip_unreadable=True)
    assert "broken.png" in caplog.text
    # the 4 readable images fill both splits (2 + 2, the counts asked for); the broken one is in neither
    good = sorted(r.name for r in refs if r.name != "broken.png")
    assert len(good) == 4 and m["counts"] == {"calib": 2, "eval": 2}
    assert sorted(i["name"] for i in m["samples"]) == good


def test_calibration_logs_its_progress_in_images(tiny_ckpt, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="vlsens.progress"):
        build_calibration(tiny_ckpt, resolve_images("builtin"), 224, 224, tmp_path / "out", 3, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "vlsens.progress"]
    assert lines and lines[-1].startswith("calibration: 5/5 images (100 %)"), lines


def test_grayscale_and_rgba_are_converted(tmp_path):
    from PIL import Image

    Image.new("L", (30, 20), 128).save(tmp_path / "g.png")
    Image.new("RGBA", (30, 20), (10, 20, 30, 0)).save(tmp_path / "a.png")
    for n in ("g.png", "a.png"):
        im = open_rgb(ImageRef(tmp_path / n, n))
        assert im.mode == "RGB" and im.size == (30, 20)


def test_too_few_images_is_a_clear_error(tiny_ckpt, tmp_path):
    with pytest.raises(ImageError, match="num_calib"):
        build_calibration(tiny_ckpt, resolve_images("builtin")[:3], 224, 224, tmp_path / "o", 2, 2)
