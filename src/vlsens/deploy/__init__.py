"""Deploy folders: what ships. ``results/<model>/deploy/<precision>/`` is an onnxruntime-genai
(ORT-GenAI) model folder for ``type: qwen2_5_vl`` (see :mod:`vlsens.deploy.genai.folder` for its three graphs):

==============  =====================================  ===========================================
precision       text decoder + embedding               vision
==============  =====================================  ===========================================
``fp32``        ``decoder/fp32``                       ``vision/dynamic/fp32``
``fp16``        ``decoder/fp16``                       ``vision/dynamic/fp16``
``int8-mixed``  ``profile/decoder/fp32`` (+ the fp32   ``profile/vision/dynamic/fp32``
                embedding)
``int4-mixed``  ``profile/decoder/fp32-nbits``:        ``deploy.nbits.vision``
                weight-only INT4/INT8/float per MatMul
                (:mod:`vlsens.precision.nbits`)
``int4-<algo>`` ``decoder/builder-<algo>``: the        ``deploy.nbits.vision``
                builder's ``-p int4`` (``rtn``,
                ``k_quant``, ``k_quant_mixed``)
==============  =====================================  ===========================================

Every int4 folder takes the same vision graph, ``deploy.nbits.vision`` (default ``int8-mixed``:
on the CPU the fastest vision graph that meets its profile; ``int4``: every Linear weight-only
INT4, ``vision/dynamic/int4`` (:mod:`vlsens.precision.weight_only`); ``fp16`` or ``fp32`` where the dynamic
graph is not analysed), and the same embedding graph, ``deploy.nbits.embedding`` (``int4``: the
table as ``GatherBlockQuantized``, ``decoder/embedding-int4``; ``tied``: for checkpoints with
``tie_word_embeddings``, the table read from the folder decoder's lm_head weight in
``decoder.onnx.data``, so the folder carries it once, at lm_head's bits
(:func:`vlsens.precision.weight_only.tied_embedding`, gated in the deploy job on the decoder's embedding
cases); ``fp32``: the decoder folder's), so the int4 folders differ only in their decoders.

Every graph comes from a gated variant folder (or a built profile), so each already passed its
parity gate against transformers. The folder itself is then proven end to end by the runtime we
did not write:

* ``parity.json``: ``vision.onnx`` (the graph behind the index preamble) against transformers'
  ``get_image_features`` on the evaluation images, at the sizes the runtime's own preprocessing
  picks, gated (``parity.tolerance`` of fp32 / fp16, ``deploy.int8_tolerance`` for int8-mixed);
* ``eval.json``: ORT-GenAI generates ``max_new_tokens`` greedy tokens for a text-only prompt, one
  image, and two images of different sizes. The fp32 folder must generate exactly what
  transformers' ``generate`` does (else the job fails and nothing is published). The fp16 and
  INT8 folders are compared with the fp32 folder through ORT-GenAI, teacher-forced on the fp32
  tokens: KL(fp32 || folder) per step and top-1 agreement; the INT8 folder's mean KL is compared
  with the text profile's target.

This package: the DAG-build side here (the folders' sources, config and runtime checks; no
torch), :mod:`.assemble` (graphs, configs, tokenizer into a folder), :mod:`.evaluate` (the
end-to-end checks through onnxruntime-genai and transformers), :mod:`.build` (the job: assemble,
check, publish).
"""

from __future__ import annotations

from vlsens.core import paths
from vlsens.core.errors import ConfigError
from vlsens.export.towers import names

#: The builder's ``algo_config`` values the int4 folders are compared with: uniform INT4 by
#: round-to-nearest, by k_quant, and k_quant with llama.cpp's fixed mixed heuristic.
BUILDER_ALGOS = ("rtn", "k_quant", "k_quant_mixed")
INT4 = ("int4-mixed", *(f"int4-{a}" for a in BUILDER_ALGOS))
PRECISIONS = ("fp32", "fp16", "int8-mixed", *INT4)
DEPLOY = paths.DEPLOY
#: The file that says a deploy folder is complete (written last).
DONE = "eval.json"

#: The graphs a deploy folder is made of: the decoder tower's and the dynamic vision graph.
DECODER_GRAPH, VISION_GRAPH = names.DECODER, names.VISION_DYNAMIC
#: The int4 folders' embedding graph with an INT4 table (:func:`vlsens.precision.weight_only.embedding_folder`).
EMBEDDING_INT4 = f"{paths.MODEL}/{DECODER_GRAPH}/embedding-int4"


def vision_precision(precision: str, int4_vision: str = "int8-mixed") -> str:
    """The precision of a deploy folder's vision graph: its own, or ``int4_vision`` (the config's
    ``deploy.nbits.vision``) for an int4 folder."""
    return int4_vision if precision in INT4 else precision


def prepacked(precision: str) -> bool:
    """Whether a deploy folder's checks load it with ONNX Runtime's weight prepacking (as users
    do): every folder but the fp32 one, the reference, whose float32 weights stay memory-mapped
    (16.4 GB at 36 layers; with the prepacked copies the job exceeds 24 GiB)."""
    return precision != "fp32"


def vision_tolerance(config: dict, precision: str) -> dict:
    """The gate of a deploy folder's ``vision.onnx``: ``parity.tolerance`` of its vision graph's
    precision (fp32, fp16), ``deploy.int8_tolerance`` for the INT8-mixed graph."""
    from vlsens.config import canonical, tolerance_for

    vp = vision_precision(precision, config["deploy"]["nbits"]["vision"])
    if vp == "int4":
        return canonical(config["deploy"]["nbits"]["vision_tolerance"])
    return tolerance_for(config, vp) if vp in ("fp32", "fp16") else canonical(config["deploy"]["int8_tolerance"])


