"""The ``inc`` engine's environment, seen from the main one (DAG build, Makefile).

Engine ``inc`` runs in its own interpreter (see :mod:`vlsens.sensitivity.inc` for why). This module finds it
(:func:`resolve`: conda's ``python`` under ``--sw-deployment-method conda``, else
``sensitivity.inc.python``), checks it and the settings it must honour when the DAG is built (a
missing or wrong environment is a clear error before any job starts), and reads its pins from
``envs/inc.yaml`` for the Makefile's ``.venv-inc``::

    python -m vlsens.sensitivity.inc.env requirements envs/inc.yaml   # pip requirement lines
    python -m vlsens.sensitivity.inc.env enabled config/config.yaml   # exit 0 when a config enables inc
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vlsens.core.errors import ConfigError
from vlsens.core.versions import overrides
from vlsens.sensitivity.inc.settings import INC_VERSION, SETUP_HINT, check_settings

DEFAULT_PYTHON = ".venv-inc/bin/python"
_PROBE = """
import json, sys
from importlib import metadata
out = {"python": sys.executable}
for name in ("neural-compressor", "onnx", "onnxruntime", "numpy", "six"):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def resolve_python(value: str | None, basedir: str | Path) -> str:
    """``sensitivity.inc.python``: an absolute path, a path relative to the workflow folder, or a
    bare command name looked up on PATH (e.g. ``python`` inside a conda env)."""
    value = value or DEFAULT_PYTHON
    if "/" not in value:
        return value
    p = Path(value)
    return str(p if p.is_absolute() else Path(basedir) / p)


def probe(python: str, key: str = "sensitivity.inc.python") -> dict:
    """Versions of the INC stack in interpreter ``python`` (without importing INC: fast)."""
    if "/" in python and not Path(python).exists():
        raise ConfigError(
            f"{key}: {python} does not exist. sensitivity.engines lists 'inc', which runs in its own environment: "
            f"{SETUP_HINT}; or drop 'inc' from sensitivity.engines.")
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"{key}: cannot run {python} ({e}): {SETUP_HINT}.") from None
    if r.returncode != 0:
        raise ConfigError(f"{key}: {python} failed: {r.stderr.strip().splitlines()[-1:]}: {SETUP_HINT}.")
    return json.loads(r.stdout)


def check_interpreter(python: str, key: str = "sensitivity.inc.python") -> dict:
    """Probe ``python`` and require the pinned neural-compressor; returns the versions recorded
    as the ``inc`` rule's params (``VLSENS_VERSION_OVERRIDES`` applies, as for the other stages)."""
    found = probe(python, key)
    inc = found.get("neural-compressor")
    if inc is None:
        raise ConfigError(
            f"{key}: {python} has no neural-compressor. sensitivity.engines lists 'inc', which needs "
            f"neural-compressor=={INC_VERSION} in its own environment: {SETUP_HINT}.")
    if inc != INC_VERSION:
        raise ConfigError(
            f"{key}: {python} has neural-compressor {inc}; engine inc relies on {INC_VERSION} (the last release "
            f"with the ONNX Runtime adaptor and mse_v2): {SETUP_HINT}.")
    if found.get("six") is None:
        raise ConfigError(f"{key}: {python} lacks `six`, which neural-compressor imports without declaring it: "
                          f"{SETUP_HINT}.")
    ov = overrides()
    return {n: ov.get(n, found[n]) for n in ("neural-compressor", "onnx", "onnxruntime", "numpy")}


def pinned_versions(env_yaml: str | Path) -> dict:
    """The pins of ``envs/inc.yaml`` (the recorded versions when conda builds the environment)."""
    from packaging.requirements import Requirement

    ov = overrides()
    pins = {}
    for line in requirements(env_yaml):
        r = Requirement(line)
        pins[r.name] = ov.get(r.name, next(iter(r.specifier)).version)
    return {n: pins[n] for n in ("neural-compressor", "onnx", "onnxruntime", "numpy")}


def requirements(env_yaml: str | Path) -> list[str]:
    """The pip requirement lines of a conda env file."""
    import yaml

    env = yaml.safe_load(Path(env_yaml).read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def check_config(config: dict, towers) -> None:
    """What engine ``inc`` can do, for a config that enables it: FP32 graphs of towers that support
    it, and settings INC's adaptor honours."""
    from vlsens.quantize.qdq import QuantSettings

    sens = config["sensitivity"]
    able = [t for t in towers if "inc" in t.engines]
    fp32 = [t.graph for t in able if "fp32" in t.analysed_variants()]
    if not fp32:
        keys = sorted({f"{t.key('sensitivity_variants')} is {t.analysed_variants()}" for t in able})
        raise ConfigError(
            "sensitivity.engines: 'inc' analyses the fp32 variant only (of fixed-size vision graphs: INC's ONNX "
            f"Runtime adaptor cannot quantize FP16 graphs), but {'; '.join(keys) or 'no such graph is configured'}; "
            "add fp32 or drop 'inc'.")
    problems = check_settings(QuantSettings.from_config(sens))
    if problems:
        raise ConfigError("; ".join(problems) + " (or drop 'inc' from sensitivity.engines).")


def resolve(config: dict, basedir: str | Path, conda: bool, env_yaml: str | Path) -> tuple[str, dict]:
    """Engine ``inc``'s interpreter and the versions its rules record: conda builds ``env_yaml``
    (its pins are recorded), else ``sensitivity.inc.python`` is probed now."""
    if conda:
        return "python", pinned_versions(env_yaml)
    python = resolve_python(config["sensitivity"]["inc"]["python"], basedir)
    return python, check_interpreter(python)


def enabled(config_yaml: str | Path) -> bool:
    import yaml

    cfg = yaml.safe_load(Path(config_yaml).read_text()) or {}
    return "inc" in ((cfg.get("sensitivity") or {}).get("engines") or [])


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "requirements":
        print("\n".join(requirements(argv[1])))
        return 0
    if len(argv) == 2 and argv[0] == "enabled":
        return 0 if enabled(argv[1]) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
