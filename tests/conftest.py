"""Shared fixtures: one tiny checkpoint, reference and fp32 export per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOL_FP32 = {"min_cosine": 0.99999, "max_rel_error": 1e-4}
TOL_FP16 = {"min_cosine": 0.999, "max_rel_error": 2e-2}

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    from vlsens.checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", seed=0)


@pytest.fixture(scope="session")
def parity_refs():
    from vlsens.images import resolve_images

    return resolve_images("builtin")[:2]


@pytest.fixture(scope="session")
def reference_224(tiny_ckpt, parity_refs, tmp_path_factory) -> Path:
    from vlsens.vision import compute_reference

    path = tmp_path_factory.mktemp("ref") / "reference.npz"
    compute_reference(tiny_ckpt, parity_refs, 224, 224).save(path)
    return path


@pytest.fixture(scope="session")
def fp32_224(tiny_ckpt, reference_224, tmp_path_factory) -> Path:
    from vlsens.export import export_vision_fixed

    out = tmp_path_factory.mktemp("fp32") / "model.onnx"
    export_vision_fixed(tiny_ckpt, reference_224, out, out.with_name("parity.json"), 224, 224, TOL_FP32)
    return out


@pytest.fixture
def pickle_only_ckpt(tiny_ckpt, tmp_path) -> Path:
    """A Qwen2.5-VL config next to pickle weights only (never loaded)."""
    import shutil

    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(tiny_ckpt / "config.json", d / "config.json")
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    return d
