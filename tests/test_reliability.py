"""Nothing wrong may pass silently: each case that once said "done" and was wrong, through the CLI.

One small DAG (a local checkpoint, one size, fp32 + fp16, engine ort, no text or dynamic graph)
is run once; its first attempt is killed half-way through publishing the FP16 model. The tests
below then break it in the ways users did and check that vlsens notices, says what to do, and
recovers. The numbers in the test names are the cases of docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import PLANT, REPO, default_config

SIZE = "224x224"
pytestmark = pytest.mark.slow


def smk(workdir, *args, env=None, configfile="config.yaml", timeout=900):
    """Snakemake's CLI under umask 022 (as on a shared cluster file system)."""
    full = dict(os.environ)
    full.pop("VLSENS_FAULT", None)
    full.update(env or {})
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(workdir / configfile), "--cores", "2", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full,
                       preexec_fn=lambda: os.umask(0o022))
    r.out = r.stdout + r.stderr
    return r


def small_config(checkpoint, **changes) -> dict:
    """One size, fp32 + fp16, engine ort, no text, uint8, video-step or dynamic graph or deploy folders;
    ``changes`` as dotted keys."""
    return default_config(**{"model.checkpoint": str(checkpoint), "vision.sizes": [SIZE],
                             "vision.variants": ["fp32", "fp16"], "vision.dynamic.enabled": False,
                             "vision.uint8.sizes": [], "vision.video.sizes": [],
                             "text.enabled": False, "deploy.enabled": False, "vision.sensitivity_variants": ["fp32"],
                             "sensitivity.shards": 1,
                             **changes})


