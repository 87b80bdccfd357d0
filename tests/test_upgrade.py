"""`vlsens upgrade` on a real library version change: onnxsim 0.4.36 (`make install-test` puts it
into .venv-alt/, first on PYTHONPATH here) in place of the pinned 0.8.1, on a small DAG of the tiny
preset (one image size, fp32 and fp32-sim, the NPU parts, no text tower and no deploy folders).

onnxsim simplifies the fp32-sim graph and each NPU part. The new version folds the graph
differently, so those outputs change and their consumers re-run; nothing upstream and nothing on
the fp32 path runs; the jobs that read only outputs that came out equivalent are dated, not run;
afterwards a plain `snakemake -n` has nothing to do, and every result equals a run from scratch
with onnxsim 0.4.36 (bench/compare_runs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ALT = REPO / ".venv-alt" / "onnxsim-0.4.36"
CONFIG = {"vision": {"sizes": ["224x224"], "variants": ["fp32", "fp32-sim"], "sensitivity_variants": ["fp32"],
                     "dynamic": {"enabled": False}, "uint8": {"sizes": []}, "video": {"sizes": []}},
          "text": {"enabled": False}, "embeddings": {"dtypes": []}, "deploy": {"enabled": False}}
#: the rules that run onnxsim (their params record its version)
ONNXSIM_RULES = {"simplify", "parts"}
#: upstream of onnxsim or on the fp32 path only: nothing of theirs may run
UNTOUCHED = {"tiny_checkpoint", "reference", "calibration", "calibration_tar", "export", "sensitivity_prepare",
             "sensitivity_shard", "sensitivity_gather", "profile", "report_heatmap", "report_ranked", "report_pareto"}


def _env(alt: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VLSENS_VERSION_OVERRIDES"}
    env["VLSENS_WORKFLOW"] = str(REPO)
    if alt:
        env["PYTHONPATH"] = os.pathsep.join([str(ALT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _snakemake(wd: Path, *args: str, alt: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(wd),
           "--configfile", str(wd / "config.yaml"), "--cores", "2", "--resources", "gpu=1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(alt), timeout=1800)


def _from_scratch(wd: Path, alt: bool) -> None:
    wd.mkdir()
    (wd / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    r = _snakemake(wd, alt=alt)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def _version(alt: bool) -> str:
    r = subprocess.run([sys.executable, "-c", "from importlib.metadata import version; print(version('onnxsim'))"],
                       capture_output=True, text=True, env=_env(alt))
    return r.stdout.strip()


@pytest.mark.slow
def test_a_real_onnxsim_version_change_reruns_what_it_changes_and_equals_a_run_from_scratch(tmp_path):
    assert (ALT / "onnxsim").is_dir(), f"{ALT}: missing (make install-test installs onnxsim 0.4.36 there)"
    old, new = _version(False), _version(True)
    assert (old, new) == ("0.8.1", "0.4.36")
    run = tmp_path / "run"
    _from_scratch(run, alt=False)
    r = subprocess.run([sys.executable, "-m", "vlsens.cli", "upgrade", "--dir", str(run), "--config",
                        str(run / "config.yaml"), "--cores", "2"], capture_output=True, text=True, env=_env(True),
                       timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    ledger = json.loads((run / "results" / "tiny" / "upgrade.json").read_text())
    ran = [label.split()[0] for p in ledger["phases"] for label in p["jobs"]]
    assert set(ran) >= ONNXSIM_RULES and not set(ran) & UNTOUCHED, ran
    assert ledger["libraries"] == ["onnxsim"]
    # each simplify / parts output says what was checked, and the new onnxsim changed the graph
    rec = json.loads((run / "results/tiny/vision/224x224/fp32-sim/.vlsens/model.onnx.json").read_text())
    assert rec["cutoff"]["libraries"] == {"onnxsim": [old, new]} and rec["cutoff"]["equivalent"] is False
    changed = [o for p in ledger["phases"] for o in p["changed"]]
    assert "results/tiny/vision/224x224/fp32-sim/model.onnx" in changed
    # a job runs in a later phase only for an output that changed before it, or for its own onnxsim
    first = {label.split()[0] for label in ledger["phases"][0]["jobs"]}
    assert first <= ONNXSIM_RULES
    assert not set(ledger["touched"]) & {label for p in ledger["phases"] for label in p["jobs"]}
    # nothing left for a plain run, and the results are those of a run from scratch with the new onnxsim
    left = _snakemake(run, "-n", alt=True)
    assert left.returncode == 0 and "Nothing to be done" in left.stdout + left.stderr, left.stdout[-3000:]
    scratch = tmp_path / "scratch"
    _from_scratch(scratch, alt=True)
    cmp = subprocess.run([sys.executable, str(REPO / "bench" / "compare_runs.py"), str(run / "results" / "tiny"),
                          str(scratch / "results" / "tiny")], capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stdout[-3000:]
