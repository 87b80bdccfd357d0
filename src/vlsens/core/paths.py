"""The one path layout of the results: every pattern is written here once, and the rules
(``rules/*.smk``), the default target and the package all read it.

Patterns hold Snakemake wildcards (``{model}``, ``{graph}``, ``{variant}``, ...); :func:`fill`
substitutes some or all of them. A *graph* names one kind of ONNX graph built from the checkpoint
(a tower, :mod:`vlsens.export.towers`): ``vision/224x224``, ``vision/dynamic``, ``text``::

    results/<model>/checkpoint/                        the tiny preset (a complete HF checkpoint)
    results/<model>/inputs/<kind>.json                 content manifests of inputs from outside results/
    results/<model>/<graph>/reference.npz              parity cases: inputs and transformers' outputs
    results/<model>/<graph>/<variant>/                 model.onnx (+ .data), the tower's other graphs, parity.json
    results/<model>/calib/<graph>/                     calib.npz, eval.npz, manifest.json (+ calib.tar, eval.tar)
    results/<model>/parts/<graph>/<variant>/           a fixed-size graph cut into single-file parts: part<j>.onnx,
                                                       parts.json (vlsens.npu.build)
    results/<model>/calib/<graph>/parts-<variant>/     part<j>/calib.tar, eval.tar: each part's own inputs
    results/<model>/embeddings/                        embed_tokens.<dtype>.bin, manifest.json (vlsens.npu.embeddings)
    results/<model>/sensitivity/<graph>/<variant>/     ort.csv, ort.json, engine/, shards/ (+ inc.csv, inc.json,
                                                       compare.json, inc-tune/)
    results/<model>/profile/<graph>/<variant>/         profile.yaml, nodes_to_exclude.json, inc_op_name_dict.json,
                                                       model.onnx (+ .data), eval.json
    results/<model>/deploy/<precision>/                onnxruntime-genai folder: vision/embedding/decoder.onnx
                                                       (+ .data), genai_config.json, processor_config.json,
                                                       tokenizer, parity.json, eval.json
    results/<model>/report/<graph>/<variant>/          heatmap.png, ranked-<engine>.png, pareto.png (+ engines.png)
    results/<model>/report/<graph>/fp16-fallback.png   which nodes of the fp16 variant stay FP32, and why
    results/<model>/report/                            latency.png, parity.html, profiles.html, verdict.rst
    results/<model>/recommend.json, recommend.md       which folder to ship per device, what was missed
    results/<model>/logs/<graph>/<rule>[-<variant>].log and benchmarks/<graph>/<rule>[-<variant>].tsv
"""

from __future__ import annotations

import re

RESULTS = "results"
MODEL = RESULTS + "/{model}"
CHECKPOINT = MODEL + "/checkpoint"
INPUTS = MODEL + "/inputs"

#: The file every variant folder is known by: its main graph, published last (its presence means
#: the folder is complete); the tower's other graph files and ``parity.json`` sit beside it.
MAIN = "model.onnx"
RECORD = "parity.json"

