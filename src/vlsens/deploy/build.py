"""The deploy job: assemble one folder, check it, publish it only when every check passed."""

from __future__ import annotations

import json
from pathlib import Path

from vlsens import paths
from vlsens.deploy import DONE, prepacked
from vlsens.deploy.assemble import assemble
from vlsens.deploy.evaluate import eval_cases, evaluate, transformers_generate, vision_parity
from vlsens.runtime import Chat


def build_folder(precision: str, out_dir: str | Path, checkpoint: str | Path, decoder: str | Path,
                 embedding: str | Path, vision: str | Path, images, max_new_tokens: int, tolerance: dict | None,
                 fp32_folder: str | Path | None = None, target: dict | None = None) -> dict:
    """Assemble, gate and evaluate one deploy folder; publish it only when every check passed."""
    import tempfile

    from vlsens.artifacts import file_entries
    from vlsens.fsutil import atomic_dir, write_json

    out_dir = Path(out_dir)
    fp32_eval = json.loads((Path(fp32_folder) / DONE).read_text()) if fp32_folder else None
    with atomic_dir(out_dir) as tmp, tempfile.TemporaryDirectory(prefix="vlsens-deploy-") as work:
        files = assemble(tmp, checkpoint, decoder, embedding, vision, Path(work) / "preamble")
        cases = eval_cases(images, Path(work) / "images")
        # transformers' tokens before the folder is loaded: the two float32 models never sit in
        # memory together (at 3B with all 36 layers each is 14-15 GB)
        expected = transformers_generate(checkpoint, cases, max_new_tokens) if precision == "fp32" else None
        runtime = Chat(tmp, prepack=prepacked(precision))  # loaded once for both checks
        parity = vision_parity(tmp, checkpoint, cases, tolerance, runtime)
        parity["files"] = file_entries(files.values())
        parity["sources"] = {"decoder": str(decoder), "embedding": str(embedding), "vision": str(vision)}
        write_json(tmp / paths.RECORD, parity)
        record = evaluate(tmp, precision, checkpoint, cases, max_new_tokens, fp32_folder, fp32_eval, target, runtime,
                          expected)
        del runtime
        for c in record["cases"]:  # the images lived in a temporary folder: keep their names
            c["images"] = [{"source": f["source"], "size": f["size"]} for f in c["images"]]
        write_json(tmp / DONE, record)
    return record
