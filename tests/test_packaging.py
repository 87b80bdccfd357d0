"""envs/*.yaml, pyproject.toml and constraints.txt stay in step."""

import re

import tomllib
import yaml
from conftest import REPO
from packaging.requirements import Requirement


def _pyproject_deps(*extras):
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = data["project"]["dependencies"] + [r for e in extras for r in data["project"]["optional-dependencies"][e]]
    return {Requirement(r).name: str(Requirement(r).specifier) for r in reqs}


def _env_pip_deps(path):
    env = yaml.safe_load(path.read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {Requirement(r).name: str(Requirement(r).specifier) for r in pip}


def test_conda_envs_use_pyproject_requirements():
    deps = _pyproject_deps("genai", "peers")
    envs = sorted((REPO / "envs").glob("*.yaml"))
    assert {p.name for p in envs} >= {"torch.yaml", "onnx.yaml", "inc.yaml"}
    for env in envs:
        if env.name == "inc.yaml":  # engine inc's own environment: see test_inc_env_is_pinned
            continue
        for name, spec in _env_pip_deps(env).items():
            assert name in deps, f"{env.name}: {name} is not a dependency in pyproject.toml"
            assert spec == deps[name], f"{env.name}: {name}{spec} differs from pyproject's {name}{deps[name]}"


def test_rules_use_existing_envs():
    for smk in (REPO / "rules").glob("*.smk"):
        for env in re.findall(r'conda:\s*\n\s*"\.\./(envs/[^"]+)"', smk.read_text()):
            assert (REPO / env).is_file(), f"{smk.name} names missing {env}"


ONNX_ONLY_STAGES = """
import sys
sys.modules["torch"] = None          # any import of torch now raises ImportError
sys.modules["transformers"] = None
import vlsens.variants.float16, vlsens.variants.simplified, vlsens.core.scripting, vlsens.export.parity, vlsens.variants
import vlsens.data.samples
import vlsens.sensitivity.stages, vlsens.precision.int8, vlsens.sensitivity.compare, vlsens.data.calibration, vlsens.export.stages
from vlsens.core.device import set_threads
set_threads(2)
print("ok")
"""


def test_onnx_only_stages_do_not_need_torch():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", ONNX_ONLY_STAGES], capture_output=True, text=True,
                       env={"PYTHONPATH": str(REPO / "src")})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_constraints_satisfy_pyproject_ranges():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            r = Requirement(line)
            pins[r.name] = next(iter(r.specifier)).version
    for name, spec in _pyproject_deps("genai", "peers", "slurm", "test", "lint").items():  # the extras `make` installs
        assert name in pins, f"{name} has no pin in constraints.txt"
        assert Requirement(f"{name}{spec}").specifier.contains(pins[name]), f"{name}=={pins[name]} outside {spec}"


#: Rules that run their script with engine inc's interpreter (a shell command, not script:).
SHELL_RULES = {"sensitivity_inc", "sensitivity_inc_tune"}


def test_every_rule_declares_log_benchmark_conda_and_cluster_resources():
    text = "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    rules = re.split(r"\nrule ", text)[1:]
    assert rules
    for body in rules:
        name = body.split(":")[0]
        for directive in ("log:", "benchmark:", "conda:", "shell:" if name in SHELL_RULES else "script:"):
            assert directive in body, f"rule {name} lacks {directive}"
        # GPU use, partition, memory and runtime from one helper (rules/common.smk: cluster)
        assert re.search(r"resources:\s*\n\s*\*\*cluster\(\s*\"" + name + r"\"", body), f"rule {name}: resources"
        assert "provenance=" in body or name == "all", f"rule {name} records no provenance (rerun trigger)"


def test_no_results_path_is_written_in_the_rules():
    """One path layout (vlsens.core.paths): the rules spell no results/ path themselves."""
    for smk in (REPO / "rules").glob("*.smk"):
        assert "results/" not in smk.read_text(), smk.name


def test_inc_env_is_pinned():
    """envs/inc.yaml (also the source of the Makefile's .venv-inc) pins exactly what the engine
    relies on; its onnxruntime is the main environment's, so both engines run the same runtime."""
    from vlsens.sensitivity.inc.env import requirements
    from vlsens.sensitivity.inc.settings import INC_VERSION

    reqs = {Requirement(r).name: Requirement(r) for r in requirements(REPO / "envs" / "inc.yaml")}
    for r in reqs.values():
        assert str(r.specifier).startswith("=="), f"envs/inc.yaml: {r} is not an exact pin"
    assert str(reqs["neural-compressor"].specifier) == f"=={INC_VERSION}"
    assert Requirement(f"onnx{reqs['onnx'].specifier}").specifier.contains("1.18.0")
    assert "six" in reqs  # imported by INC, not declared by it
    pins = {Requirement(line).name: str(Requirement(line).specifier) for line in
            (s.split("#")[0].strip() for s in (REPO / "constraints.txt").read_text().splitlines()) if line}
    assert str(reqs["onnxruntime"].specifier) == pins["onnxruntime"]
    assert "vlsens.sensitivity.inc.env requirements envs/inc.yaml" in (REPO / "Makefile").read_text()


def test_a_non_editable_install_finds_its_schemas(tmp_path):
    """Built and installed as a wheel (not editable), vlsens carries workflow/schemas as package
    data: the config schema loads and python -m vlsens.core.records validates a record."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    src = tmp_path / "src-tree"  # a copy: the in-tree build writes build/ and *.egg-info
    shutil.copytree(REPO / "src", src / "src", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "workflow" / "schemas", src / "workflow" / "schemas")
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (target / "vlsens" / "schemas").is_symlink() and (target / "vlsens" / "schemas" / "records").is_dir()
    run = tmp_path / "run" / "calib" / "vision" / "224x224" / "parts-fp32"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"parts": "p", "counts": {"calib": 1, "eval": 1}, "inputs": [["x"]]}))
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import vlsens, vlsens.config as c; print(vlsens.__file__); c.load_schema(); "
            "import sys, vlsens.core.records as r; sys.exit(r._main([sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].startswith(str(target))  # the installed copy, not the source tree
    assert r.stdout.strip().endswith("all valid")
