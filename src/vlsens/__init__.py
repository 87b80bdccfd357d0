"""vlsens: verified ONNX export, quantization sensitivity and mixed-precision profiles for
Qwen-VL checkpoints. All logic lives here; the Snakemake workflow only declares.

The package is laid out by stage family (docs/architecture.md): ``core`` (the base layer),
``data``, ``model``, ``export``, ``variants``, ``quantize``, ``sensitivity``, ``precision``, ``npu``,
``deploy``, ``report``, ``dag``, plus ``config`` and ``cli``. Modules of the flat layout before
0.2 stay importable from their old paths for one release (:data:`MOVED`), with a
``DeprecationWarning`` that names the new path.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

__version__ = "0.2.0"

#: Old module path -> new module path(s), for one release. A module that was split names every
#: module its names went to; a moved package carries its submodules along.
MOVED: dict[str, tuple[str, ...]] = {
    **{f"vlsens.{m}": (f"vlsens.core.{m}",) for m in (
        "errors", "job", "faults", "device", "fsutil", "paths", "sizes", "versions", "metrics", "records",
        "artifacts", "onnxutil", "onnxgraph", "scripting")},
    **{f"vlsens.{m}": (f"vlsens.data.{m}",) for m in ("images", "prompts", "inputs", "samples", "cases", "calibration")},
    **{f"vlsens.{m}": (f"vlsens.model.{m}",) for m in ("family", "checkpoint", "loading", "processor", "vision", "presets")},
    "vlsens.towers": ("vlsens.export.towers",),
    "vlsens.stages": ("vlsens.export.stages",),
    "vlsens.parity": ("vlsens.export.parity",),
    "vlsens.fp16": ("vlsens.variants.float16",),
    "vlsens.bf16": ("vlsens.variants.bfloat16",),
    "vlsens.simplify": ("vlsens.variants.simplified",),
    "vlsens.parts": ("vlsens.npu.cut", "vlsens.npu.chain", "vlsens.npu.build", "vlsens.npu.calibration"),
    "vlsens.embeddings": ("vlsens.npu.embeddings",),
    "vlsens.quant_target": ("vlsens.quantize.target",),
    "vlsens.quant": ("vlsens.quantize.qdq",),
    "vlsens.nbits": ("vlsens.quantize.nbits",),
    "vlsens.compare": ("vlsens.sensitivity.compare",),
    "vlsens.inc": ("vlsens.sensitivity.inc",),
    "vlsens.profile": ("vlsens.precision.int8",),
    "vlsens.profile_nbits": ("vlsens.precision.nbits",),
    "vlsens.weight_only": ("vlsens.precision.weight_only",),
    "vlsens.genai": ("vlsens.deploy.genai.folder",),
    "vlsens.deploy.assemble": ("vlsens.deploy.genai.assemble",),
    "vlsens.deploy.evaluate": ("vlsens.deploy.genai.evaluate",),
    "vlsens.deploy.anchors": ("vlsens.deploy.genai.anchors",),
    "vlsens.runtime": ("vlsens.deploy.genai.runtime",),
    "vlsens.plan": ("vlsens.dag.plan",),
    "vlsens.targets": ("vlsens.dag.targets",),
    "vlsens.resources": ("vlsens.dag.resources",),
}


def moved_to(name: str) -> tuple[str, ...] | None:
    """The new module path(s) of an old one (submodules of a moved package included), or None."""
    if name in MOVED:
        return MOVED[name]
    head, _, tail = name.rpartition(".")
    while head:
        if head in MOVED and len(MOVED[head]) == 1:
            return (f"{MOVED[head][0]}.{tail}",)
        head, _, rest = head.rpartition(".")
        tail = f"{rest}.{tail}"
    return None


class _Moved(types.ModuleType):
    """An old module path: every name is looked up in the module(s) it moved to."""

    def __getattr__(self, attr):
        for target in self.__dict__["_targets"]:
            if hasattr(target, attr):
                return getattr(target, attr)
        raise AttributeError(f"module {self.__name__!r} (moved to {self.__dict__['_new']}) has no attribute {attr!r}")

    def __dir__(self):
        return sorted({n for t in self.__dict__["_targets"] for n in dir(t)})


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("vlsens.") and moved_to(name) and importlib.util.find_spec(moved_to(name)[0]) is not None:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        new = moved_to(spec.name)
        module = _Moved(spec.name)
        module.__dict__["_new"] = ", ".join(new)
        module.__dict__["_targets"] = [importlib.import_module(n) for n in new]
        return module

    def exec_module(self, module):
        module.__path__ = []  # a package, so old submodule paths resolve through this finder too
        warnings.warn(f"{module.__name__} moved to {module.__dict__['_new']}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
