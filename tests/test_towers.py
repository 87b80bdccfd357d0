"""Adding a tower is shown, not claimed: a tower defined in tests/toy_towers.py (the vision
tower's merger alone), named in a config, gets the reference, export, FP16, onnxsim, calibration,
sensitivity and profile stages through Snakemake's CLI; nothing in src/, rules/ or workflow/
names it. Its code counts in its jobs' rerun trigger, and only there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, default_config

pytestmark = pytest.mark.slow
TOY = {"class": "toy_towers:MergerTower", "variants": ["fp32", "fp16", "fp32-sim", "fp16-sim"],
       "sensitivity_variants": ["fp32"], "settings": {"tokens": [64, 256], "seed": 0, "num_calib": 4, "num_eval": 2}}


def smk(workdir, *args, overrides=None):
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    env.pop("VLSENS_VERSION_OVERRIDES", None)
    if overrides:
        env["VLSENS_VERSION_OVERRIDES"] = overrides
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    r.out = r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("toy")
    cfg = default_config(**{"vision.sizes": ["224x224"], "vision.variants": ["fp32"], "vision.sensitivity_variants": [],
                            "vision.dynamic.enabled": False, "vision.uint8.sizes": [], "text.enabled": False,
                            "deploy.enabled": False, "towers": [TOY]})
    (wd / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = smk(wd)
    assert r.returncode == 0, r.out[-4000:]
    return wd


def test_a_tower_from_the_config_gets_every_generic_stage(toy_run):
    res = toy_run / "results" / "tiny"
    for v in TOY["variants"]:
        rec = json.loads((res / "vision" / "merger" / v / "parity.json").read_text())
        assert rec["passed"] and [p["case"] for p in rec["per_input"]] == ["64-tokens", "256-tokens"], v
    assert rec["extra"]["graphs"]["model.onnx"]["nodes_after"] <= rec["extra"]["graphs"]["model.onnx"]["nodes_before"]
    man = json.loads((res / "calib" / "vision" / "merger" / "manifest.json").read_text())
    assert man["graph"] == "vision/merger" and man["counts"] == {"calib": 4, "eval": 2}
    rows = (res / "sensitivity" / "vision" / "merger" / "fp32" / "ort.csv").read_text().splitlines()
    assert len(rows) == 3 and all("merger" in r or "/mlp/" in r for r in rows[1:])  # the merger's two Gemms
    ev = json.loads((res / "profile" / "vision" / "merger" / "fp32" / "eval.json").read_text())
    assert ev["status"] == "met" and ev["measured"]["cosine"] >= ev["target"]["value"]
    assert (res / "logs" / "vision" / "merger" / "export.log").is_file()
    assert "Nothing to be done" in smk(toy_run, "-n").out


def test_the_towers_own_code_is_its_jobs_rerun_trigger(toy_run):
    """Editing the toy tower's module re-runs the toy graph's jobs (and the run-level report that reads
    them), no other graph's."""
    r = smk(toy_run, "-n", overrides="toy_towers=edited")
    assert r.returncode == 0, r.out[-3000:]
    graphs = {line.split("graph=")[1].split(",")[0] for line in r.out.splitlines()
              if "wildcards:" in line and "graph=" in line}
    assert graphs == {"vision/merger"}, graphs
    assert "rule reference:" in r.out and "rule export:" in r.out and "rule calibration:" in r.out


def test_a_bad_tower_class_is_a_config_error(tmp_path):
    cfg = default_config(**{"towers": [{"class": "toy_towers:NoSuchTower"}]})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = smk(tmp_path, "-n")
    assert r.returncode != 0 and "towers[0].class: cannot import tower class 'toy_towers:NoSuchTower'" in r.out
