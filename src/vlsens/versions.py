"""Versions of the libraries each stage depends on.

Rules take these as ``params`` so that Snakemake re-runs exactly the stages whose libraries
changed. ``VLSENS_VERSION_OVERRIDES`` (``name=version,name=version``) replaces recorded versions
without reinstalling anything: it exists to test and to preview incremental re-runs.
"""

from __future__ import annotations

import os
from importlib import metadata

#: Libraries each stage's output depends on.
STAGE_LIBRARIES = {
    "checkpoint": ("torch", "transformers", "tokenizers", "safetensors"),
    "reference": ("torch", "transformers", "pillow", "numpy"),
    "export": ("torch", "transformers", "onnx"),
    "fp16": ("onnx", "onnxconverter-common"),
    "simplify": ("onnx", "onnxsim"),
    "sensitivity": ("onnx", "onnxruntime"),
}
#: Libraries recorded in every parity record (not rerun triggers: a gate re-checks, it does not
#: change the artifact).
RECORD_LIBRARIES = ("torch", "transformers", "onnx", "onnxruntime", "onnxconverter-common", "onnxsim", "numpy")


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


def stage_versions(*stages: str) -> dict[str, str]:
    names: list[str] = []
    for s in stages:
        for n in STAGE_LIBRARIES[s]:
            if n not in names:
                names.append(n)
    return versions(*names)
