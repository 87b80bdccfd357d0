"""Shared fixtures: one tiny checkpoint; per tower its reference, fp32 export and calibration set;
the planted tiny preset through the ort engine."""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TOL_FP32 = {"min_cosine": 0.99999, "max_rel_error": 1e-4}
TOL_FP16 = {"min_cosine": 0.999, "max_rel_error": 2e-2}

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The hash cache of copied deploy folders (vlsens.data.inputs.user_cache) stays out of the user's own.
os.environ.setdefault("VLSENS_CACHE_DIR", tempfile.mkdtemp(prefix="vlsens-test-cache-"))
# The task's split files (vlsens.task.files), written once for the whole session, not once per run folder.
os.environ.setdefault("VLSENS_TASK_DIR", tempfile.mkdtemp(prefix="vlsens-test-task-"))

#: The planted INT8 sensitivity of the tiny preset's tests (function-preserving outlier).
PLANT = {"block": 2, "channels": 2, "scale": 1000.0}
#: Engine inc's interpreter, as `make inc-env` (part of `make test`) builds it.
INC_PYTHON = REPO / ".venv-inc" / "bin" / "python"
#: One graph of each builtin tower: the generic stages are tested over all four.
GRAPHS = ["vision/224x224", "vision/224x224-u8", "vision/224x224-t2", "vision/dynamic", "text", "decoder"]


