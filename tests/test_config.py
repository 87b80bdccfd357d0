"""Bad configuration fails when the DAG is built, with a message that names key, value and fix."""

import subprocess
import sys

import pytest
import yaml
from conftest import REPO, default_config

from vlsens.core.errors import ConfigError
from vlsens.dag.plan import configure
from vlsens.dag.targets import all_targets


def _cfg(**changes):
    """The default config with ``changes`` (``a__b`` is the key ``a.b``)."""
    return default_config(**{k.replace("__", "."): v for k, v in changes.items()})


def make_plan(cfg, workdir=REPO):
    """What the Snakefile does when the DAG is built: the plan and every tower, checked."""
    return configure(cfg, workdir)


def test_default_config_plan():
    plan, towers = make_plan(_cfg(model__tiny__weights="auto"))  # config.yaml's own value
    assert plan.model == "tiny" and plan.preset == "tiny"
    assert plan.checkpoint == "results/tiny/checkpoint"
    assert list(towers) == ["vision/224x224", "vision/224x336", "vision/224x224-u8", "vision/224x224-t2",
                            "vision/dynamic", "text", "decoder"]
    # the trained preset's gates and calibration read the task's calibration split (parity.images: auto)
    assert [r.name for r in plan.parity_images] == ["calib-0001-0.png", "calib-0002-0.png"]
    plan, _ = make_plan(_cfg(model__tiny__weights="random"))
    assert [r.name for r in plan.parity_images] == ["astronaut.png", "coffee.png"]
    plan, towers = make_plan(_cfg())
    targets = all_targets(plan, towers.values())
    assert "results/tiny/vision/224x336/fp16-sim/model.onnx" in targets
    assert len([t for t in targets if t.startswith("results/tiny/vision/224x")
                and t.endswith(("model.onnx", "parity.json")) and "/profile/" not in t]) == 20 + 4 + 4  # + u8, t2: fp32, fp16
    # NPU: the fp32 parts of the four fixed-size graphs and their calibration archives
    assert "results/tiny/parts/vision/224x224-t2/fp32" in targets
    assert len([t for t in targets if "/parts" in t]) == 8
    assert "results/tiny/text/fp32/parity.json" in targets and "results/tiny/calib/vision/224x224/calib.tar" in targets


def test_schema_accepts_default_and_rejects_unknown_keys():
    from snakemake.utils import validate

    schema = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
    validate(_cfg(), schema)
    bad = _cfg()
    bad["vision"]["sizez"] = ["224x224"]
    with pytest.raises(Exception, match="sizez"):
        validate(bad, schema)
    with pytest.raises(Exception, match="cuda"):
        validate(_cfg(device="gpu"), schema)


def test_a_key_with_alternatives_names_each_of_them():
    """plan.vision_measured takes a number (at least 2) or 'all': a bad value names the key and
    what each alternative wanted, not only that none matched."""
    from vlsens.config import schema_errors

    assert not schema_errors(_cfg(plan__vision_measured=14)) and not schema_errors(_cfg(plan__vision_measured="all"))
    (one,) = schema_errors(_cfg(plan__vision_measured=1))
    assert one.startswith("plan.vision_measured: 1 ") and "minimum of 2" in one and "['all']" in one, one
    (some,) = schema_errors(_cfg(plan__vision_measured="some"))
    assert "'some' is not of type 'integer'" in some and "['all']" in some, some


def test_invalid_size():
    with pytest.raises(ConfigError, match=r"vision\.sizes\[0\]: size '230x224'.*224x224, 252x224"):
        make_plan(_cfg(vision__sizes=["230x224"]))


def test_duplicate_size():
    with pytest.raises(ConfigError, match="more than once"):
        make_plan(_cfg(vision__sizes=["224x224", "224x224"]))


