"""One onnxruntime-genai folder: assembled from gated graphs, vision re-gated behind its preamble,
generation checked through onnxruntime-genai (vlsens.deploy)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.data.inputs import checkpoint_dir, image_refs
from vlsens.deploy.build import build_folder
from vlsens.deploy.genai.evaluate import Checks

run(snakemake, lambda sm: build_folder(  # noqa: F821
    sm.wildcards.precision, sm.output[0], checkpoint_dir(sm.input.checkpoint), sm.input.decoder,
    sm.input.get("embedding") or Path(sm.input.decoder_folder).with_name("embedding.onnx"),
    sm.input.vision, image_refs(sm.input.images),
    Checks(sm.params.max_new_tokens, sm.params.tolerance, fp32_folder=sm.input.get("fp32_folder"),
           target=sm.params.target, vision_features=sm.input.get("vision_features"), provider=sm.params.provider,
           fp32_logits=sm.input.get("fp32_logits"), questions=sm.input.get("questions"),
           # a tied table's folder has the cases its embedding is gated on (vlsens.deploy.sources)
           tied={"reference": sm.input.embedding_reference, "exact_tolerance": sm.params.exact_tolerance}
           if "embedding_reference" in sm.input.keys() else None)))