def default_config(**changes) -> dict:
    """The default config with its schema defaults filled, ``changes`` given as dotted keys. The
    unit tests run on the random tiny preset (``model.tiny.weights: random``, unless ``changes``
    say otherwise), so ``auto`` inputs resolve (:func:`vlsens.task.files.resolve`) to ``builtin``."""
    from vlsens.config import with_defaults
    from vlsens.task.files import resolve

    cfg = copy.deepcopy(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    cfg.setdefault("model", {}).setdefault("tiny", {})["weights"] = "random"
    for dotted, value in changes.items():
        cur = cfg
        *parents, last = dotted.split(".")
        for p in parents:
            cur = cur.setdefault(p, {})  # a section config.yaml leaves to the schema's defaults
        cur[last] = value
    cfg = with_defaults(cfg)
    resolve(cfg, os.environ["VLSENS_TASK_DIR"])
    return cfg


def run_settings(**changes):
    """The quantization settings a run of the default config uses on this machine
    (``quant.target`` ort-cpu, ``quant.saturation`` auto: vlsens.quantize.target.resolve)."""
    from vlsens.quantize.qdq import QuantSettings
    from vlsens.quantize.target import resolve

    return QuantSettings.from_config(resolve(default_config(**changes)))


def tower_of(graph: str, **changes):
    """A graph's tower as the plan gives it to the DAG (the model's facts taken)."""
    from vlsens.dag.plan import model_facts
    from vlsens.export import towers

    cfg = default_config(**changes)
    tower = towers.for_graph(cfg, graph)
    tower.configure(model_facts(cfg))
    return tower


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    from vlsens.model.presets.build import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", seed=0)


@pytest.fixture(scope="session")
def parity_refs():
    from vlsens.data.images import resolve_images

    return resolve_images("builtin")[:2]


@dataclass
class Built:
    """One graph through the tower stages: reference, fp32 folder, calibration folder."""

    tower: object
    root: Path
    ckpt: Path

    @property
    def reference(self) -> Path:
        return self.root / "reference.npz"

    def folder(self, variant: str) -> Path:
        return self.root / variant

    def model(self, variant: str = "fp32", analysed: bool = False) -> Path:
        return self.folder(variant) / (self.tower.analysed if analysed else "model.onnx")

    @property
    def calib(self) -> Path:
        return self.root / "calib"


def build_graph(graph: str, ckpt: Path, root: Path, refs, **changes) -> Built:
    """reference -> fp32 export (gated) -> calibration set, with the tower's own settings."""
    from vlsens.export import stages

    tower = tower_of(graph, **changes)
    stages.reference(tower, ckpt, refs, root / "reference.npz", tower.reference_settings())
    stages.export(tower, ckpt, root / "reference.npz", root / "fp32", TOL_FP32, tower.export_settings())
    if graph == "vision/dynamic":  # its calibration set is made of the fixed sizes' sets
        for size in tower.sizes():
            fixed = tower_of(f"vision/{size}", **changes)
            stages.calibration(fixed, ckpt, {"images": _images_manifest(root)}, root / f"calib-{size}",
                               fixed.calibration_settings())
        inputs = {s: [str(root / f"calib-{size}" / f"{s}.npz") for size in tower.sizes()] for s in ("calib", "eval")}
    else:
        inputs = {"images": _images_manifest(root)}
    stages.calibration(tower, ckpt, inputs, root / "calib", tower.calibration_settings())
    return Built(tower, root, ckpt)


def _images_manifest(root: Path) -> str:
    from vlsens.data.images import resolve_images
    from vlsens.data.inputs import write_manifests

    refs = resolve_images("builtin")
    return write_manifests(root / "inputs", None, refs[:2], refs, None)["calibration_images"]


@pytest.fixture(scope="session")
def graph_builder(tiny_ckpt, parity_refs, tmp_path_factory):
    """``get(graph)``: the graph built on the tiny checkpoint, once per test session."""
    cache: dict[str, Built] = {}

    def get(graph: str) -> Built:
        if graph not in cache:
            cache[graph] = build_graph(graph, tiny_ckpt, tmp_path_factory.mktemp(graph.replace("/", "-")), parity_refs)
        return cache[graph]

    return get


@pytest.fixture(scope="session", params=GRAPHS)
def built(request, graph_builder) -> Built:
    """Each builtin tower's graph on the tiny checkpoint (the generic stages' tests run on all)."""
    return graph_builder(request.param)


@pytest.fixture(scope="session")
def reference_224(graph_builder) -> Path:
    return graph_builder("vision/224x224").reference


@pytest.fixture(scope="session")
def fixed(graph_builder) -> Built:
    """vision/224x224 built once per session (the NPU exports' tests start from its variants)."""
    return graph_builder("vision/224x224")


@pytest.fixture(scope="session")
def fp32_224(graph_builder) -> Path:
    return graph_builder("vision/224x224").model()


@pytest.fixture
def pickle_only_ckpt(tiny_ckpt, tmp_path) -> Path:
    """A Qwen2.5-VL config next to pickle weights only (never loaded)."""
    import shutil

    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(tiny_ckpt / "config.json", d / "config.json")
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    return d


def _pipeline(root, outlier):
    """The planted preset at 224x224: fp32 export -> calibration -> ort engine (3 shards) -> ort.csv."""
    from vlsens.data.images import resolve_images
    from vlsens.model.presets.build import build_tiny_checkpoint
    from vlsens.sensitivity.stages import gather, prepare, run_shard

    ckpt = build_tiny_checkpoint(root / "ckpt", seed=0, outlier=outlier)
    build_graph("vision/224x224", ckpt, root, resolve_images("builtin")[:2])
    prepare(root / "fp32" / "model.onnx", root / "calib" / "calib.npz", root / "calib" / "eval.npz", root / "engine",
            run_settings(), logits=False)
    shards = [root / "shards" / f"ort.{i}-of-3.csv" for i in range(3)]
    for i, p in enumerate(shards):
        run_shard(root / "engine", root / "calib" / "eval.npz", i, 3, p)
    gather(root / "engine", root / "calib" / "eval.npz", shards, root / "ort.csv", root / "ort.json")
    return root


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """The tiny preset with the planted outlier, through the ort engine (shared by test modules)."""
    return _pipeline(tmp_path_factory.mktemp("planted"), PLANT)


@pytest.fixture(scope="session")
def unplanted(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("unplanted"), None)


@pytest.fixture(scope="session")
def inc_python() -> Path:
    if not INC_PYTHON.exists():
        why = f"engine inc's environment is missing ({INC_PYTHON}); `make inc-env` builds it"
        if os.environ.get("VLSENS_REQUIRE_INC"):  # make test: a missing environment is a failure
            pytest.fail(why)
        pytest.skip(why)
    return INC_PYTHON


def assert_runs_its_weights(built: Path, float_model: Path, eval_npz: Path, scratch: Path) -> dict:
    """The weights the ``MatMulNBits`` graph ``built`` multiplies by (``{MatMul: W}``, read by
    :func:`vlsens.core.onnxgraph.dequantize_matmulnbits`), once ONNX Runtime's logits of ``built``
    equal those of ``float_model`` with them in place of its own, on two samples of ``eval_npz``."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from vlsens.core.onnxgraph import dequantize_matmulnbits
    from vlsens.core.onnxutil import make_session, save_with_external_data
    from vlsens.data.samples import Samples
    from vlsens.quantize.nbits import weight_matmuls

    weights = dict(dequantize_matmulnbits(built))
    names = {o["weight"]: o["name"] for o in weight_matmuls(float_model)}
    full = onnx.load(str(float_model))
    for init in full.graph.initializer:
        if init.name in names:
            init.CopyFrom(numpy_helper.from_array(weights[names[init.name]], init.name))
    save_with_external_data(full, scratch / "deq.onnx")
    a, b = make_session(built, threads=2), make_session(scratch / "deq.onnx", threads=2)
    for feed in Samples.load(eval_npz, float_model).feeds[:2]:
        np.testing.assert_allclose(a.run(["logits"], feed)[0], b.run(["logits"], feed)[0], rtol=1e-4, atol=1e-4)
    return weights
