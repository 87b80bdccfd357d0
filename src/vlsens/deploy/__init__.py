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
#: The embedding graph with a weight-only table (GatherBlockQuantized), per bits
#: (:func:`vlsens.precision.weight_only.embedding_folder`).
EMBEDDING_NBITS = f"{paths.MODEL}/{DECODER_GRAPH}/embedding-int{{bits}}"
EMBEDDING_INT4 = paths.fill(EMBEDDING_NBITS, bits=4)
#: The dynamic vision graph weight-only (:data:`vlsens.precision.weight_only.FORMATS`):
#: ``int4`` at the run's settings (``deploy.nbits``), ``int4-rtn128`` (Olive's CPU recipe for
#: Qwen2.5-VL: RTN, blocks of 128) and ``int8-wo`` (optimum-intel's default for the vision and
#: embedding weights: INT8, asymmetric, per channel where MatMulNBits' blocks allow).
VISION_WO = ("int4", "int4-rtn128", "int8-wo")
#: The decoders NNCF writes (:func:`vlsens.deploy.genai.anchors.nncf_folder`), by recipe.
NNCF_RECIPES = ("ratio", "awq", "optimum")

#: The peers' folders (``deploy.peers``, published as ``deploy/peer-<name>``): what a user would ship
#: instead, from the same checkpoint, measured like ours. name -> (decoder, vision, embedding);
#: None: the int4 folders' own (``deploy.nbits.vision`` / ``embedding``).
#: An NNCF folder where the int4 folders tie the table to lm_head takes the INT4 table instead.
PEERS = {
    "builder": ("builder-k_quant_mixed", "fp16", "fp32"),  # the builder's heuristic, vision as exported
    "olive": ("builder-rtn", "int4-rtn128", "int4"),  # Olive's CPU recipe: all INT4 RTN
    "optimum": ("nncf-optimum", "int8-wo", "int8"),  # optimum-intel: LM INT4, the rest INT8 weight-only
    "nncf-ratio": ("nncf-ratio", None, None),  # NNCF's data-aware INT4 / INT8 split, ratio 0.8
    "nncf-awq": ("nncf-awq", None, None),  # NNCF all INT4 with AWQ and scale estimation
}
PEER_PREFIX = "peer-"
#: Every folder name the deploy rule builds: the precisions and the peers.
FOLDERS = (*PRECISIONS, *(PEER_PREFIX + p for p in PEERS))


def peer_parts(folder: str, int4_vision: str = "int8-mixed", int4_embedding: str = "fp32") -> tuple[str, str, str]:
    """``(decoder, vision, embedding)`` of a peer folder (``peer-<name>``)."""
    dec, vis, emb = PEERS[folder.removeprefix(PEER_PREFIX)]
    emb = emb or int4_embedding
    if emb == "tied" and dec.startswith("nncf-"):
        # the tied table gathers lm_head's MatMulNBits bytes; NNCF keeps lm_head INT8 as
        # DequantizeLinear + MatMul (ratio, optimum), so its folders carry the INT4 table
        emb = "int4"
    return dec, vis or int4_vision, emb


def vision_precision(precision: str, int4_vision: str = "int8-mixed") -> str:
    """The precision of a deploy folder's vision graph: its own, ``int4_vision`` (the config's
    ``deploy.nbits.vision``) for an int4 folder, a peer's own."""
    if precision.startswith(PEER_PREFIX):
        return peer_parts(precision, int4_vision)[1]
    return int4_vision if precision in INT4 else precision


def prepacked(precision: str) -> bool:
    """Whether a deploy folder's checks load it with ONNX Runtime's weight prepacking (as users
    do): every folder but the fp32 one, the reference, whose float32 weights stay memory-mapped
    (16.4 GB at 36 layers; with the prepacked copies the job exceeds 24 GiB)."""
    return precision != "fp32"


def vision_tolerance(config: dict, precision: str) -> dict | None:
    """The gate of a deploy folder's ``vision.onnx``: ``parity.tolerance`` of its vision graph's
    precision (fp32, fp16), ``deploy.int8_tolerance`` for the INT8-mixed graph,
    ``deploy.nbits.vision_tolerance`` for a weight-only one. None (measured, not gated) for a peer:
    its graph passed its gate on its own weights, and what its recipe costs is what the comparison
    is for (Olive's INT4 RTN vision graph misses our INT4 tolerance on the tiny preset: cosine 0.978)."""
    from vlsens.config import canonical, tolerance_for

    if precision.startswith(PEER_PREFIX):
        return None
    vp = vision_precision(precision, config["deploy"]["nbits"]["vision"])
    if vp in VISION_WO:
        return canonical(config["deploy"]["nbits"]["vision_tolerance"])
    return tolerance_for(config, vp) if vp in ("fp32", "fp16") else canonical(config["deploy"]["int8_tolerance"])


