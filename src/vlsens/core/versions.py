"""What each stage's output depends on besides its inputs: library versions and vlsens code.

Rules take these as ``params``, so Snakemake (whose default rerun triggers include params)
re-runs exactly the stages whose libraries or package code changed, and what consumes their
outputs. Snakemake tracks a rule's own script but not the modules it imports, hence
:func:`code_version`: a hash of the vlsens modules a stage imports, followed transitively.

``VLSENS_VERSION_OVERRIDES`` (``name=version,name=version``) replaces recorded versions without
reinstalling anything: it previews (and the tests prove) what an upgrade would re-run.
"""

from __future__ import annotations

import functools
import os
from importlib import metadata
from pathlib import Path

#: Libraries each stage's output depends on.
STAGE_LIBRARIES = {
    # the tiny preset draws its weights with numpy (vlsens.model.presets.build.init_weights_numpy)
    "checkpoint": ("transformers", "tokenizers", "safetensors", "numpy"),
    "reference": ("torch", "transformers", "pillow", "numpy"),
    "calibration": ("transformers", "pillow", "numpy"),  # the image processor's PIL path, no torch
    "export": ("torch", "transformers", "onnx"),
    "fp16": ("onnx", "onnxconverter-common"),
    "bf16": ("onnx", "onnxconverter-common", "ml-dtypes"),
    "simplify": ("onnx", "onnxsim"),
    # migrates channels in numpy, observes the calibration set with onnxruntime
    "smooth": ("onnx", "onnxruntime", "numpy"),
    "sensitivity": ("onnx", "onnxruntime"),
    "compare": (),
    "npu_archive": ("numpy",),
    # cuts a gated graph (onnx), chains the parts (onnxruntime), runs onnxsim on each
    "parts": ("onnx", "onnxruntime", "onnxsim", "numpy"),
    # the toolchain job reads records and graph names (onnx); the QDQ model is the profile's
    "toolchain": ("onnx",),
    # reads the checkpoint's safetensors header and bytes; conversions through ml_dtypes
    "embeddings": ("numpy", "ml-dtypes"),
    # assembles gated graphs and runs them with onnxruntime-genai next to transformers' generate
    "deploy": ("onnxruntime-genai", "onnxruntime", "onnx", "torch", "transformers"),
    # the folders' evaluation cases: photos resized and written by PIL
    "cases": ("pillow", "numpy"),
    # NNCF's weight compression of a gated graph, gated again (onnxruntime, transformers)
    "nncf": ("nncf", "onnx", "onnxruntime", "torch", "transformers"),
    # the report's figures are drawn by matplotlib from the records (no model is run)
    "report": ("matplotlib",),
    # which folder to ship: reads the records, runs no library
    "recommend": (),
}
#: Libraries recorded in every parity record (not rerun triggers: a gate re-checks, it does not
#: change the artifact).
RECORD_LIBRARIES = ("torch", "transformers", "onnx", "onnxruntime", "onnxconverter-common", "onnxsim", "numpy")


#: The vlsens package folder (this module is vlsens.core.versions).
_PACKAGE = Path(__file__).resolve().parents[1]


def overrides() -> dict[str, str]:
    raw = os.environ.get("VLSENS_VERSION_OVERRIDES", "")
    out = {}
    for item in filter(None, (s.strip() for s in raw.split(","))):
        name, _, ver = item.partition("=")
        out[name.strip().lower()] = ver.strip()
    return out


def version(name: str) -> str:
    ov = overrides()
    if name.lower() in ov:
        return ov[name.lower()]
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not-installed"


def versions(*names: str) -> dict[str, str]:
    return {n: version(n) for n in names}


def _module_file(name: str) -> str | None:
    """The source file of vlsens module or package ``name`` (None for anything else, e.g. a class
    name)."""
    parts = name.split(".")
    if parts[0] != "vlsens":
        return None
    base = _PACKAGE.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if len(parts) > 1 and path.is_file() or len(parts) == 1 and path.name == "__init__.py":
            return str(path)
    return None


def _vlsens_imports(path: str) -> set[str]:
    """vlsens modules imported anywhere in a file (top level or inside functions)."""
    return set(_imports_of(path, os.stat(path).st_mtime_ns))


@functools.cache
def _imports_of(path: str, mtime_ns: int) -> frozenset[str]:
    """Parsed once per file version: every rule's ``code`` param walks the same modules."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("vlsens")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vlsens"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # "from vlsens import x"
    return frozenset(found)


def code_files(*modules: str) -> list[str]:
    """Source files of ``modules`` and of every vlsens module they import, transitively."""
    seen: dict[str, str] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(_vlsens_imports(path) - set(seen))
        todo.extend(name.rsplit(".", i)[0] for i in range(1, name.count(".")))  # enclosing packages
    return [seen[k] for k in sorted(seen)]


def _name_of(path: str) -> str:
    rel = Path(path).resolve().relative_to(_PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["vlsens", *parts])


def code_version(*modules: str) -> str:
    """Short sha256 of the package code a stage runs (``modules`` and their vlsens imports).
    ``VLSENS_VERSION_OVERRIDES`` may name ``vlsens.<module>`` to preview a code change. A module
    outside vlsens (a tower named in the config) counts by its own file."""
    import hashlib
    import importlib.util

    ov = overrides()
    h = hashlib.sha256()
    for path in code_files(*modules):
        name = _name_of(path)
        h.update(name.encode())
        h.update(ov[name].encode() if name in ov else Path(path).read_bytes())
    for name in sorted(m for m in modules if not m.startswith("vlsens")):
        spec = importlib.util.find_spec(name)
        h.update(name.encode())
        h.update(ov[name].encode() if name in ov else Path(spec.origin).read_bytes() if spec and spec.origin else b"")
    return h.hexdigest()[:16]


def script_code_version(script: str | Path, *extra: str) -> str:
    """:func:`code_version` of the vlsens modules a workflow script imports (the script itself
    is tracked by Snakemake), plus ``extra`` modules it loads by name (its tower's)."""
    mods = sorted(m for m in _vlsens_imports(str(script)) if _module_file(m))
    return code_version(*mods, *extra)


def provenance(stage: str, script: str | Path, *modules: str, libraries: tuple[str, ...] | None = None) -> dict:
    """The rerun-trigger param of a rule: the versions of the libraries its output depends on
    (``libraries``, default :data:`STAGE_LIBRARIES` of ``stage``) and the hash of the code it
    runs (the script's vlsens imports and ``modules``)."""
    return {"versions": versions(*(libraries or STAGE_LIBRARIES[stage])),
            "code": script_code_version(script, *modules)}