def test_missing_checkpoint_dir(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.checkpoint: checkpoint directory .*nope' does not exist"):
        make_plan(_cfg(model__checkpoint=str(tmp_path / "nope")))


def test_pickle_only_checkpoint(pickle_only_ckpt):
    with pytest.raises(ConfigError, match="model.checkpoint: .*only pickle weights"):
        make_plan(_cfg(model__checkpoint=str(pickle_only_ckpt)))


def test_local_checkpoint_gets_its_directory_name(tiny_ckpt):
    plan, _ = make_plan(_cfg(model__checkpoint=str(tiny_ckpt)))
    assert plan.model == tiny_ckpt.name and plan.preset is None and plan.checkpoint == str(tiny_ckpt)
    with pytest.raises(ConfigError, match="model.name"):
        make_plan(_cfg(model__checkpoint=str(tiny_ckpt), model__name="a/b"))


def test_parity_images_errors(tmp_path):
    with pytest.raises(ConfigError, match="parity.images: .*not 'builtin'"):
        make_plan(_cfg(parity__images=str(tmp_path / "none*.png")))
    with pytest.raises(ConfigError, match="parity.num_images: 500"):
        make_plan(_cfg(parity__num_images=500))


def test_tolerance_range():
    cfg = _cfg()
    cfg["parity"]["tolerance"]["fp16"]["min_cosine"] = 1.5
    with pytest.raises(ConfigError, match=r"parity\.tolerance\.fp16\.min_cosine"):
        make_plan(cfg)


@pytest.mark.parametrize("change,expect", [
    ({"vision__sizes": ["230x224"]}, "Nearest valid sizes: 224x224, 252x224"),
    ({"model__checkpoint": "/nonexistent/qwen"}, "does not exist"),
    ({"vision__sizes": "224x224"}, "is not of type 'array'"),
    ({"text__calibration__prompts": "/nonexistent/prompts.jsonl"}, "text.calibration.prompts"),
    ({"text__profile__metric": "bleu"}, "'bleu' is not one of"),
    ({"profile__metric": "kl"}, "'kl' is not one of"),  # kl/top1: text logits only
    # keys of the five old shapes of "which variants are analysed" name their new key
    ({"sensitivity__variants": ["fp32"]}, "sensitivity.variants: renamed to vision.sensitivity_variants"),
    ({"text__sensitivity": {"variants": ["fp32"]}}, "text.sensitivity.variants: renamed to text.sensitivity_variants"),
    ({"deploy__decoder__sensitivity_variants": []}, "deploy.precisions has 'int8-mixed', which needs 'fp32' in "
                                                    "deploy.decoder.sensitivity_variants"),
    # NaN compares false with every bound of the schema: refused by name
    ({"text__profile__target": float("nan")}, "text.profile.target: nan is not a number a run can use"),
])
def test_cli_reports_bad_config_before_any_job(tmp_path, change, expect):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(**change)))
    r = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(tmp_path),
         "--configfile", str(cfg), "-n", "--cores", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode != 0
    assert expect in r.stdout + r.stderr
    assert not (tmp_path / "results").exists()


def test_nan_and_infinity_are_named_wherever_they_sit():
    from vlsens.config import non_finite

    cfg = {"a": {"b": float("inf"), "c": [1.0, float("nan")], "d": "nan"}, "e": 0.5}
    assert [e.split(":")[0] for e in non_finite(cfg)] == ["a.b", "a.c[1]"]
    assert not non_finite(_cfg())


def test_text_keys_are_checked():
    _, towers = make_plan(_cfg())
    assert towers["text"].variants() == ["fp32", "fp16", "fp32-sim", "fp16-sim"]
    assert towers["text"].analysed_variants() == ["fp32", "fp16"]
    with pytest.raises(ConfigError, match=r"text\.parity\.image_size"):
        make_plan(_cfg(text__parity__image_size="230x230"))
    with pytest.raises(ConfigError, match=r"text\.sensitivity_variants: 'fp16'"):
        make_plan(_cfg(text__variants=["fp32"]))
    with pytest.raises(ConfigError, match=r"model\.tiny\.text_outlier\.layer: 5"):
        make_plan(_cfg(model__tiny__text_outlier={"layer": 5, "channels": 2, "scale": 10.0}))
    with pytest.raises(ConfigError, match=r"text\.calibration\.num_calib \+ num_eval = 70"):
        make_plan(_cfg(text__calibration__num_calib=60, text__calibration__num_eval=10))
    plan, towers = make_plan(_cfg(text__enabled=False))
    assert "text" not in towers and not any("/text/" in t for t in all_targets(plan, towers.values()))


