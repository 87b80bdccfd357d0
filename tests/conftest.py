"""Shared fixtures: one tiny checkpoint, reference and fp32 export per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOL_FP32 = {"min_cosine": 0.99999, "max_rel_error": 1e-4}
TOL_FP16 = {"min_cosine": 0.999, "max_rel_error": 2e-2}

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The planted INT8 sensitivity of the tiny preset's tests (function-preserving outlier).
PLANT = {"block": 2, "channels": 2, "scale": 1000.0}
#: Engine inc's interpreter, as `make inc-env` (part of `make test`) builds it.
INC_PYTHON = REPO / ".venv-inc" / "bin" / "python"


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


def _pipeline(root, outlier):
    """checkpoint -> fp32 export (gated) -> calibration -> ort engine (3 shards) -> ort.csv."""
    from vlsens.calibration import build_calibration
    from vlsens.checkpoint import build_tiny_checkpoint
    from vlsens.export import export_vision_fixed
    from vlsens.images import resolve_images
    from vlsens.quant import QuantSettings
    from vlsens.sensitivity_stage import gather, prepare, run_shard
    from vlsens.vision import compute_reference

    ckpt = build_tiny_checkpoint(root / "ckpt", seed=0, outlier=outlier)
    refs = resolve_images("builtin")
    compute_reference(ckpt, refs[:2], 224, 224).save(root / "ref.npz")
    model = root / "fp32" / "model.onnx"
    export_vision_fixed(ckpt, root / "ref.npz", model, root / "fp32" / "parity.json", 224, 224, TOL_FP32)
    build_calibration(ckpt, refs, 224, 224, root / "calib", 6, 3)
    prepare(model, root / "calib" / "calib.npz", root / "calib" / "eval.npz", root / "engine", QuantSettings())
    shards = [root / "shards" / f"ort.{i}-of-3.csv" for i in range(3)]
    for i, p in enumerate(shards):
        run_shard(root / "engine", root / "calib" / "eval.npz", i, 3, p)
    gather(root / "engine", root / "calib" / "eval.npz", shards, root / "ort.csv", root / "ort.json")
    return root


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """The tiny preset with the planted outlier, through the ort engine (shared by test modules)."""
    return _pipeline(tmp_path_factory.mktemp("planted"), PLANT)


@pytest.fixture(scope="session")
def unplanted(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("unplanted"), None)


@pytest.fixture(scope="session")
def inc_python() -> Path:
    if not INC_PYTHON.exists():
        pytest.fail(f"engine inc's environment is missing ({INC_PYTHON}); `make test` builds it (make inc-env)")
    return INC_PYTHON
