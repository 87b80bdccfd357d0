"""A deploy folder's files: its three graphs (verified against their records), genai_config.json,
processor_config.json and the tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from vlsens.deploy.genai import folder as genai


def assemble(out_dir: str | Path, checkpoint: str | Path, decoder: str | Path, embedding: str | Path,
             vision: str | Path, workdir: str | Path, tied: bool = False,
             preamble_from: str | Path | None = None) -> dict[str, Path]:
    """Write the folder's graphs, configs and tokenizer into ``out_dir`` (a staging folder).
    ``tied``: the embedding graph is ``embedding``'s with its table read from the folder decoder's
    lm_head weight (:func:`vlsens.precision.weight_only.tied_embedding`; no data file of its own).
    ``preamble_from``: the fp32 folder's ``vision.onnx``, whose vision preamble is reused
    (:func:`~vlsens.deploy.genai.folder.wrap_vision`), else exported from the checkpoint's config."""
    from vlsens.core.artifacts import verify
    from vlsens.core.fsutil import write_json
    from vlsens.core.onnxutil import copy_model

    out_dir, checkpoint = Path(out_dir), Path(checkpoint)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((checkpoint / "config.json").read_text())
    gen_path = checkpoint / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    pre = json.loads((checkpoint / "preprocessor_config.json").read_text())
    vc = None
    if preamble_from is None:
        from transformers import AutoConfig

        vc = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False).vision_config
    files = {"decoder": copy_model(verify(decoder), out_dir / genai.GRAPHS["decoder"])}
    if tied:
        from vlsens.precision.weight_only import tied_embedding

        dst = out_dir / genai.GRAPHS["embedding"]
        tied_embedding(files["decoder"], verify(embedding), dst)
        files["embedding"] = dst
    else:
        files["embedding"] = copy_model(verify(embedding), out_dir / genai.GRAPHS["embedding"])
    files["vision"] = genai.wrap_vision(verify(vision), out_dir / genai.GRAPHS["vision"], vc, workdir, preamble_from)
    write_json(out_dir / "genai_config.json", genai.genai_config(cfg, gen))
    write_json(out_dir / "processor_config.json", genai.processor_config(pre, cfg["model_type"]))
    for name in genai.TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, out_dir / name)
    return files
