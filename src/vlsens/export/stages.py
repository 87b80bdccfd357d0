"""The stages that run a tower's own code: reference, export, calibration set.

Each is the same for every tower: the tower computes (:mod:`vlsens.export.towers.base`), the stage
checks and writes. ``export`` gates the tower's FP32 graph files against the reference cases and
publishes the folder only when every case passes.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vlsens.core import paths
from vlsens.core.artifacts import publish_models
from vlsens.core.errors import VlsensError
from vlsens.core.fsutil import staging_dir
from vlsens.core.onnxutil import check_model
from vlsens.data.calibration import write_calibration, write_npu_archive
from vlsens.data.cases import Cases
from vlsens.export import parity

log = logging.getLogger(__name__)


def reference(tower, checkpoint: str | Path, images, out: str | Path, settings: dict, device: str = "cpu") -> Cases:
    cases = tower.reference(Path(checkpoint), list(images), settings, device=device)
    missing = sorted(set(tower.files) - set(cases.graphs))
    if missing:
        raise VlsensError(f"{tower.graph}: the reference has no parity case for {missing}; every graph file of the "
                          "tower is gated (are parity.images empty?)")
    cases.save(out)
    log.info("reference of %s: %d case(s) for %s", tower.graph, len(cases), cases.graphs)
    return cases


def export(tower, checkpoint: str | Path, reference_path: str | Path, out_dir: str | Path, tolerance: dict,
           settings: dict, threads: int = 0, device: str = "auto") -> dict:
    """The tower's FP32 graph files, checked (ONNX checker), gated against every reference case,
    published in ``out_dir`` with ``parity.json``; nothing is written when a case misses
    ``tolerance``."""
    import time

    out_dir = Path(out_dir)
    cases = Cases.load(reference_path)
    with staging_dir(out_dir / paths.MAIN) as tmp:
        t0 = time.perf_counter()
        log.info("exporting %s (%s) ...", tower.graph, ", ".join(f"{k}={v}" for k, v in sorted(settings.items())))
        staged, extra = tower.export(Path(checkpoint), cases, tmp, settings)
        if list(staged) != list(tower.files):
            raise VlsensError(f"{tower.graph}: export wrote {list(staged)}, the tower declares {list(tower.files)}")
        for p in staged.values():
            check_model(p)
        log.info("exported %s in %.1f s (%s); gating against %d case(s)", tower.graph, time.perf_counter() - t0,
                 ", ".join(f"{f}: {_mb(p)}" for f, p in staged.items()), len(list(cases)))
        record = parity.check(staged, cases, tolerance, "fp32", threads, device, extra=extra, artifact=out_dir)
        publish_models(staged, record, out_dir)
    return record


def _mb(model: Path) -> str:
    from vlsens.core.onnxutil import data_path

    size = model.stat().st_size + (data_path(model).stat().st_size if data_path(model).exists() else 0)
    return f"{size / 1e6:.1f} MB"


def calibration(tower, checkpoint: str | Path, inputs: dict, out_dir: str | Path, settings: dict) -> dict:
    return write_calibration(tower.calibration(Path(checkpoint), inputs, settings), out_dir, tower.graph)


def npu_archive(calib_npz: str | Path, eval_npz: str | Path, calib_tar: str | Path, eval_tar: str | Path) -> None:
    for npz, tar in ((calib_npz, calib_tar), (eval_npz, eval_tar)):
        n = write_npu_archive(npz, tar)
        log.info("%s: %d sample(s)", tar, n)
