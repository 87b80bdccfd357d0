"""The workflow through a real one-node SLURM (tests/slurm/run.sh): jobs go through SLURM, GPU
rules ask it for a GPU, CPU rules do not. Runs where it can install and start SLURM (root with
apt-get: CI); skipped, saying why, elsewhere."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

#: Jobs of the submitted DAG that run no model (the tiny preset is drawn with numpy; the fixed-size
#: calibration set is the image processor's PIL path): they must ask for no GPU.
CPU_RULES = {"tiny_checkpoint", "calibration"}


@pytest.mark.slow
def test_tiny_workflow_through_real_slurm(tmp_path):
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("needs root and apt-get to install and start slurmctld/slurmd/munge (CI has both)")
    r = subprocess.run(["bash", str(REPO / "tests" / "slurm" / "run.sh"), str(tmp_path), sys.executable],
                       capture_output=True, text=True, timeout=2400)
    log = (tmp_path / "log" / "snakemake.log")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
    jobs = json.loads((tmp_path / "jobs.json").read_text())
    rules = {j["rule"] for j in jobs}
    assert {"tiny_checkpoint", "reference", "export", "fp16", "calibration",
            "sensitivity_prepare", "sensitivity_shard"} <= rules, jobs
    assert all(j["state"] == "COMPLETED" for j in jobs), jobs
    for j in jobs:
        if j["rule"] not in CPU_RULES:
            assert "gpu" in j["tres_per_job"] and j["partition"] == "gpu", j
        else:
            assert "gpu" not in j["tres_per_job"] and j["partition"] == "cpu", j
    assert (tmp_path / "results/tiny/vision/224x224/fp16/model.onnx").is_file()
    assert (tmp_path / "results/tiny/sensitivity/vision/224x224/fp32/shards/ort.0-of-2.csv").is_file()
    # integrity through SLURM: each job recorded its outputs on the node, the run checks them
    log = tmp_path / "log"
    assert "all valid" in (log / "records.txt").read_text() and "rc=0" in (log / "records.txt").read_text()
    fault = (log / "fault.log").read_text()
    assert "rc=0" not in fault and "its previous version is back in place" in fault, fault[-3000:]
    assert (log / "fp16-before.sha").read_text() == (log / "fp16-after.sha").read_text()  # the old model, whole
    after = (log / "after-fault.log").read_text()
    assert "rc=0" in after and "fp16" in after and "Nothing to be done" not in after, after[-2000:]  # runs again
    tamper = (log / "tamper.log").read_text()
    assert "rc=0" not in tamper and "ort.0-of-2.csv" in tamper and "changed after they were written" in tamper, \
        tamper[-3000:]
    # vlsens upgrade through SLURM: torch's jobs ran in phases, what reads their (equivalent) outputs
    # only was dated, not submitted; a plain run has nothing left
    upgrade = (log / "upgrade.log").read_text()
    assert "rc=0" in upgrade, upgrade[-3000:]
    ledger = json.loads((tmp_path / "results/tiny/upgrade.json").read_text())
    ran = {label.split()[0] for p in ledger["phases"] for label in p["jobs"]}
    assert ledger["libraries"] == ["torch"] and {"reference", "export"} <= ran, ledger
    assert not ran & {"sensitivity_prepare", "sensitivity_shard"}, ledger
    assert {label.split()[0] for label in ledger["touched"]} >= {"sensitivity_prepare", "sensitivity_shard"}, ledger
    assert "Nothing to be done" in (log / "after-upgrade.log").read_text()
    assert "stopped daemons" in r.stdout
    left = subprocess.run(["pgrep", "-x", "slurmctld|slurmd"], capture_output=True, text=True).stdout.split()
    assert not left, f"daemons left running: {left}"