REFERENCE = MODEL + "/{graph}/reference.npz"
VARIANT = MODEL + "/{graph}/{variant}"
CALIB = MODEL + "/calib/{graph}"
SENSITIVITY = MODEL + "/sensitivity/{graph}/{variant}"
ENGINE = SENSITIVITY + "/engine"
SHARD = SENSITIVITY + "/shards/ort.{i}-of-{n}"
INC_TUNE = SENSITIVITY + "/inc-tune"
PROFILE = MODEL + "/profile/{graph}/{variant}"
#: A fixed-size graph's profile as NPU toolchains take it (:mod:`vlsens.npu.toolchain`).
TOOLCHAIN = MODEL + "/toolchain/{graph}/{variant}"
#: Engine nbits (weight-only INT4/INT8): its folder, its CSV and sidecar beside ort.csv, its profile.
NBITS_ENGINE = SENSITIVITY + "/nbits-engine"
NBITS_FILES = {"csv": "nbits.csv", "summary": "nbits.json"}
NBITS_PROFILE = MODEL + "/profile/{graph}/{variant}-nbits"
#: onnxruntime-genai's builder decoder at -p int4 with one algo_config (the int4-* anchors).
BUILDER_INT4 = MODEL + "/{graph}/builder-{algo}"
#: NNCF's weight compression of the decoder, one folder per recipe (the peers' decoders).
NNCF_DECODER = f"{MODEL}/{{graph}}/nncf-{{recipe}}"
#: An onnxruntime-genai model folder (:mod:`vlsens.deploy`), its log and benchmark.
DEPLOY = MODEL + "/deploy/{precision}"
DEPLOY_LOG = MODEL + "/logs/deploy/deploy-{precision}.log"
DEPLOY_BENCHMARK = MODEL + "/benchmarks/deploy/deploy-{precision}.tsv"
#: The int4 folders side by side (vlsens.deploy.compare).
DEPLOY_INT4 = {"json": MODEL + "/deploy/int4.json", "md": MODEL + "/deploy/int4.md"}
#: The folders' end-to-end measure (vlsens.deploy.measure): the evaluation cases (images and
#: cases.json), the fp32 folder's tokens and log-probabilities, one record per folder, the folders
#: side by side with paired intervals.
MEASURE = MODEL + "/measure"
MEASURE_CASES, MEASURE_REFERENCE, MEASURE_FOLDER = (f"{MEASURE}/{n}" for n in ("cases", "reference.npz",
                                                                               "{precision}.json"))
#: transformers' image features of the deploy evaluation images, on the fp32 folder's preprocessing
#: (the deploy folders' vision parity reference, computed once).
DEPLOY_VISION_FEATURES = f"{MEASURE}/vision-features.npz"
#: the fp32 folder's logits on the deploy evaluation cases, teacher-forced on its own greedy tokens
#: (every other folder's evaluation reference, computed once).
DEPLOY_EVAL_LOGITS = f"{MEASURE}/eval-logits.npz"
MEASURE_COMPARE = {k: f"{MEASURE}/compare.{k}" for k in ("json", "md")}
#: Every folder's accuracy on the task paired with fp32's (vlsens.deploy.accuracy; each folder's
#: answers are its answers.json, vlsens.deploy.genai.answers).
MEASURE_ACCURACY = {k: f"{MEASURE}/accuracy.{k}" for k in ("json", "md")}
#: The whole-VLM plan (vlsens.budget): the decoder's evaluation set made of the measure's cases, its
#: weight-only sensitivity there, each part's formats measured end to end, the front's search and
#: its plan files, the measured front beside the anchors.
BUDGET = MODEL + "/budget"
BUDGET_FEEDS, BUDGET_ENGINE, BUDGET_COMPONENTS, BUDGET_FRONT, BUDGET_PLANS = (
    f"{BUDGET}/{n}" for n in ("decoder.npz", "nbits-engine", "components.json", "front.json", "plans"))
#: The vision Linears each at INT4, measured on the folders' measure (vlsens.budget.vision).
BUDGET_LATENCY = f"{BUDGET}/latency.json"
BUDGET_VISION = {k: f"{BUDGET}/{n}" for k, n in (("csv", "vision.csv"), ("summary", "vision.json"))}
BUDGET_NBITS = {k: f"{BUDGET}/{n}" for k, n in (("csv", "nbits.csv"), ("summary", "nbits.json"))}
BUDGET_MEASURED = {k: f"{BUDGET}/{n}" for k, n in (("json", "measured.json"), ("md", "measured.md"),
                                                    ("png", "front.png"))}
#: The report's files (rules/report.smk): per analysed graph and variant, per graph, per model.
REPORT = MODEL + "/report"
REPORT_FIGURES = REPORT + "/{graph}/{variant}"
#: Figures of an analysed graph and variant (``ranked``: one per engine; ``engines``: where both ran).
FIGURE_FILES = {"heatmap": "heatmap.png", "ranked": "ranked-{engine}.png", "pareto": "pareto.png",
                "engines": "engines.png"}