def sources(precision: str, int4_vision: str = "int8-mixed", int4_embedding: str = "fp32") -> dict[str, str]:
    """Path patterns (``{model}`` left) of the graphs a deploy folder is made of."""
    vp = vision_precision(precision, int4_vision)
    dec = paths.fill(paths.VARIANT, graph=DECODER_GRAPH, variant="fp16" if precision == "fp16" else "fp32")
    vis = paths.fill(paths.VARIANT, graph=VISION_GRAPH, variant=vp if vp in ("fp16", "int4") else "fp32")
    # The embedding graph is a secondary file of the decoder's variant folder: that folder's
    # model.onnx and record stand for it as inputs (the job verifies it against the record).
    out = {"decoder_folder": f"{dec}/{paths.MAIN}", "decoder_record": f"{dec}/{paths.RECORD}",
           "vision_record": f"{vis}/{paths.RECORD}"}
    if precision in INT4 and int4_embedding == "int4":
        out["embedding"] = f"{EMBEDDING_INT4}/embedding.onnx"
    if precision in INT4 and int4_embedding == "tied":  # the cases the tied table is gated on
        out["embedding_reference"] = paths.fill(paths.REFERENCE, graph=DECODER_GRAPH)
    out["vision"] = (paths.fill(paths.PROFILE, graph=VISION_GRAPH, variant="fp32") if vp == "int8-mixed" else vis) + \
        "/model.onnx"
    if precision == "int8-mixed":
        out["decoder"] = paths.fill(paths.PROFILE, graph=DECODER_GRAPH, variant="fp32") + "/model.onnx"
    elif precision == "int4-mixed":
        out["decoder"] = paths.fill(paths.NBITS_PROFILE, graph=DECODER_GRAPH, variant="fp32") + "/model.onnx"
    elif precision in INT4:
        out["decoder"] = paths.fill(paths.BUILDER_INT4, graph=DECODER_GRAPH, algo=precision.removeprefix("int4-")) + \
            "/model.onnx"
    else:
        out["decoder"] = f"{dec}/model.onnx"
    return out



def check_config(config: dict, ties: bool = False) -> None:
    """The graphs each requested precision needs are configured (else a ConfigError naming the key);
    ``ties``: whether the checkpoint ties lm_head to the embedding table (``tie_word_embeddings``,
    :func:`vlsens.dag.plan.lm_config`), which ``deploy.nbits.embedding: tied`` needs."""
    d = config["deploy"]
    if not d["enabled"]:
        return
    dyn = config["vision"]["dynamic"]
    if not dyn["enabled"]:
        raise ConfigError("deploy.enabled: the deploy folders take the dynamic vision graph; set "
                          "vision.dynamic.enabled: true or deploy.enabled: false")
    for p in d["precisions"]:
        need = {"fp32": [("vision.dynamic.variants", dyn["variants"], "fp32"),
                         ("deploy.decoder.variants", d["decoder"]["variants"], "fp32")],
                "fp16": [("vision.dynamic.variants", dyn["variants"], "fp16"),
                         ("deploy.decoder.variants", d["decoder"]["variants"], "fp16")],
                "int8-mixed": [("vision.dynamic.sensitivity_variants", dyn["sensitivity_variants"], "fp32"),
                               ("deploy.decoder.sensitivity_variants", d["decoder"]["sensitivity_variants"], "fp32")]}
        vision = d["nbits"]["vision"]
        need["int4"] = [("vision.dynamic.variants", dyn["variants"], "fp32")]  # its source
        for q in INT4:  # deploy.nbits.vision's vision graph; the decoder's fp32 variant
            need[q] = [need[vision][0], ("deploy.decoder.variants", d["decoder"]["variants"], "fp32")]
        for key, have, want in need[p]:
            if want not in have:
                raise ConfigError(f"deploy.precisions has '{p}', which needs '{want}' in {key} (it has {list(have)}); "
                                  f"add it or drop '{p}' from deploy.precisions")
    if "int4-mixed" in d["precisions"] and config["text"]["profile"]["metric"] != "kl":
        raise ConfigError(f"deploy.precisions has 'int4-mixed', whose search holds the decoder's KL per token to "
                          f"text.profile.target; text.profile.metric is {config['text']['profile']['metric']!r}: "
                          f"set it to kl or drop 'int4-mixed'")
    if d["nbits"]["embedding"] == "tied" and set(d["precisions"]) & set(INT4):
        if not ties:
            raise ConfigError(f"deploy.nbits.embedding: tied reads the table from lm_head's weight, but "
                              f"{config['model']['checkpoint']} does not tie them (tie_word_embeddings: false); "
                              "use fp32 or int4")
    if "fp32" not in d["precisions"] and len(d["precisions"]):
        raise ConfigError("deploy.precisions: the fp16 and int8-mixed folders are evaluated against the fp32 "
                          "folder; keep 'fp32' in the list")



def check_runtime(config: dict) -> None:
    """onnxruntime-genai is importable where the deploy folders are built (not checked for conda
    deployments: envs/torch.yaml installs it)."""
    from importlib.util import find_spec

    if config["deploy"]["enabled"] and find_spec("onnxruntime_genai") is None:
        raise ConfigError("deploy.enabled: true needs onnxruntime-genai in this environment: pip install -e "
                          "'.[genai]' (`make run` installs it), or set deploy.enabled: false")
