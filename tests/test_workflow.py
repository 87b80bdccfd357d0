"""The whole DAG on the tiny preset through Snakemake's command line."""

import json
import subprocess
import sys

import pytest

from conftest import REPO


def smk(workdir, *args, timeout=900, overrides=None):
    import os

    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(workdir / "config.yaml"), *args]
    env = dict(os.environ)
    env.pop("VLSENS_VERSION_OVERRIDES", None)
    if overrides:
        env["VLSENS_VERSION_OVERRIDES"] = overrides
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def planned(workdir, overrides=None) -> tuple[set[str], str]:
    """Rules a dry run would execute (from Snakemake's job table) and its full output."""
    r = smk(workdir, "-n", "--cores", "2", overrides=overrides)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    rules, table = set(), False
    for line in out.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            table = True
        elif table and parts and parts[0] == "total":
            break
        elif table and len(parts) == 2 and parts[1].isdigit():
            rules.add(parts[0])
    return rules - {"all"}, out


VISION_TORCH = {"vision_reference", "export_vision", "dynamic_reference", "export_dynamic"}
TEXT_TORCH = {"text_reference", "export_text", "text_calibration"}
ORT_STAGES = {"sensitivity_prepare", "sensitivity_shard", "sensitivity_gather", "profile", "sensitivity_inc",
              "sensitivity_compare", "text_sensitivity_prepare", "text_sensitivity_shard",
              "text_sensitivity_gather", "text_profile", "dynamic_sensitivity_prepare", "dynamic_sensitivity_shard",
              "dynamic_sensitivity_gather", "dynamic_profile"}


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
    dyn = wd / "results" / "tiny" / "vision" / "dynamic"
    for variant in ("fp32", "fp16", "fp32-sim", "fp16-sim"):
        rec = json.loads((dyn / variant / "parity.json").read_text())
        assert rec["passed"] and len(rec["per_input"]) == 5
    ev = json.loads((wd / "results" / "tiny" / "profile" / "vision" / "dynamic" / "fp32" / "eval.json").read_text())
    assert ev["status"] == "met" and ev["eval_images"] == 6  # 3 evaluation images x 2 sizes
    assert not [p for p in (wd / "results").rglob("*") if ".staging-" in p.name or ".tmp-" in p.name]


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


@pytest.mark.slow
def test_torch_upgrade_reruns_what_torch_made_and_downstream(finished_run):
    """torch is recorded by the stages that run it (references, exports, text calibration); the
    tiny checkpoint (numpy-drawn weights) and the vision calibration (PIL image processor) stay."""
    rules, out = planned(finished_run, "torch=99.0")
    assert VISION_TORCH | TEXT_TORCH <= rules, rules
    assert {"vision_fp16", "vision_simplify", "text_fp16", "sensitivity_prepare", "profile"} <= rules  # downstream
    assert "tiny_checkpoint" not in rules and "calibration" not in rules, rules
    # the rules that first read torch say why: their recorded versions changed (the exports run
    # torch too, but Snakemake reports their updated inputs, the first reason it finds)
    reasons = out[out.index("Reasons:"):].split("params have changed since last execution:")[1].split("\n")[1]
    assert {"vision_reference", "text_reference", "text_calibration", "dynamic_reference"} <= \
        {r.strip() for r in reasons.split(",")}, reasons
    assert "Params have changed since last execution" in out and "'torch': '99.0'" in out


@pytest.mark.slow
def test_onnxruntime_upgrade_reruns_only_sensitivity_and_profile(finished_run):
    rules, out = planned(finished_run, "onnxruntime=99.0")
    assert {"sensitivity_prepare", "profile", "text_sensitivity_prepare", "text_profile"} <= rules, rules
    assert rules <= ORT_STAGES, rules - ORT_STAGES
    assert "params have changed since last execution" in out


@pytest.mark.slow
def test_package_code_change_reruns_the_stages_that_import_it(finished_run):
    """Snakemake tracks a rule's script, not the modules it imports: params carry a hash of the
    vlsens modules each script imports (transitively). A change to vlsens.compare re-runs only the
    comparison; one to vlsens.text only the text stages."""
    rules, _ = planned(finished_run, "vlsens.compare=edited")
    assert rules == {"sensitivity_compare"}, rules
    rules, _ = planned(finished_run, "vlsens.text=edited")
    assert {"text_reference", "export_text", "text_fp16", "text_simplify", "text_calibration"} <= rules, rules
    assert not {r for r in rules if r.startswith(("vision", "export_vision", "calibration", "sensitivity_", "profile",
                                                  "dynamic", "export_dynamic"))}


def test_lint_is_clean():
    r = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(REPO),
                        "--lint"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations" in r.stdout + r.stderr
