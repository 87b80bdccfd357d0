"""Stage: onnxsim on an FP32 or FP16 model, its check fed real images, then our own parity gate.

onnxsim's own check copies the model and feeds random data unless given ``input_data``; random
index tensors break dynamic graphs, and above ~2 GB the copy costs several GB of memory (onnxsim
0.8.1 peaked at 9.3 GiB on the 2.7 GB Qwen2.5-VL-3B vision tower). So: its check runs with the parity images for models up to
``check_max_bytes``, and the vlsens parity gate against transformers runs always.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vlsens import parity
from vlsens.artifacts import publish_model
from vlsens.errors import ParityError
from vlsens.fsutil import staging_dir
from vlsens.onnxutil import check_model, data_path, make_session, resave
from vlsens.vision import Reference

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
        "onnxsim_check": "passed" if check_n else f"skipped: model is {size} bytes > {check_max_bytes}",
        "nodes_before": nodes_before,
        "nodes_after": nodes_after,
        "source": str(src_model),
    }


def simplify_vision(src_model: str | Path, reference_path: str | Path, out_model: str | Path,
                    out_parity: str | Path, tolerance: dict, variant: str,
                    check_max_bytes: int = 2_000_000_000, threads: int = 0, device: str = "auto") -> dict:
    out_model = Path(out_model)
    ref = Reference.load(reference_path)
    sess = make_session(src_model, threads=threads, device="cpu")
    inp = sess.get_inputs()[0]
    batch = inp.shape[0] if isinstance(inp.shape[0], int) else 1
    del sess
    with staging_dir(out_model) as tmp:
        staged = tmp / out_model.name
        extra = simplify_model(src_model, {inp.name: ref.pixel_values[:batch]}, staged, check_max_bytes)
        record = parity.check_vision(staged, ref, tolerance, variant=variant, threads=threads,
                                     device=device, extra=extra, artifact=out_model)
        publish_model(staged, record, out_model, out_parity)
    return record