def test_defaults_come_from_the_schema():
    """A config that names only what it must still plans; every default is the schema's."""
    from vlsens.config import load_schema, with_defaults

    minimal = {"model": {"checkpoint": "tiny"}, "vision": {"sizes": ["224x224"]},
               "parity": {"tolerance": {"fp32": {"min_cosine": 0.9, "max_rel_error": 0.1},
                                        "fp16": {"min_cosine": 0.9, "max_rel_error": 0.1}}}}
    full = with_defaults(minimal)
    schema = load_schema()
    assert full["calibration"]["num_calib"] == schema["properties"]["calibration"]["properties"]["num_calib"]["default"]
    assert full["text"]["profile"]["metric"] == "kl" and full["sensitivity"]["inc"]["python"] == ".venv-inc/bin/python"
    assert minimal == {"model": {"checkpoint": "tiny"}, "vision": {"sizes": ["224x224"]},
                       "parity": minimal["parity"]}  # the caller's dict is left alone
    plan, towers = make_plan(minimal)
    assert list(towers) == ["vision/224x224", "vision/dynamic", "text", "decoder"]


def test_uint8_sizes_are_checked_like_every_size():
    cfg = _cfg()
    cfg["vision"]["uint8"] = {"sizes": ["224x230"]}
    with pytest.raises(ConfigError, match=r"vision\.uint8\.sizes\[0\].*28"):
        make_plan(cfg)
    cfg["vision"]["uint8"] = {"sizes": ["224x224"], "variants": ["fp16"], "sensitivity_variants": ["fp32"]}
    with pytest.raises(ConfigError, match=r"vision\.uint8\.sensitivity_variants"):
        make_plan(cfg)


def test_video_case_sizes_are_checked():
    cfg = _cfg()
    cfg["vision"]["dynamic"]["video_cases"] = [{"frames": 4, "size": "224x225"}]
    with pytest.raises(ConfigError, match=r"vision\.dynamic\.video_cases\[0\]\.size"):
        make_plan(cfg)


def test_scale_config_plans_the_3b_preset(tmp_path):
    """`make scale`'s config: the 3b preset built by its own rule, every stage of every graph."""
    r = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(tmp_path),
         "--configfile", str(REPO / "config" / "scale.yaml"), "-n", "--cores", "1", "--quiet", "rules"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    for rule in ("checkpoint_3b", "reference", "export", "fp16", "simplify", "calibration", "sensitivity_prepare",
                 "sensitivity_shard", "profile", "deploy"):
        assert rule in out, (rule, out)
    assert "tiny_checkpoint" not in out
    from vlsens.config import schema_errors

    errors = schema_errors(_cfg(model__checkpoint="3b", **{"model__3b": {"text_layers": 37}}))
    assert errors and any("text_layers" in e for e in errors), errors


def test_full_depth_int4_config_plans_a_renamed_3b_preset(tmp_path):
    """`make scale-int4`'s config: the 3b preset at 36 layers under its own name (results/3b-full/,
    beside make scale's results/3b/), the decoder, engine nbits, the int4-mixed profile, the
    heuristic anchor and the int4 folders with the fp16 dynamic vision graph; no text graphs."""
    r = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(tmp_path),
         "--configfile", str(REPO / "config" / "scale-int4.yaml"), "-n", "--cores", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "results/3b-full/checkpoint" in out and "results/3b/" not in out
    for rule in ("checkpoint_3b", "sensitivity_nbits", "profile_nbits", "builder_int4", "deploy", "deploy_int4"):
        assert f"rule {rule}:" in out, rule
    assert "results/3b-full/vision/dynamic/fp16/model.onnx" in out and "results/3b-full/text/" not in out
    plan, _ = make_plan(_cfg(model__checkpoint="3b", model__name="3b-full"))
    assert plan.model == "3b-full" and plan.preset == "3b"
    with pytest.raises(ConfigError, match="model.name: 'tiny' is another preset's name"):
        make_plan(_cfg(model__checkpoint="3b", model__name="tiny"))