def _decoder_source(precision: str) -> str:
    """The decoder graph (``{model}`` left) of a deploy folder."""
    if precision.startswith(PEER_PREFIX):
        dec = peer_parts(precision)[0]
        if dec.startswith("builder-"):
            return paths.fill(paths.BUILDER_INT4, graph=DECODER_GRAPH, algo=dec.removeprefix("builder-"))
        return paths.fill(paths.NNCF_DECODER, graph=DECODER_GRAPH, recipe=dec.removeprefix("nncf-"))
    if precision == "int8-mixed":
        return paths.fill(paths.PROFILE, graph=DECODER_GRAPH, variant="fp32")
    if precision == "int4-mixed":
        return paths.fill(paths.NBITS_PROFILE, graph=DECODER_GRAPH, variant="fp32")
    if precision in INT4:
        return paths.fill(paths.BUILDER_INT4, graph=DECODER_GRAPH, algo=precision.removeprefix("int4-"))
    return paths.fill(paths.VARIANT, graph=DECODER_GRAPH, variant="fp16" if precision == "fp16" else "fp32")


def vision_source(fmt: str) -> str:
    """The vision graph (``{model}`` left) of a format: ``fp32``, ``fp16``, ``int8-mixed`` (the dynamic
    graph's profile) or a weight-only one (:data:`VISION_WO`)."""
    if fmt == "int8-mixed":
        return paths.fill(paths.PROFILE, graph=VISION_GRAPH, variant="fp32") + "/model.onnx"
    return paths.fill(paths.VARIANT, graph=VISION_GRAPH, variant=fmt) + "/model.onnx"


def embedding_source(fmt: str) -> str:
    """The weight-only table's embedding graph (``{model}`` left) of a format: ``int4``, ``int8``."""
    return paths.fill(EMBEDDING_NBITS, bits=fmt.removeprefix("int")) + "/embedding.onnx"


def sources(precision: str, int4_vision: str = "int8-mixed", int4_embedding: str = "fp32") -> dict[str, str]:
    """Path patterns (``{model}`` left) of the graphs a deploy folder (a precision or a peer) is made of."""
    vp = vision_precision(precision, int4_vision)
    peer = precision.startswith(PEER_PREFIX)
    emb = peer_parts(precision, int4_vision, int4_embedding)[2] if peer else \
        (int4_embedding if precision in INT4 else "fp32")
    dec = paths.fill(paths.VARIANT, graph=DECODER_GRAPH, variant="fp16" if precision == "fp16" else "fp32")
    vis = paths.fill(paths.VARIANT, graph=VISION_GRAPH, variant=vp if vp in ("fp16", *VISION_WO) else "fp32")
    # The embedding graph is a secondary file of the decoder's variant folder: that folder's
    # model.onnx and record stand for it as inputs (the job verifies it against the record).
    out = {"decoder_folder": f"{dec}/{paths.MAIN}", "decoder_record": f"{dec}/{paths.RECORD}",
           "vision_record": f"{vis}/{paths.RECORD}"}
    if emb.startswith("int"):
        out["embedding"] = embedding_source(emb)
    if emb == "tied":  # the cases the tied table is gated on
        out["embedding_reference"] = paths.fill(paths.REFERENCE, graph=DECODER_GRAPH)
    out["vision"] = vision_source(vp if vp in ("fp16", "int8-mixed", *VISION_WO) else "fp32")
    out["decoder"] = _decoder_source(precision) + "/model.onnx"
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
        from pathlib import Path

        from vlsens.model.checkpoint import tied_weights_differ

        ckpt = Path(str(config["model"]["checkpoint"]))
        differ = tied_weights_differ(ckpt) if ckpt.is_dir() else None
        if differ:
            raise ConfigError(f"deploy.nbits.embedding: tied reads the table from lm_head's weight; "
                              f"{ckpt}/config.json says tie_word_embeddings, but its weights are not tied: {differ}; "
                              "use fp32 or int4")
    if "fp32" not in d["precisions"] and (len(d["precisions"]) or d["peers"]):
        raise ConfigError("deploy.precisions: the other folders (and deploy.peers) are evaluated against the fp32 "
                          "folder; keep 'fp32' in the list")
    _check_peers(config)
    _check_plan(config)
    measure_sizes(config)


