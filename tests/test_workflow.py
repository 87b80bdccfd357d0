"""The whole DAG on the tiny preset through Snakemake's command line."""

import json
import subprocess
import sys

import pytest

from conftest import REPO


def smk(workdir, *args, timeout=900):
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(workdir / "config.yaml"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    import yaml

    wd = tmp_path_factory.mktemp("workflow")
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["sensitivity"]["engines"] = ["ort", "inc"]  # both engines (inc: `make inc-env`'s .venv-inc)
    (wd / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = smk(wd, "--cores", "2", "--resources", "gpu=1")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return wd


@pytest.mark.slow
def test_whole_dag_builds_verified_models(finished_run):
    wd = finished_run
    for size in ("224x224", "224x336"):
        for variant in ("fp32", "fp16", "fp32-sim", "fp16-sim"):
            d = wd / "results" / "tiny" / "vision" / size / variant
            assert (d / "model.onnx").is_file() and (d / "model.onnx.data").is_file()
            rec = json.loads((d / "parity.json").read_text())
            assert rec["passed"] is True and rec["variant"] == variant
            h, w = map(int, size.split("x"))
            assert rec["input_shape"] == [2, 3, h, w]
        assert (wd / "results" / "tiny" / "logs" / "export_vision" / f"{size}.log").is_file()
        for variant in ("fp32", "fp16"):
            sens = wd / "results" / "tiny" / "sensitivity" / "vision" / size / variant
            assert (sens / "ort.csv").is_file() and (sens / "ort.json").is_file()
            ev = json.loads((wd / "results" / "tiny" / "profile" / "vision" / size / variant / "eval.json").read_text())
            assert ev["status"] == "met" and ev["meets_target"] and ev["measured"]["cosine"] >= 0.999
        sens = wd / "results" / "tiny" / "sensitivity" / "vision" / size / "fp32"
        assert (sens / "inc.csv").is_file() and not (sens.parent / "fp16" / "inc.csv").exists()
        cmp = json.loads((sens / "compare.json").read_text())
        assert cmp["engines"] == ["ort", "inc"] and cmp["same_eval_data"] and cmp["common_ops"] > 0
        assert (wd / "results" / "tiny" / "calib" / "vision" / size / "calib.tar").is_file()
        assert (wd / "results" / "tiny" / "benchmarks" / "export_vision" / f"{size}.tsv").is_file()
    text = wd / "results" / "tiny" / "text"
    for variant in ("fp32", "fp16", "fp32-sim", "fp16-sim"):
        rec = json.loads((text / variant / "parity.json").read_text())
        assert rec["passed"] and {p["graph"] for p in rec["per_input"]} == {"model.onnx", "embeds.onnx"}
        for g in ("model.onnx", "embeds.onnx"):
            assert (text / variant / g).is_file() and (text / variant / f"{g}.data").is_file()
    assert json.loads((wd / "results" / "tiny" / "calib" / "text" / "manifest.json").read_text())["counts"]
    for variant in ("fp32", "fp16"):
        rows = (wd / "results" / "tiny" / "sensitivity" / "text" / variant / "ort.csv").read_text().splitlines()
        assert "layers.1/mlp/down_proj" in rows[1]  # the planted text layer (config default)
        ev = json.loads((wd / "results" / "tiny" / "profile" / "text" / variant / "eval.json").read_text())
        assert ev["status"] == "met" and ev["meets_target"] and ev["measured"]["kl"] <= ev["target"]["value"]
    assert not list((wd / "results").rglob(".staging-*"))


@pytest.mark.slow
def test_rerun_has_nothing_to_do(finished_run):
    r = smk(finished_run, "-n", "--cores", "2")
    assert r.returncode == 0
    assert "Nothing to be done" in r.stdout + r.stderr


@pytest.mark.slow
def test_changed_tolerance_reruns_only_gated_stages_downstream(finished_run):
    """A changed FP16 param re-runs FP16 and what consumes it, nothing upstream."""
    import yaml

    wd = finished_run
    cfg = yaml.safe_load((wd / "config.yaml").read_text())
    cfg["fp16"]["max_activation"] = 256
    alt = wd / "alt.yaml"
    alt.write_text(yaml.safe_dump(cfg))
    r = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(wd),
         "--configfile", str(alt), "-n", "--cores", "2", "--quiet", "rules"],
        capture_output=True, text=True, timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "vision_fp16" in out and "vision_simplify" in out and "sensitivity_prepare" in out
    assert "text_fp16" in out and "text_profile" in out  # the text FP16 variant shares fp16.*
    assert "export_vision" not in out and "vision_reference" not in out and "tiny_checkpoint" not in out
    assert "export_text" not in out and "text_reference" not in out and "text_calibration" not in out
    assert "calibration" not in out
    assert "sensitivity_inc" not in out and "sensitivity_compare" not in out  # fp32-only: untouched


def test_lint_is_clean():
    r = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(REPO),
                        "--lint"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations" in r.stdout + r.stderr