def test_cluster_memory_and_runtime_per_rule_and_per_graph():
    """cluster.mem_mb / runtime: one value per rule, or one per graph (a real-size text LM asks
    SLURM for more than a small vision graph), each with a default; checked by the schema."""
    from vlsens.config import schema_errors
    from vlsens.dag.resources import cluster_value

    table = {"default": 8000, "fp16": 6000, "export": {"default": 9000, "text": 24000, "fp32": 12000}}
    assert cluster_value(table, "profile", "text") == 8000  # no entry: the section's default
    assert cluster_value(table, "fp16", "text") == 6000  # one value for the rule
    assert cluster_value(table, "export", "text") == 24000 and cluster_value(table, "export", "vision/448x448") == 9000
    assert cluster_value(table, "export", "fp32") == 12000 and cluster_value(table, "export") == 9000
    assert not schema_errors(_cfg(cluster__mem_mb=table))
    assert schema_errors(_cfg(cluster__mem_mb={"default": 8000, "export": {"text": 24000}}))  # no default
    assert schema_errors(_cfg(cluster__mem_mb={"default": 8000, "export": {"default": 0}}))


def test_family_size_rules_and_features_are_checked_when_the_dag_is_built():
    """Qwen3-VL sides are multiples of 32 and the message says which family was detected; deploy
    and video prompts are refused where they are not built."""
    from vlsens.dag.plan import configure

    with pytest.raises(ConfigError, match=r"vision.sizes\[0\].*multiples of 32 \(Qwen3-VL \(detected from "
                                          r"model.checkpoint\): patch 16.*224x320"):
        configure(default_config(**{"model.checkpoint": "tiny-qwen3vl", "vision.sizes": ["224x336"],
                                    "deploy.enabled": False}))
    with pytest.raises(ConfigError, match=r"multiples of 28 \(Qwen2-VL"):
        configure(default_config(**{"model.checkpoint": "tiny-qwen2vl", "vision.sizes": ["224x320"],
                                    "deploy.enabled": False}))
    with pytest.raises(ConfigError, match="deploy.enabled: .*Qwen2.5-VL only.*Qwen3-VL"):
        configure(default_config(**{"model.checkpoint": "tiny-qwen3vl", "vision.sizes": ["224x224"],
                                    "vision.dynamic.parity_cases": [["224x224"]], "vision.uint8.sizes": [],
                                    "vision.video.sizes": [], "text.parity.video_cases": []}))
    with pytest.raises(ConfigError, match="text.parity.video_cases: .*Qwen3-VL"):
        configure(default_config(**{"model.checkpoint": "tiny-qwen3vl", "vision.sizes": ["224x224"],
                                    "vision.dynamic.parity_cases": [["224x224"]], "vision.uint8.sizes": [],
                                    "vision.video.sizes": [], "deploy.enabled": False}))
    with pytest.raises(ConfigError, match="outlier.site: 'mlp' needs Qwen2.5-VL"):
        configure(default_config(**{"model.checkpoint": "tiny-qwen2vl", "model.tiny.outlier.site": "mlp",
                                    "deploy.enabled": False}))