def write_config(workdir, cfg, name="config.yaml"):
    (workdir / name).write_text(yaml.safe_dump(cfg, sort_keys=False))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Two local checkpoints of the same architecture (seeds 0 and 1)."""
    from vlsens.model.presets.build import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("ckpts")
    return (build_tiny_checkpoint(root / "a", seed=0, outlier=PLANT),
            build_tiny_checkpoint(root / "b", seed=1, outlier=PLANT))


@pytest.fixture(scope="module")
def run(tmp_path_factory, ckpts):
    """The small DAG: first attempt SIGKILLed while fp16 publishes, then re-run."""
    wd = tmp_path_factory.mktemp("reliability")
    ckpt = wd / "ckpt"
    shutil.copytree(ckpts[0], ckpt)
    write_config(wd, small_config(ckpt))
    killed = smk(wd, env={"VLSENS_FAULT": "fp16:publish"})
    fp16 = wd / "results" / "ckpt" / "vision" / SIZE / "fp16"
    leftovers = sorted(p.name for p in fp16.glob(".*")) if fp16.exists() else []
    again = smk(wd)
    assert again.returncode == 0, again.out[-4000:]
    return {"wd": wd, "ckpt": ckpt, "killed": killed, "leftovers": leftovers, "again": again,
            "results": wd / "results" / "ckpt"}


def test_7_killed_job_leaves_nothing_that_breaks_the_rerun(run):
    killed = run["killed"]
    assert killed.returncode != 0 and "rule fp16" in killed.out
    assert "-9" in killed.out or "SIGKILL" in killed.out or "signal 9" in killed.out.lower(), killed.out[-3000:]
    assert any(n.startswith(".model.onnx.staging-") for n in run["leftovers"]), run["leftovers"]
    res = run["results"]
    assert "removed" in (res / "logs" / "vision" / SIZE / "fp16.log").read_text()  # the leftover, at start
    assert not [p for p in res.rglob("*") if ".staging-" in p.name or ".tmp-" in p.name]
    for p in res.rglob("*.data"):  # never a hard link into published data
        assert p.stat().st_nlink == 1, p
    for v in ("fp32", "fp16"):
        assert json.loads((res / "vision" / SIZE / v / "parity.json").read_text())["passed"]
    assert json.loads((res / "profile" / "vision" / SIZE / "fp32" / "eval.json").read_text())["status"] == "met"


def test_22_a_failed_job_keeps_the_previous_output_and_runs_again_next_time(run):
    from vlsens.core.fsutil import file_sha256

    wd, res = run["wd"], run["results"]
    fp16 = res / "vision" / SIZE / "fp16"
    profile = res / "profile" / "vision" / SIZE / "fp32"
    before = {p: file_sha256(p) for d in (fp16, profile) for p in d.iterdir() if p.is_file()}
    assert before
    # the FP16 job, re-run, is killed half-way through publishing; the run stops there
    failed = smk(wd, "--forcerun", str((fp16 / "model.onnx").relative_to(wd)), env={"VLSENS_FAULT": "fp16:publish"})
    assert failed.returncode != 0 and "rule fp16" in failed.out
    assert "its previous version is back in place" in failed.out, failed.out[-3000:]
    # the previous FP16 model (and every output of a job the run did not reach) is where it was, whole
    assert {p: file_sha256(p) for p in before} == before
    assert not list(res.rglob(".vlsens/previous/*"))
    records = subprocess.run([sys.executable, "-m", "vlsens.core.records", str(res)], capture_output=True, text=True)
    assert records.returncode == 0, records.stdout[-2000:]
    # dated before its inputs: the next run builds it again, and what reads it
    dry = smk(wd, "-n", "--quiet", "rules")
    assert "fp16" in dry.out and "Nothing to be done" not in dry.out, dry.out[-2000:]
    again = smk(wd)
    assert again.returncode == 0, again.out[-3000:]
    assert json.loads((fp16 / "parity.json").read_text())["passed"]
    assert "Nothing to be done" in smk(wd, "-n").out


def test_6_published_files_are_readable_by_others(run):
    private = [str(p) for p in run["results"].rglob("*")
               if stat.S_IMODE(p.stat().st_mode) & 0o044 != 0o044]
    assert not private, private[:10]
    files = [p for p in run["results"].rglob("*") if p.is_file()]
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o644}


def test_records_hold_the_sha256_of_each_onnx_file(run):
    from vlsens.core.fsutil import file_sha256

    res = run["results"]
    models = list(res.rglob("*.onnx"))
    assert len(models) >= 5
    for m in models:
        from vlsens.core.artifacts import find_record

        record_path, rec = find_record(m)
        data = m.with_name(m.name + ".data")
        if not data.exists():  # a single-file model (the NPU parts): its record says so
            assert record_path.name == "parts.json" and data.name not in rec["files"], m
        for f in (m, data) if data.exists() else (m,):
            assert rec["files"][f.name] == {"bytes": f.stat().st_size, "sha256": file_sha256(f)}, f
    # a model's digest (what keys the GPTQ store) is the same from its record as from its bytes
    from vlsens.quantize.gptq import model_digest

    m = next(p for p in models if p.with_name(p.name + ".data").exists())
    copy = Path(run["results"]).parent / "digest-copy" / m.name
    copy.parent.mkdir(exist_ok=True)
    for f in (m, m.with_name(m.name + ".data")):
        shutil.copy(f, copy.parent / f.name)
    assert model_digest(m) == model_digest(copy)
    shutil.rmtree(copy.parent)


def test_4_calibration_manifest_records_size_and_mode(run):
    man = json.loads((run["results"] / "calib" / "vision" / SIZE / "manifest.json").read_text())
    assert len(man["samples"]) >= 2, man  # calibration and evaluation images
    assert all(i["width"] >= 28 and i["height"] >= 28 and i["mode"] == "RGB" for i in man["samples"])


def test_1_unreachable_profile_is_all_float_and_said_on_the_console(run):
    wd = run["wd"]
    cfg = small_config(run["ckpt"], **{"profile.target": 1.0})  # no INT8 op keeps the cosine at 1
    write_config(wd, cfg, "unreachable.yaml")
    r = smk(wd, configfile="unreachable.yaml")
    assert r.returncode == 0, r.out[-3000:]
    warn = [line for line in r.out.splitlines() if line.startswith("vlsens WARNING [profile]")]
    assert warn and "unreachable" in warn[0], r.out[-3000:]
    prof = run["results"] / "profile" / "vision" / SIZE / "fp32"
    ev = json.loads((prof / "eval.json").read_text())
    assert ev["status"] == "unreachable" and ev["int8_ops"] == 0
    import onnx

    ops = [n.op_type for n in onnx.load(str(prof / "model.onnx"), load_external_data=False).graph.node]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    profile = yaml.safe_load((prof / "profile.yaml").read_text())
    assert {o["precision"] for o in profile["ops"].values()} == {"fp32"}
    cfg["profile"]["fail_if_unreachable"] = True
    write_config(wd, cfg, "strict.yaml")
    r = smk(wd, configfile="strict.yaml")
    assert r.returncode != 0 and "fail_if_unreachable is set" in r.out
    # the job wrote nothing: the previous run's profile is back in place (case 22), whole, and dated
    # before its inputs, so the next run builds it again
    assert json.loads((prof / "eval.json").read_text())["status"] == "unreachable"
    assert "profile" in smk(wd, "-n", "--quiet", "rules", configfile="strict.yaml").out
    assert smk(wd).returncode == 0  # back to the default target


def test_5_corrupted_intermediate_fails_its_consumer_with_the_fix_then_heals(run):
    wd, res = run["wd"], run["results"]
    fp32 = res / "vision" / SIZE / "fp32" / "model.onnx"
    data = fp32.with_name("model.onnx.data")
    st = data.stat()
    with open(data, "r+b") as f:
        f.truncate(st.st_size // 2)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime kept: Snakemake cannot see it
    fp16 = res / "vision" / SIZE / "fp16" / "model.onnx"
    r = smk(wd, "--forcerun", str(fp16.relative_to(wd)))
    assert r.returncode != 0
    msg = [line for line in r.out.splitlines() if "model.onnx.data" in line and "records" in line]
    assert msg and "truncated" in msg[0] and f"--forcerun {fp32.relative_to(wd)}" in msg[0], r.out[-3000:]
    r = smk(wd, "--forcerun", str(fp32.relative_to(wd)))  # the fix the message gives
    assert r.returncode == 0, r.out[-3000:]
    assert data.stat().st_size == st.st_size
    assert "Nothing to be done" in smk(wd, "-n").out


def test_8_device_cuda_without_gpu_fails_before_touching_outputs(run):
    from vlsens.core.device import cuda_visible

    if cuda_visible():
        pytest.skip("this machine has CUDA: device: cuda is valid here")
    wd = run["wd"]
    write_config(wd, small_config(run["ckpt"], device="cuda"), "cuda.yaml")
    ref = run["results"] / "vision" / SIZE / "reference.npz"
    r = smk(wd, configfile="cuda.yaml")
    assert r.returncode != 0 and "device: cuda" in r.out and "use device: auto" in r.out
    assert ref.is_file()
    # device is where a job runs, not what it computes: switching it re-runs nothing
    write_config(wd, small_config(run["ckpt"], device="cpu"), "cpu.yaml")
    assert "Nothing to be done" in smk(wd, "-n", configfile="cpu.yaml").out


def test_2_checkpoint_edited_in_place_reruns_exactly_what_reads_it(run, ckpts):
    wd, ckpt = run["wd"], run["ckpt"]
    w = ckpt / "model.safetensors"
    st = w.stat()
    os.utime(w)  # touched, content unchanged: nothing to do, and nothing re-hashed in vain
    assert "Nothing to be done" in smk(wd, "-n").out
    shutil.copyfile(ckpts[1] / "model.safetensors", w)  # other weights, same name...
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the old mtime (cp -p, rsync -t)
    r = smk(wd, "-n", "--quiet", "rules")
    assert r.returncode == 0, r.out
    for rule in ("reference", "export", "calibration", "fp16", "sensitivity_prepare", "profile"):
        assert rule in r.out, (rule, r.out)
    man = json.loads((run["results"] / "inputs" / "checkpoint.json").read_text())
    from vlsens.core.fsutil import file_sha256

    assert man["files"]["model.safetensors"]["sha256"] == file_sha256(ckpts[1] / "model.safetensors")
    shutil.copyfile(ckpts[0] / "model.safetensors", w)


def test_3_missing_tensor_is_an_error_naming_it_and_no_reference_survives(tmp_path, ckpts):
    from safetensors.numpy import load_file, save_file

    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpts[0], ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    name = next(k for k in tensors if "blocks.1.mlp.up_proj.weight" in k)
    full = dict(tensors)
    del tensors[name]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    write_config(tmp_path, small_config(ckpt))
    target = f"results/ckpt/vision/{SIZE}/reference.npz"
    r = smk(tmp_path, target)
    assert r.returncode != 0
    assert "missing keys (1): model.visual.blocks.1.mlp.up_proj.weight" in r.out, r.out[-3000:]
    assert not (tmp_path / target).exists()
    save_file(full, ckpt / "model.safetensors", metadata={"format": "pt"})  # fixed: the re-run just works
    r = smk(tmp_path, target)
    assert r.returncode == 0, r.out[-3000:]


def test_3_truncated_safetensors_fails_at_dag_build_naming_the_file(tmp_path, ckpts):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpts[0], ckpt)
    w = ckpt / "model.safetensors"
    with open(w, "r+b") as f:
        f.truncate(w.stat().st_size - 1000)
    write_config(tmp_path, small_config(ckpt))
    r = smk(tmp_path, "-n")
    assert r.returncode != 0
    assert f"'{w}' is {w.stat().st_size} bytes but its safetensors header describes" in r.out
    assert "truncated" in r.out and not (tmp_path / "results" / "ckpt" / "vision").exists()


def _png(path, array, mode=None):
    from PIL import Image

    Image.fromarray(array, mode).save(path)
    return path


def test_4_tiny_and_elongated_images_are_refused_or_warned(tmp_path, ckpts):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(10):
        _png(imgs / f"dot{i}.png", np.full((1, 1, 3), i * 20, np.uint8))
    write_config(tmp_path, small_config(ckpts[0], **{"calibration.images": str(imgs)}))
    r = smk(tmp_path, "-n")
    assert r.returncode != 0
    assert "calibration.images: '" in r.out and "is 1x1 pixels" in r.out and "image_checks.on_problem: warn" in r.out
    strip = tmp_path / "strip"
    strip.mkdir()
    _png(strip / "strip.png", np.zeros((30, 6000, 3), np.uint8))
    write_config(tmp_path, small_config(ckpts[0], **{"parity.images": str(strip), "parity.num_images": 1}))
    r = smk(tmp_path, "-n")
    assert r.returncode != 0 and "aspect ratio 200:1" in r.out and "parity.images" in r.out
    write_config(tmp_path, small_config(ckpts[0], **{"parity.images": str(strip), "parity.num_images": 1,
                                                      "image_checks.on_problem": "warn"}))
    r = smk(tmp_path, "-n")
    assert r.returncode == 0 and "aspect ratio 200:1" in r.out and "on_problem: warn" in r.out


def test_4_unreadable_calibration_image_is_named_or_skipped(tmp_path, ckpts):
    from vlsens.data.images import resolve_images

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for r in resolve_images("builtin"):
        shutil.copy(r.path, imgs / r.name)
    (imgs / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not an image")
    write_config(tmp_path, small_config(ckpts[0], **{"calibration.images": str(imgs)}))
    r = smk(tmp_path, "-n")
    assert r.returncode != 0 and "broken.png" in r.out and "calibration.skip_unreadable: true" in r.out, r.out[-2000:]
    write_config(tmp_path, small_config(ckpts[0], **{"calibration.images": str(imgs),
                                                      "calibration.skip_unreadable": True}))
    target = f"results/{ckpts[0].name}/calib/vision/{SIZE}/manifest.json"
    r = smk(tmp_path, target)
    assert r.returncode == 0 and "broken.png" in r.out and "skipped" in r.out, r.out[-3000:]
    names = {e["name"] for e in json.loads((tmp_path / target).read_text())["samples"]}
    assert "broken.png" not in names and len(names) == 9


def test_4_sixteen_bit_grayscale_is_scaled_not_clipped(tmp_path):
    from vlsens.data.images import ImageRef, header, open_rgb

    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    p = _png(tmp_path / "g16.png", ramp)
    assert header(ImageRef(p, "g16"))["mode"].startswith("I")
    rgb = np.asarray(open_rgb(ImageRef(p, "g16")))
    assert rgb.shape == (64, 64, 3)
    expect = np.round(ramp / 65535 * 255)
    assert np.abs(rgb[..., 0].astype(int) - expect).max() <= 1  # PIL's convert gives ~all 255
    assert abs(rgb.mean() - 127.5) < 1


def test_4_truncated_image_names_the_file(tmp_path):
    from vlsens.core.errors import ImageError
    from vlsens.data.images import ImageRef, open_rgb

    src = _png(tmp_path / "a.png", np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="a.png"):
        open_rgb(ImageRef(src, "a.png"))


def test_8_misspelled_key_is_named_first_with_a_suggestion(tmp_path):
    (tmp_path / "config.yaml").write_text("sensitivty:\n  shards: 2\nvision:\n  sizess: [224x224]\n")
    r = smk(tmp_path, "-n")
    assert r.returncode != 0
    lines = r.out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("invalid configuration:"))
    assert lines[i] == "invalid configuration: sensitivty: unknown key (did you mean 'sensitivity'?)"
    assert lines[i + 1] == "vision.sizess: unknown key (did you mean 'sizes'?)"
    assert len(r.out.splitlines()) < 20  # not a dump of the schema


def test_8_model_name_message_says_what_is_valid(tmp_path, ckpts):
    write_config(tmp_path, small_config(ckpts[0], **{"model.name": ".."}))
    r = smk(tmp_path, "-n")
    assert r.returncode != 0 and "model.name: '..' is not a valid folder name: it must start with a letter" in r.out


def test_9_configfile_extends_the_default_from_any_directory(tmp_path):
    (tmp_path / "config.yaml").write_text("vision:\n  sizes: [224x224]\ntext:\n  enabled: false\n")
    r = smk(tmp_path, "-n")
    assert r.returncode == 0, r.out[-2000:]
    assert "is extended by additional config" in r.out
    assert "graph=vision/224x224" in r.out and "graph=text" not in r.out and "graph=vision/224x336" not in r.out


def test_7_job_killed_mid_write_of_a_large_model_breaks_no_other_rule(tmp_path):
    """A model of real widths (Qwen2.5-VL-3B's vision blocks, two of them: 300 MB of FP32
    weights): the FP16 job is SIGKILLed with half of its data file written, as the OOM killer
    would. The other jobs of that run still finish; the re-run removes the leftover, completes,
    and leaves no link into a published data file."""
    from vlsens.model.presets.build import build_tiny_checkpoint
    from vlsens.model.presets.tables import REAL_3B_VISION

    vision = dict(REAL_3B_VISION, depth=2, fullatt_block_indexes=[1], initializer_range=0.02)
    ckpt = build_tiny_checkpoint(tmp_path / "wide", seed=0, vision=vision)
    write_config(tmp_path, small_config(ckpt, **{"vision.sensitivity_variants": [], "vision.variants": ["fp32", "fp16"]}))
    killed = smk(tmp_path, "--keep-going", env={"VLSENS_FAULT": "fp16:write"})
    res = tmp_path / "results" / "wide"
    fp16 = res / "vision" / SIZE / "fp16"
    assert killed.returncode != 0 and "rule fp16" in killed.out, killed.out[-3000:]
    errors = [line for line in killed.out.splitlines() if line.startswith("Error in rule")]
    assert errors == ["Error in rule fp16:"], errors  # nothing else failed
    staged = [p for p in fp16.glob(".model.onnx.staging-*/model.onnx.data")]
    assert staged and not (staged[0].parent / "model.onnx").exists(), staged
    half = staged[0].stat().st_size
    assert (res / "calib" / "vision" / SIZE / "manifest.json").is_file()  # the other jobs finished
    assert not (fp16 / "model.onnx").exists()
    again = smk(tmp_path)
    assert again.returncode == 0, again.out[-4000:]
    assert "removed" in (res / "logs" / "vision" / SIZE / "fp16.log").read_text()
    assert not [p for p in res.rglob("*") if ".staging-" in p.name or ".tmp-" in p.name]
    for p in res.rglob("*.data"):
        assert p.stat().st_nlink == 1, p
    assert json.loads((fp16 / "parity.json").read_text())["passed"]
    full = (fp16 / "model.onnx.data").stat().st_size
    assert full > 100e6 and 0.45 < half / full < 0.75, (half, full)  # it was killed mid-write
    assert "Nothing to be done" in smk(tmp_path, "-n").out
