"""Publishing a verified ONNX artifact: model + data + parity record, model file last."""

from __future__ import annotations

import logging
from pathlib import Path

from vlsens.fsutil import publish, write_json
from vlsens.onnxutil import data_path

log = logging.getLogger(__name__)


def publish_model(staged_model: Path, record: dict, out_model: str | Path, out_parity: str | Path) -> None:
    """Move a staged, verified model into place: data file, parity record, then ``model.onnx``."""
    out_model, out_parity = Path(out_model), Path(out_parity)
    staged_parity = staged_model.with_name("parity.json")
    write_json(staged_parity, record)
    publish(
        {
            data_path(out_model): data_path(staged_model),
            out_parity: staged_parity,
            out_model: staged_model,
        },
        last=out_model,
    )
    log.info("published %s", out_model)