def _check_plan(config: dict) -> None:
    """The vision formats ``plan.vision`` names are built by this config."""
    if not config["plan"]["enabled"]:
        return
    names = [b["name"] for b in config["plan"]["budgets"]]
    if len(set(names)) < len(names):
        raise ConfigError(f"plan.budgets: names {names} repeat one; each names its folder deploy/plan-<name>/")
    scored = [b["name"] for b in config["plan"]["budgets"] if "accuracy_drop" in b]
    if scored and str(config["deploy"]["measure"]["prompts"]) == "builtin":
        raise ConfigError(f"plan.budgets {scored}: accuracy_drop is judged on the task's answers, but "
                          "deploy.measure.prompts is 'builtin'; set it to 'task' (or drop accuracy_drop)")
    dyn = config["vision"]["dynamic"]
    if "mixed" in config["plan"]["vision"]:
        lack = [f for f in ("int4", "int8-wo") if f not in config["plan"]["vision"]]
        if lack:
            raise ConfigError(f"plan.vision has 'mixed', whose Linears are INT4 (int4) or INT8 (int8-wo): add {lack} to "
                              f"plan.vision (it has {list(config['plan']['vision'])}) or drop 'mixed'")
    for fmt in (f for f in config["plan"]["vision"] if f != "mixed"):
        key, have, want = {"int8-mixed": ("vision.dynamic.sensitivity_variants", dyn["sensitivity_variants"], "fp32"),
                           "fp16": ("vision.dynamic.variants", dyn["variants"], "fp16")}.get(
            fmt, ("vision.dynamic.variants", dyn["variants"], "fp32"))
        if want not in have:
            raise ConfigError(f"plan.vision has '{fmt}', which needs '{want}' in {key} (it has {list(have)}); add it "
                              f"or drop '{fmt}' from plan.vision (or set plan.enabled: false)")


def _check_peers(config: dict) -> None:
    """What each of ``deploy.peers`` is built from is configured."""
    d, dyn = config["deploy"], config["vision"]["dynamic"]
    for p in d["peers"]:
        _, vision, _ = peer_parts(PEER_PREFIX + p, d["nbits"]["vision"], d["nbits"]["embedding"])
        if "fp32" not in d["decoder"]["variants"]:
            raise ConfigError(f"deploy.peers has '{p}', whose decoder is made from the decoder's fp32 graph: add fp32 "
                              "to deploy.decoder.variants or drop it")
        src = "fp32" if vision in VISION_WO or vision == "int8-mixed" else vision
        have = dyn["sensitivity_variants"] if vision == "int8-mixed" else dyn["variants"]
        if src not in have:
            key = "vision.dynamic.sensitivity_variants" if vision == "int8-mixed" else "vision.dynamic.variants"
            raise ConfigError(f"deploy.peers has '{p}', whose vision graph ({vision}) needs '{src}' in {key} (it has "
                              f"{list(have)}); add it or drop '{p}'")


def measure_sizes(config: dict) -> list[tuple[int, int]]:
    """``deploy.measure.sizes`` as (H, W), each valid for the checkpoint's family."""
    from vlsens.core.sizes import parse_size
    from vlsens.model.family import size_rule

    rule = size_rule(config)
    return [parse_size(str(s), key=f"deploy.measure.sizes[{i}]", **rule)
            for i, s in enumerate(config["deploy"]["measure"]["sizes"])]



def check_runtime(config: dict) -> None:
    """onnxruntime-genai (and NNCF, for the peers it writes) is importable where the deploy folders
    are built (not checked for conda deployments: envs/torch.yaml installs both)."""
    from importlib.util import find_spec

    if config["deploy"]["enabled"] and find_spec("onnxruntime_genai") is None:
        raise ConfigError("deploy.enabled: true needs onnxruntime-genai in this environment: pip install -e "
                          "'.[genai]' (`make run` installs it), or set deploy.enabled: false")
    nncf = [p for p in config["deploy"]["peers"] if PEERS[p][0].startswith("nncf-")]
    if config["deploy"]["enabled"] and nncf and find_spec("nncf") is None:
        raise ConfigError(f"deploy.peers has {nncf}, whose decoders NNCF writes, but nncf is not installed in this "
                          "environment: pip install -e '.[peers]' (`make run` installs it), or drop them from "
                          "deploy.peers")
