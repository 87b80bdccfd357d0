"""python -m vlsens.core.records: a summary line per folder, a non-zero exit on a missing or empty
folder and on any record that breaks its schema."""

import json
import subprocess
import sys

from conftest import REPO


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "vlsens.core.records", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO)


def test_missing_and_empty_folders_fail(tmp_path):
    r = _cli(tmp_path / "nope")
    assert r.returncode == 2 and "no such folder" in r.stderr
    r = _cli(tmp_path)
    assert r.returncode == 2 and "no vlsens records under it" in r.stderr
    r = _cli("--help")
    assert r.returncode == 0 and "schema" in r.stdout


def test_summary_and_a_broken_record(tmp_path):
    rec = {"parts": "p", "counts": {"calib": 2, "eval": 1}, "inputs": [["pixel_values"]]}
    folder = tmp_path / "calib" / "vision" / "224x224" / "parts-fp32"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(rec))
    r = _cli(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("1 records (1 parts_calibration): all valid")
    (folder / "manifest.json").write_text(json.dumps({**rec, "counts": {"calib": "two", "eval": 1}}))
    r = _cli(tmp_path)
    assert r.returncode == 1 and "counts.calib: 'two' is not of type 'integer'" in r.stdout
    assert r.stdout.strip().endswith("1 problem(s)")
