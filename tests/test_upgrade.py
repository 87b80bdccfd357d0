"""`vlsens upgrade` on a real library version change: ml-dtypes 0.5.4 (`make install-test` puts it
into .venv-alt/, first on PYTHONPATH here) in place of the pinned 0.6.0, on a small DAG of the
tiny preset (one image size: fp32, fp16 and bf16, fp32 and fp16 analysed, the NPU parts, no text
tower and no deploy folders).

The BF16 variant converts its weights with ml_dtypes (the only stage here that records it), so
its job re-runs for the new version; bfloat16 rounds the same in both releases, so its outputs
come out equivalent and what reads them is dated, not run; nothing upstream and nothing else
runs; afterwards a plain `snakemake -n` has nothing to do, and every result equals a run from
scratch with 0.5.4 (bench/compare_runs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ALT = REPO / ".venv-alt" / "ml-dtypes-0.5.4"
LIBRARY, PINNED, OTHER = "ml-dtypes", "0.6.0", "0.5.4"
CONFIG = {"vision": {"sizes": ["224x224"], "variants": ["fp32", "fp16", "bf16"], "sensitivity_variants": ["fp32", "fp16"],
                     "dynamic": {"enabled": False}, "uint8": {"sizes": []}, "video": {"sizes": []}},
          "text": {"enabled": False}, "embeddings": {"dtypes": []}, "deploy": {"enabled": False}}


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
    r = subprocess.run([sys.executable, "-c", f"from importlib.metadata import version; print(version({LIBRARY!r}))"],
                       capture_output=True, text=True, env=_env(alt))
    return r.stdout.strip()


@pytest.mark.slow
def test_a_real_library_version_change_reruns_its_jobs_cuts_off_the_rest_and_equals_a_run_from_scratch(tmp_path):
    assert (ALT / "ml_dtypes").is_dir(), f"{ALT}: missing (make install-test installs {LIBRARY} there)"
    assert (_version(False), _version(True)) == (PINNED, OTHER)
    run = tmp_path / "run"
    _from_scratch(run, alt=False)
    r = subprocess.run([sys.executable, "-m", "vlsens.cli", "upgrade", "--dir", str(run), "--config",
                        str(run / "config.yaml"), "--cores", "2"], capture_output=True, text=True, env=_env(True),
                       timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    ledger = json.loads((run / "results" / "tiny" / "upgrade.json").read_text())
    assert ledger["libraries"] == [LIBRARY]
    ran = [label.split()[0] for p in ledger["phases"] for label in p["jobs"]]
    assert ran == ["bf16"], ledger  # the one job that records the library, nothing else
    # its outputs say what was checked and that they came out equivalent
    rec = json.loads((run / "results/tiny/vision/224x224/bf16/.vlsens/model.onnx.json").read_text())
    assert rec["cutoff"]["libraries"] == {LIBRARY: [PINNED, OTHER]} and rec["cutoff"]["equivalent"] is True
    assert [o for p in ledger["phases"] for o in p["changed"]] == []
    # what reads the BF16 graph's record was dated, not run
    dated = [label.split()[0] for label in ledger["touched"]]
    assert dated and "bf16" not in dated, ledger
    # nothing left for a plain run, and the results are those of a run from scratch with the other version
    left = _snakemake(run, "-n", alt=True)
    assert left.returncode == 0 and "Nothing to be done" in left.stdout + left.stderr, left.stdout[-3000:]
    scratch = tmp_path / "scratch"
    _from_scratch(scratch, alt=True)
    cmp = subprocess.run([sys.executable, str(REPO / "bench" / "compare_runs.py"), str(run / "results" / "tiny"),
                          str(scratch / "results" / "tiny")], capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stdout[-3000:]