REPORT_FP16 = REPORT + "/{graph}/fp16-fallback.png"
REPORT_FILES = {"latency": "latency.png", "parity": "parity.html", "profiles": "profiles.html", "verdict": "verdict.rst",
                "int4_pareto": "int4-pareto.png", "nbits_heatmap": "nbits-heatmap.png"}
LOGS = MODEL + "/logs/{graph}"
BENCHMARKS = MODEL + "/benchmarks/{graph}"

#: A fixed-size vision graph's variant cut into single-file parts, and each part's calibration
#: archives (:mod:`vlsens.npu.calibration`).
PARTS = MODEL + "/parts/{graph}/{variant}"
PARTS_CALIB = CALIB + "/parts-{variant}"
#: The token embedding table as raw binaries with a manifest (:mod:`vlsens.npu.embeddings`).
EMBEDDINGS = MODEL + "/embeddings"
#: Which folder to ship per device (vlsens.report.recommend), what every run's goal ends with.
RECOMMEND = {"json": MODEL + "/recommend.json", "md": MODEL + "/recommend.md"}

#: Files of a calibration folder (``calib.tar`` / ``eval.tar``: the NPU layout, one .npy per sample).
CALIB_FILES = {"calib": "calib.npz", "eval": "eval.npz", "manifest": "manifest.json"}
NPU_FILES = {"calib_tar": "calib.tar", "eval_tar": "eval.tar"}
#: Files of a sensitivity engine folder (:mod:`vlsens.sensitivity.stages`).
ENGINE_FILES = {"float_model": "float.onnx", "float_data": "float.onnx.data", "switch": "switch.onnx",
                "switch_data": "switch.onnx.data", "probe": "probe.onnx", "probe_data": "probe.onnx.data",
                "cache": "calibration.json", "reference": "float_outputs.npz",
                "meta": "engine.json"}
#: Files of a profile folder (:mod:`vlsens.precision.int8`), ``model.onnx`` published last.
PROFILE_FILES = {"profile": "profile.yaml", "exclude": "nodes_to_exclude.json", "inc": "inc_op_name_dict.json",
                 "data": "model.onnx.data", "eval": "eval.json", "model": "model.onnx"}

_WILDCARD = re.compile(r"\{(\w+)\}")


def fill(pattern: str, **wildcards) -> str:
    """``pattern`` with the given wildcards substituted; the others stay wildcards."""
    return _WILDCARD.sub(lambda m: str(wildcards[m.group(1)]) if m.group(1) in wildcards else m.group(0), pattern)


def in_variant(variant: str = "{variant}", name: str = MAIN) -> str:
    """A file of a variant folder (default: its main graph)."""
    return f"{fill(VARIANT, variant=variant)}/{name}"


def files(folder: str, names: dict[str, str]) -> dict[str, str]:
    """``{key: folder/name}`` for a folder pattern and a file table (rule inputs and outputs)."""
    return {k: f"{folder}/{v}" for k, v in names.items()}


def data(model: str) -> str:
    """The external data file of an ONNX model (always beside it)."""
    return model + ".data"


def log(rule: str, *parts: str) -> str:
    """``results/<model>/logs/<graph>/<rule>[-<part>...].log``."""
    return f"{LOGS}/{'-'.join((rule, *parts))}.log"


def benchmark(rule: str, *parts: str) -> str:
    return f"{BENCHMARKS}/{'-'.join((rule, *parts))}.tsv"


def model_log(rule: str) -> str:
    """The log of a job that belongs to no graph (the tiny preset)."""
    return f"{MODEL}/logs/{rule}.log"


def model_benchmark(rule: str) -> str:
    return f"{MODEL}/benchmarks/{rule}.tsv"