def test_family_configs_plan_their_presets():
    import yaml

    from vlsens.dag.plan import configure

    for preset in ("tiny-qwen2vl", "tiny-qwen3vl"):
        overlay = yaml.safe_load((REPO / "config" / f"{preset}.yaml").read_text())
        cfg = default_config()
        for key, value in overlay.items():  # Snakemake's merge of --configfile onto config.yaml
            cfg[key] = _merge(cfg[key], value)
        plan, towers = configure(cfg)
        assert plan.model == preset and plan.preset == preset
        assert set(towers) == {"vision/224x224", "vision/224x224-u8", "vision/224x224-t2", "vision/dynamic", "text"}


def _merge(base, over):
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
    return over


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cpu_runs_take_no_gpu_token(tmp_path, device):
    """On a host without a GPU, jobs that run torch / ONNX Runtime must not queue for the one
    ``gpu`` token ``make run`` passes: they declare gpu=0 (a cluster submission keeps gpu=1, which
    tests/test_slurm.py checks through SLURM)."""
    import re

    from vlsens.core.device import gpu_present

    if gpu_present():
        pytest.skip("this host has a GPU: device auto takes tokens here")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(device=device)))
    r = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(tmp_path),
         "--configfile", str(cfg), "-n", "--cores", "2", "--resources", "gpu=1"],
        capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    gpus = re.findall(r"resources: .*?\bgpu=(\d+)", out)
    assert len(gpus) > 20 and set(gpus) == {"0"}, sorted(set(gpus))


def test_every_tower_reads_its_variants_from_its_own_section():
    """One config shape per tower: ``<section>.variants`` and ``<section>.sensitivity_variants``."""
    cfg = default_config(**{"vision.uint8.sizes": ["224x224"], "vision.video.sizes": ["224x224"]})
    _, towers = configure(cfg)
    sections = {"vision/224x224": "vision", "vision/dynamic": "vision.dynamic", "vision/224x224-u8": "vision.uint8",
                "text": "text", "decoder": "deploy.decoder"}
    for graph, key in sections.items():
        t = towers[graph]
        assert t.section_key == key and t.key("sensitivity_variants") == f"{key}.sensitivity_variants", graph
        node = cfg
        for part in key.split("."):
            node = node[part]
        assert t.variants() == node["variants"] and t.analysed_variants() == node["sensitivity_variants"], graph
    video = [t for t in towers.values() if t.kind == "vision_video"]
    assert video and all(t.section_key == "vision.video" and t.variants() == cfg["vision"]["video"]["variants"]
                         for t in video), video


def test_old_keys_fail_in_the_library_too():
    cfg = default_config()
    cfg["sensitivity"]["variants"] = ["fp32"]
    with pytest.raises(ConfigError, match=r"sensitivity\.variants: renamed to vision\.sensitivity_variants"):
        configure(cfg)

def test_job_cores_reserve_and_compute_threads_apart():
    """A job computes with ``threads`` whatever it reserves: ``job_cores: auto`` reserves one core
    on a tiny preset (jobs there are interpreter start-up and imports), ``threads`` elsewhere; a
    number caps the reservation. Rules carry the compute count as ``compute_threads``."""
    from vlsens.config import schema_errors
    from vlsens.dag.resources import THREADS, compute_threads, job_cores

    # threads: auto computes with one thread on a tiny preset, THREADS elsewhere; a number is itself
    assert compute_threads("auto", "tiny") == 1 and compute_threads("auto", "tiny-qwen2vl") == 1
    assert compute_threads("auto", "3b") == THREADS == 2 and compute_threads("auto", None) == 2
    assert compute_threads(3, "tiny") == 3
    assert not schema_errors(_cfg(threads="auto")) and not schema_errors(_cfg(threads=4))
    assert schema_errors(_cfg(threads=0)) and schema_errors(_cfg(threads="all"))
    assert job_cores("auto", 2, "tiny") == 1 and job_cores("auto", 2, "tiny-qwen3vl") == 1
    assert job_cores("auto", 2, "3b") == 2 and job_cores("auto", 4, None) == 4
    assert job_cores(3, 8, None) == 3 and job_cores(3, 2, None) == 2 and job_cores(4, 1, "tiny") == 1
    assert not schema_errors(_cfg(job_cores=3)) and not schema_errors(_cfg(job_cores="auto"))
    assert schema_errors(_cfg(job_cores=0)) and schema_errors(_cfg(job_cores="all"))


