"""Patch layout and size rules."""

import numpy as np
import pytest
import torch

from vlsens.core.errors import ConfigError
from vlsens.core.sizes import nearest_valid_sizes, parse_size
from vlsens.data.images import open_rgb, resize_exact
from vlsens.model.vision import Geometry, patchify, preprocess_nchw, processor_inputs, unpatchify


@pytest.mark.parametrize("h,w", [(224, 224), (224, 336), (308, 252)])
def test_patchify_equals_hf_image_processor(tiny_ckpt, parity_refs, h, w):
    """Our in-graph patchify of an independently normalized image == the processor's patches."""
    from vlsens.model.processor import load_image_processor

    proc = load_image_processor(tiny_ckpt)
    imgs = [open_rgb(r) for r in parity_refs]
    hf = processor_inputs(proc, imgs, h, w)
    # Normalize by hand (rescale 1/255, CLIP mean/std), not through the processor.
    mean = np.array(proc.image_mean, dtype=np.float64)[:, None, None]
    std = np.array(proc.image_std, dtype=np.float64)[:, None, None]
    own = np.stack([
        ((np.asarray(resize_exact(im, h, w), dtype=np.float64).transpose(2, 0, 1) / 255.0) - mean) / std
        for im in imgs
    ]).astype(np.float32)
    ours = patchify(torch.from_numpy(own), Geometry()).numpy()
    assert ours.shape == hf["pixel_values"].shape
    np.testing.assert_allclose(ours, hf["pixel_values"], atol=1e-5, rtol=0)
    assert hf["image_grid_thw"].tolist() == [[1, h // 14, w // 14]] * len(imgs)
    # unpatchify inverts the processor layout exactly; patchify maps it back.
    nchw = unpatchify(hf["pixel_values"], hf["image_grid_thw"], Geometry())
    np.testing.assert_allclose(nchw, own, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(patchify(torch.from_numpy(nchw), Geometry()).numpy(), hf["pixel_values"])
    np.testing.assert_array_equal(preprocess_nchw(proc, imgs, h, w), nchw)


def test_parse_size_accepts_multiples_of_28():
    assert parse_size("224x336") == (224, 336)
    assert parse_size("28x56") == (28, 56)


@pytest.mark.parametrize("bad,near", [
    ("230x224", ["224x224", "252x224"]),
    ("224x100", ["224x112", "224x84"]),
    ("0x224", ["28x224"]),
])
def test_invalid_size_names_key_value_and_nearest(bad, near):
    with pytest.raises(ConfigError) as e:
        parse_size(bad, key="vision.sizes[0]")
    msg = str(e.value)
    assert "vision.sizes[0]" in msg and bad in msg and "multiples of 28" in msg
    for n in near:
        assert n in msg


def test_malformed_size():
    with pytest.raises(ConfigError, match="form HxW"):
        parse_size("224")


def test_nearest_valid_sizes_are_valid():
    for h, w in [(1, 1), (29, 500), (449, 447)]:
        for s in nearest_valid_sizes(h, w):
            a, b = map(int, s.split("x"))
            assert a % 28 == 0 and b % 28 == 0 and a > 0 and b > 0
