"""envs/*.yaml, pyproject.toml and constraints.txt stay in step."""

import re
import tomllib

import yaml
from packaging.requirements import Requirement

from conftest import REPO


def _pyproject_deps():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {Requirement(r).name: str(Requirement(r).specifier) for r in data["project"]["dependencies"]}


def _env_pip_deps(path):
    env = yaml.safe_load(path.read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {Requirement(r).name: str(Requirement(r).specifier) for r in pip}


def test_conda_env_matches_pyproject():
    assert _env_pip_deps(REPO / "envs" / "vlsens.yaml") == _pyproject_deps()


def test_constraints_satisfy_pyproject_ranges():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            r = Requirement(line)
            pins[r.name] = next(iter(r.specifier)).version
    for name, spec in _pyproject_deps().items():
        assert name in pins, f"{name} has no pin in constraints.txt"
        assert Requirement(f"{name}{spec}").specifier.contains(pins[name]), f"{name}=={pins[name]} outside {spec}"


def test_every_rule_declares_log_benchmark_and_conda():
    text = "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    rules = re.split(r"\nrule ", text)[1:]
    assert rules
    for body in rules:
        name = body.split(":")[0]
        for directive in ("log:", "benchmark:", "conda:", "script:"):
            assert directive in body, f"rule {name} lacks {directive}"