def test_dry_run_declares_cores_and_compute_threads(tmp_path):
    """Snakemake's plan of the default run with ``threads: 2``: every torch / ONNX Runtime job
    reserves one core and computes with two; with ``job_cores: 2`` the same jobs reserve two. The
    default (``threads: auto``) computes with one on the tiny preset."""
    import re

    for job_cores, reserved, threads_setting, compute in (("auto", {"1"}, 2, "2"), (2, {"2"}, 2, "2"),
                                                          ("auto", {"1"}, "auto", "1")):
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump(_cfg(job_cores=job_cores, threads=threads_setting)))
        r = subprocess.run(
            [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(tmp_path),
             "--configfile", str(cfg), "-n", "--cores", "2"], capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-3000:]
        threads: dict[str, list] = {}
        for block in re.split(r"\n\n", out):
            m = re.search(r"(?m)^(?:local)?rule (\w+):", block)
            c = re.search(r"compute_threads=(\d+)", block)
            if m and c:
                t = re.search(r"(?m)^    threads: (\d+)", block)
                threads.setdefault(m.group(1), []).append((c.group(1), t.group(1) if t else "1"))
        export = threads["export"]
        assert len(export) >= 5 and {c for c, _ in export} == {compute}, export
        assert {t for c, t in sum(threads.values(), []) if c == compute} == reserved, threads


