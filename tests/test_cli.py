"""The `vlsens` command: `vlsens run CHECKPOINT` writes its config and runs the workflow's DAG."""

import subprocess
import sys

import yaml
from conftest import REPO


def _vlsens(*args, cwd):
    return subprocess.run([sys.executable, "-m", "vlsens.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_run_writes_the_config_and_plans_the_dag(tiny_ckpt, tmp_path):
    r = _vlsens("run", tiny_ckpt, "--sizes", "224x224", "--set", "vision.batch_size=2", "--set",
                "deploy.enabled=false", "--name", "mine", "-n", "--cores", "2", "--", "--quiet", "rules", cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    cfg = yaml.safe_load((tmp_path / "vlsens-mine.yaml").read_text())
    assert cfg == {"model": {"checkpoint": str(tiny_ckpt), "name": "mine"}, "vision": {"sizes": ["224x224"],
                   "batch_size": 2}, "deploy": {"enabled": False}}
    assert f"--snakefile {REPO / 'Snakefile'}" in out and "-n" in out
    assert "export" in out and "Job stats" in out  # Snakemake planned the jobs
    assert (tmp_path / "results" / "mine" / "inputs").is_dir()  # the DAG was built here, not in the checkout


def test_bad_input_is_a_clear_error(tmp_path):
    r = _vlsens("run", tmp_path / "nope", "-n", cwd=tmp_path)
    assert r.returncode != 0 and "model.checkpoint" in r.stdout + r.stderr
    r = _vlsens("run", "tiny", "--set", "novalue", "-n", cwd=tmp_path)
    assert r.returncode != 0 and "expected key=value" in r.stderr
    # a path through a value, an empty key part, a value that is no YAML: one line each, no traceback
    for item, says in (("model.checkpoint.x=1", "model.checkpoint is already the value 'tiny'"),
                       ("vision..sizes=1", "has an empty part"), ("threads=[1", "the value is not YAML")):
        r = _vlsens("run", "tiny", "--set", item, "-n", cwd=tmp_path)
        assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = _vlsens("records", tmp_path / "nope", cwd=tmp_path)
    assert r.returncode == 2 and "no such folder" in r.stderr
