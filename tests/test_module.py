"""The workflow as a Snakemake module of another workflow (what snakedeploy writes): its rules
find their scripts, the package and the schemas from their own checkout, not the importer's."""

import subprocess
import sys

from conftest import REPO

IMPORTER = f'''configfile: "{REPO}/config/config.yaml"


module vlsens:
    snakefile:
        "{REPO}/Snakefile"
    config:
        config


use rule * from vlsens
'''


def test_used_as_a_module(tmp_path):
    (tmp_path / "Snakefile").write_text(IMPORTER)
    cfg = str(REPO / ".test" / "config" / "config.yaml")
    smk = [sys.executable, "-m", "snakemake", "--cores", "2"]
    r = subprocess.run([*smk, "-n", "--configfile", cfg], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "sensitivity_shard" in out and "profile" in out and "deploy" not in out.split("Job stats")[1]
    r = subprocess.run([*smk, "results/tiny/embeddings", "--configfile", cfg], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert (tmp_path / "results" / "tiny" / "embeddings" / "manifest.json").is_file()
    assert not (REPO / ".test" / "results").exists()