def test_worked_example_config_is_valid(tiny_ckpt):
    """config/my-checkpoint.example.yaml (a real 3B checkpoint's config) builds a DAG: schema, plan,
    deploy checks; only its checkpoint path is swapped for a local one."""
    from snakemake.utils import validate

    from vlsens.deploy import check_config

    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    example = yaml.safe_load((REPO / "config" / "my-checkpoint.example.yaml").read_text())
    example["model"]["checkpoint"] = str(tiny_ckpt)

    def merge(a, b):
        for k, v in b.items():
            a[k] = merge(dict(a[k]), v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return a

    cfg = merge(base, example)
    validate(cfg, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    plan, towers = make_plan(cfg)
    check_config(cfg)
    assert plan.model == "qwen2.5-vl-3b" and "text" not in towers and "decoder" in towers
    assert towers["vision/448x448"].parts_variants() == ["fp32", "fp16", "bf16"]


def test_text_exporter_auto_is_legacy_when_small_and_dynamo_at_full_depth(tiny_ckpt):
    """text.exporter: auto (the default) picks the exporter by the language model's FP32 size,
    when the DAG is built: the legacy one would hold the whole 36-layer 3B proto in memory."""
    from conftest import tower_of

    from vlsens.dag.plan import lm_fp32_bytes

    def pick(**changes):
        return tower_of("text", **changes).export_settings()["exporter"], lm_fp32_bytes(default_config(**changes))

    assert pick()[0] == "legacy"
    assert pick(**{"model.checkpoint": str(tiny_ckpt)})[0] == "legacy"
    exp, size = pick(**{"model.checkpoint": "3b", "model.3b": {"seed": 0, "text_layers": 36}})
    assert exp == "dynamo" and abs(size - 12.34e9) < 0.01e9  # the measured 36-layer FP32 export: 12.34 GB
    assert pick(**{"model.checkpoint": "3b", "model.3b": {"seed": 0, "text_layers": 2}})[0] == "legacy"
    assert pick(**{"text.exporter": "legacy", "model.checkpoint": "3b",
                   "model.3b": {"seed": 0, "text_layers": 36}})[0] == "legacy"  # an explicit choice stands
    _, towers = make_plan(default_config())  # the DAG's towers get the model's facts
    assert towers["text"].export_settings()["exporter"] == "legacy"


@pytest.mark.parametrize("changes, error", [
    ({"profile__target": 0}, "profile.target: 0 is less than or equal to the minimum of 0"),
    ({"profile__target": -0.5}, "profile.target: -0.5 is less than or equal to the minimum of 0"),
    ({"profile__target": 1.5}, "profile.target: 1.5 is greater than the maximum of 1"),  # cosine: a share
    ({"text__profile__target": 0}, "text.profile.target: 0 is less than or equal to the minimum of 0"),
    ({"text__profile__metric": "top1", "text__profile__target": 1.2},
     "text.profile.target: 1.2 is greater than the maximum of 1"),
])
def test_a_profile_target_no_profile_can_meet_is_refused_by_metric(changes, error):
    """A profile target of 0 or below, or a cosine / top-1 target above 1, fails the DAG build
    with the key; the same number is valid where the metric allows it."""
    from vlsens.config import schema_errors

    assert error in schema_errors(_cfg(**changes))
    assert not schema_errors(_cfg(profile__metric="sqnr_db", profile__target=30))
    assert not schema_errors(_cfg(text__profile__target=5))  # KL: no upper bound


def test_an_image_size_whose_attention_outgrows_memory_is_refused_at_dag_build():
    """A valid but absurd size (9996x9996) is refused when the DAG is built, with the estimate and
    the limit, where a job would die of memory; the limit is the larger of this machine's memory
    and the largest cluster.mem_mb. The formula: heads x patches² x 4 bytes (Qwen2.5-VL-3B at 448²:
    16 x 1024² x 4 = 64 MiB; at 2016²: 25.6 GiB)."""
    from vlsens.dag.plan import attention_bytes, check_size_memory, memory_limit
    from vlsens.model.presets.tables import REAL_3B_VISION

    assert attention_bytes(448, 448, REAL_3B_VISION) == 16 * 1024**2 * 4
    with pytest.raises(ConfigError, match=r"vision.sizes\[1\]: 9996x9996 needs about [0-9,]+ GiB .* more than the"):
        make_plan(_cfg(vision__sizes=["224x224", "9996x9996"]))
    with pytest.raises(ConfigError, match=r"deploy.measure.sizes\[0\]: 2016x2016 needs about 26 GiB"):
        check_size_memory(_cfg(model__checkpoint="3b", deploy__measure__sizes=["2016x2016"]), limit=24 * 2**30)
    check_size_memory(_cfg(model__checkpoint="3b", vision__sizes=["1344x1344"]), limit=24 * 2**30)  # 5 GiB: fine
    big = _cfg(cluster__mem_mb={"default": 8000, "export": {"default": 8000, "vision": 10**7}})
    assert memory_limit(big) == max(memory_limit(_cfg()), 10**7 * 2**20)  # a cluster node may hold more


def test_a_results_folder_that_cannot_be_written_is_one_error(tmp_path):
    """When results/ cannot be written (a read-only file system, permissions, or as here a file in
    its place) the DAG build says so in one line naming the folder, not with a Python traceback."""
    (tmp_path / "results").write_text("a file where the results folder would be\n")
    r = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(tmp_path),
                        "-n", "--cores", "1"], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and f"cannot write the run's input manifests under {tmp_path / 'results'}" in out, out[-3000:]
    assert "Traceback" not in out


def test_a_manifest_os_error_names_an_unreadable_input_or_the_results_folder(tmp_path):
    from vlsens.data.inputs import os_error_message

    results = tmp_path / "results"
    gone = OSError(2, "No such file or directory", str(tmp_path / "ckpt" / "model.safetensors"))
    assert os_error_message(gone, results).startswith(f"cannot read {tmp_path}/ckpt/model.safetensors: No such file")
    ro = OSError(30, "Read-only file system", str(results / "tiny" / "inputs" / "checkpoint.json"))
    assert os_error_message(ro, results).startswith(f"cannot write the run's input manifests under {results}: "
                                                    "Read-only file system")
