"""onnxsim on an FP32 or FP16 model, its own check fed real inputs (a pure transform;
:mod:`vlsens.variants` gates against transformers and publishes).

onnxsim's own check copies the model and feeds random data unless given ``input_data``; random
index tensors break dynamic graphs, and above ~2 GB the copy costs several GB of memory (onnxsim
0.8.1 peaked at 9.3 GiB on the 2.7 GB Qwen2.5-VL-3B vision tower). So its check runs with a
parity input for FP32 models up to ``check_max_bytes``, and the vlsens parity gate runs always.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vlsens.core.errors import ParityError
from vlsens.core.onnxutil import check_model, data_path, resave

log = logging.getLogger(__name__)


def simplify_model(src_model: str | Path, input_data: dict, staged_model: Path,
                   check_max_bytes: int = 2_000_000_000) -> dict:
    """onnxsim of ``src_model`` into ``staged_model`` (its own check fed ``input_data`` up to
    ``check_max_bytes``). Returns the facts for the parity record's ``extra``."""
    import onnx
    import onnxsim

    size = Path(src_model).stat().st_size + data_path(src_model).stat().st_size
    check_n = 1 if size <= check_max_bytes else 0
    nodes_before = len(onnx.load(str(src_model), load_external_data=False).graph.node)
    raw = Path(staged_model).parent / f"raw-{Path(staged_model).stem}" / "model.onnx"
    raw.parent.mkdir(parents=True)
    _, ok = onnxsim.simplify(str(src_model), check_n=check_n, input_data=input_data, output_path=str(raw))
    if not ok:
        raise ParityError(f"onnxsim's own check failed for {src_model} on real inputs; nothing was written.")
    resave(raw, staged_model)
    check_model(staged_model)
    nodes_after = len(onnx.load(str(staged_model), load_external_data=False).graph.node)
    return {
        "simplifier": f"onnxsim.simplify(check_n={check_n}, input_data=<parity inputs>)",
        "onnxsim_check": "passed" if check_n else (f"skipped: model is {size} bytes > {check_max_bytes}"
                                                   if check_max_bytes else "skipped: FP16 source (the gate judges)"),
        "nodes_before": nodes_before,
        "nodes_after": nodes_after,
        "source": str(src_model),
    }
