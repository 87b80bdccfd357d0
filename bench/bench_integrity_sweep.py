#!/usr/bin/env python
"""A tamper-and-fault sweep over a finished run, tried as a careful user would: files edited with
their mtime kept, deleted, added, swapped and truncated; copied deploy folders loaded by
``runtime.Chat`` with damaged files and odd images; bad config values, checkpoints, prompt files
and image folders; a run interrupted half-way. Each case is tried on a fresh copy of the run.

    python bench/bench_integrity_sweep.py [--results results/held-out --config config/held-out.yaml]

The run must be complete and current (``make run CONFIG=config/held-out.yaml``): the script first
checks that Snakemake has nothing to do on the copy. Each case states what a user must get:

- ``refuse``: a non-zero exit and one line naming the file (or the config key) that is wrong;
  a Python traceback on the console is a failure, so is exit 0 (a *silent* failure);
- ``answer``: the command does its job (exit 0) and the run's records stay valid.

Whatever the case, a process killed by a signal or still running after its time limit is a
failure (nothing may kill or hang the caller). The table is written to
``docs/benchmarks/integrity-sweep.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass
class Case:
    name: str
    what: str
    expect: str  # refuse | answer
    names: tuple[str, ...] = ()  # one of these must be on the refusal's line
    outcome: str = ""
    line: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- helpers


def keep_mtime(path: Path, change) -> None:
    """``change(path)`` with the file's modification time put back (``cp -p``, ``rsync -t``)."""
    st = path.stat()
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def edit_text(path: Path, old: str, new: str) -> None:
    s = path.read_text()
    if old not in s:
        raise SystemExit(f"{path}: {old!r} not found (the case is out of date)")
    path.write_text(s.replace(old, new, 1))


def smk(work: Path, config: Path, *args: str, timeout: int = 600, extra_config: Path | None = None,
        interrupt_when=None) -> tuple[int | None, str]:
    cmd = [PY, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-d", str(work), "--cores", "2",
           "--configfile", str(config), *([str(extra_config)] if extra_config else []), *args]
    return run(cmd, timeout, interrupt_when=interrupt_when)


def run(cmd: list[str], timeout: int, cwd: Path | None = None, interrupt_when=None) -> tuple[int | None, str]:
    """(exit code, or None when it ran past ``timeout``; negative: killed by that signal), output.
    ``interrupt_when``: a function polled every 0.1 s; when it returns true, Ctrl-C is sent (SIGINT
    to the whole process group, as a terminal does)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    with tempfile.TemporaryFile("w+") as buf:
        # Ctrl-C as at a terminal: a command started in the background inherits SIGINT ignored
        p = subprocess.Popen(cmd, stdout=buf, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env,
                             start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        t0 = time.monotonic()
        while p.poll() is None:
            if time.monotonic() - t0 > timeout:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                buf.seek(0)
                return None, buf.read()
            if interrupt_when is not None and interrupt_when():
                os.killpg(p.pid, signal.SIGINT)
                interrupt_when = None
            time.sleep(0.1)
        buf.seek(0)
        return p.returncode, buf.read()


CHAT = """
import sys
from vlsens.core.errors import VlsensError
from vlsens.deploy.genai.runtime import Chat
folder, images = sys.argv[1], sys.argv[2:]
try:
    chat = Chat(folder)
    print("ANSWER", repr(chat("Describe the image." if images else "Hello", images=images, max_new_tokens=4)))
except VlsensError as e:
    print(f"{type(e).__name__}: {e}")
    sys.exit(1)
"""


def chat(folder: Path, *images: Path, timeout: int = 120) -> tuple[int | None, str]:
    return run([PY, "-c", CHAT, str(folder), *map(str, images)], timeout)


def records(results: Path) -> tuple[int | None, str]:
    return run([PY, "-m", "vlsens.core.records", str(results)], 300)


def judge(case: Case, rc: int | None, out: str) -> None:
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if rc is None:
        case.outcome = "HANG"
    elif rc < 0:
        case.outcome = f"KILLED (signal {-rc})"
    elif "Traceback (most recent call last)" in out:
        case.outcome = "TRACEBACK"
        case.line = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")
    elif case.expect == "answer":
        case.outcome = "answered" if rc == 0 else "FAILED"
        marks = ("ANSWER", "back in place", "no plan meets", "Nothing to be done", "all valid")
        case.line = next((ln for m in marks for ln in lines if m in ln), lines[-1] if lines else "")
        if rc != 0:
            case.line = _error_line(lines) or case.line
    elif rc == 0:
        case.outcome = "SILENT"
        case.line = lines[-1] if lines else ""
    else:
        err = _error_line(lines, case.names)
        case.line = err or (_error_line(lines) or (lines[-1] if lines else ""))
        case.outcome = "refused" if err else "REFUSED, NAMING NOTHING"


def _error_line(lines: list[str], names: tuple[str, ...] = ()) -> str:
    marks = ("vlsens", "Error", "error", "invalid", "refus", "missing", "changed", "damaged")
    for ln in lines:
        if any(m in ln for m in marks) and (not names or any(n in ln for n in names)):
            return ln
    return ""


# ----------------------------------------------------------------------------- the cases


def image_files(d: Path) -> dict[str, Path]:
    """Odd but honest image files, and files that are no images."""
    from PIL import Image

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (200, 260, 3), dtype=np.uint8))
    out = {}
    rgb.save(out.setdefault("webp", d / "photo.webp"))
    rgb.save(out.setdefault("tiff", d / "photo.tiff"))
    rgb.convert("CMYK").save(out.setdefault("cmyk", d / "cmyk.jpg"))
    Image.fromarray((rng.random((200, 260)) * 65535).astype(np.uint16)).save(out.setdefault("gray16", d / "g16.png"))
    frames = [Image.fromarray(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)) for _ in range(2)]
    frames[0].save(out.setdefault("gif", d / "anim.gif"), save_all=True, append_images=frames[1:])
    rgb.convert("RGBA").save(out.setdefault("rgba", d / "alpha.png"))
    Image.new("RGB", (1, 1)).save(out.setdefault("tiny", d / "one-pixel.png"))
    Image.new("RGB", (2000, 20)).save(out.setdefault("strip", d / "strip.png"))
    (out.setdefault("empty", d / "empty.jpg")).write_bytes(b"")
    (out.setdefault("html", d / "page.jpg")).write_text("<html><body>not an image</body></html>")
    # a PNG whose header claims 40000 x 40000 pixels (a decompression bomb), with one row of data
    buf = io.BytesIO()
    Image.new("L", (40000, 1)).save(buf, format="PNG")
    raw = bytearray(buf.getvalue())
    raw[20:24] = (40000).to_bytes(4, "big")  # IHDR height
    import zlib

    raw[29:33] = zlib.crc32(bytes(raw[12:29])).to_bytes(4, "big")
    (out.setdefault("bomb", d / "bomb.png")).write_bytes(bytes(raw))
    d.joinpath("folder.png").mkdir(exist_ok=True)
    out["dir"] = d / "folder.png"
    return out


def cases(base: Path, results_name: str, config: Path, scratch: Path) -> list[tuple[Case, object]]:
    """``(case, action)``: ``action(work, results, case)`` returns (exit code, output)."""
    out: list[tuple[Case, object]] = []

    def add(name, what, expect, names=()):
        def deco(fn):
            out.append((Case(name, what, expect, tuple(names)), fn))
            return fn
        return deco

    dry = ("-n", "--quiet", "rules")

    # --- outputs of earlier jobs changed; the next run is planned -------------------------------
    @add("o1", "budget/vision.csv: one KL edited, mtime kept; the run planned", "refuse", ["vision.csv"])
    def _(w, r, c):
        keep_mtime(r / "budget" / "vision.csv", lambda p: p.write_text(p.read_text().replace("e-0", "e-1", 1)))
        return smk(w, config, *dry)

    @add("o2", "budget/front.json: one plan's bytes edited, mtime kept; the run planned", "refuse", ["front.json"])
    def _(w, r, c):
        def ch(p):
            d = json.loads(p.read_text())
            s = json.dumps(d)
            i = s.index('"bytes": ') + 9
            p.write_text(s[:i] + "1" + s[i:])
        keep_mtime(r / "budget" / "front.json", ch)
        return smk(w, config, *dry)

    @add("o3", "deploy/plan-p3/plan.yaml: one op's width edited, mtime kept; the run planned", "refuse",
         ["plan.yaml"])
    def _(w, r, c):
        keep_mtime(r / "deploy" / "plan-p3" / "plan.yaml",
                   lambda p: p.write_text(p.read_text().replace(": 4\n", ": 8\n", 1)))
        return smk(w, config, *dry)

    @add("o4", "deploy/plan-p3/genai_config.json: a CUDA provider added, mtime kept; the run planned", "refuse",
         ["genai_config.json"])
    def _(w, r, c):
        keep_mtime(r / "deploy" / "plan-p3" / "genai_config.json",
                   lambda p: edit_text(p, '"provider_options": []', '"provider_options": [{"cuda": {}}]'))
        return smk(w, config, *dry)

    @add("o5", "a README.md added into deploy/int4-mixed/; the run planned", "refuse", ["README.md"])
    def _(w, r, c):
        (r / "deploy" / "int4-mixed" / "README.md").write_text("my notes\n")
        return smk(w, config, *dry)

    @add("o6", "deploy/int4-mixed/tokenizer.json deleted; the run planned", "refuse", ["tokenizer.json"])
    def _(w, r, c):
        (r / "deploy" / "int4-mixed" / "tokenizer.json").unlink()
        return smk(w, config, *dry)

    @add("o7", "calib/decoder/eval.npz: its rows permuted (a valid file, same keys), mtime kept; the run planned",
         "refuse", ["eval.npz"])
    def _(w, r, c):
        def ch(p):
            with np.load(p) as z:
                arrays = {k: z[k] for k in z.files}
            arrays = {k: (v[::-1].copy() if v.ndim else v) for k, v in arrays.items()}
            with open(p, "wb") as f:
                np.savez(f, **arrays)
        keep_mtime(r / "calib" / "decoder" / "eval.npz", ch)
        return smk(w, config, *dry)

    @add("o8", "report/latency.png: cut in half, mtime kept; the run planned", "refuse", ["latency.png"])
    def _(w, r, c):
        keep_mtime(r / "report" / "latency.png", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]))
        return smk(w, config, *dry)

    @add("o9", "the record of budget/vision.csv cut (not JSON); the run planned", "refuse", ["vision.csv"])
    def _(w, r, c):
        rp = r / "budget" / ".vlsens" / "vision.csv.json"
        rp.write_text(rp.read_text()[:40])
        return smk(w, config, *dry)

    @add("o10", "deploy/plan-p3 replaced by a copy of plan-p2 (cp -a: mtimes kept); the run planned", "refuse",
         ["plan-p3"])
    def _(w, r, c):
        shutil.rmtree(r / "deploy" / "plan-p3")
        shutil.copytree(r / "deploy" / "plan-p2", r / "deploy" / "plan-p3", copy_function=shutil.copy2)
        return smk(w, config, *dry)

    @add("o11", "budget/decoder.npz cut, newer mtime; the run started (its readers re-run)", "refuse",
         ["decoder.npz"])
    def _(w, r, c):
        p = r / "budget" / "decoder.npz"
        p.write_bytes(p.read_bytes()[:1000])
        return smk(w, config, timeout=900)

    @add("o12", "measure/compare.json: a KL edited (newer mtime); vlsens records", "refuse", ["compare.json"])
    def _(w, r, c):
        p = r / "measure" / "compare.json"
        p.write_text(p.read_text().replace("e-0", "e-1", 1))
        return records(r)

    @add("o13", "a file chmod-ed, a folder copied away and back (cp -a; content unchanged); the run planned, records",
         "answer")
    def _(w, r, c):
        os.chmod(r / "budget" / "vision.csv", 0o644)  # a new ctime, the same content
        d = r / "deploy" / "int4-rtn"
        shutil.copytree(d, w / "aside", copy_function=shutil.copy2)
        shutil.rmtree(d)
        shutil.copytree(w / "aside", d, copy_function=shutil.copy2)
        rc, o = smk(w, config, "-n")
        if rc != 0 or "Nothing to be done" not in o:
            return rc if rc else 1, o
        rc2, o2 = records(r)
        return rc2, o + o2

    # --- a deploy folder copied out of results/, loaded by Chat ------------------------------------
    def copied(r, w, name="plan-p3"):
        dst = w / "shipped" / name
        shutil.copytree(r / "deploy" / name, dst)
        return dst

    @add("c1", "copied folder: genai_config.json edited (a CUDA provider); Chat loads it", "refuse",
         ["genai_config.json"])
    def _(w, r, c):
        f = copied(r, w)
        edit_text(f / "genai_config.json", '"provider_options": []', '"provider_options": [{"cuda": {}}]')
        return chat(f)

    @add("c2", "copied folder: tokenizer.json cut; Chat loads it", "refuse", ["tokenizer.json"])
    def _(w, r, c):
        f = copied(r, w)
        p = f / "tokenizer.json"
        p.write_bytes(p.read_bytes()[:5000])
        return chat(f)

    @add("c3", "copied folder: chat_template.jinja edited; Chat loads it", "refuse", ["chat_template.jinja"])
    def _(w, r, c):
        f = copied(r, w)
        p = f / "chat_template.jinja"
        p.write_text(p.read_text() + "{# a line added #}\n")
        return chat(f)

    @add("c4", "copied folder: vision.onnx.data taken from another plan's folder; Chat loads it", "refuse",
         ["vision.onnx.data"])
    def _(w, r, c):
        f = copied(r, w, "plan-p7")
        shutil.copyfile(r / "deploy" / "plan-p1" / "vision.onnx.data", f / "vision.onnx.data")
        return chat(f)

    @add("c5", "copied folder without eval.json, decoder.onnx.data zeroed; Chat loads it", "refuse",
         ["decoder.onnx.data"])
    def _(w, r, c):
        f = copied(r, w)
        (f / "eval.json").unlink()
        p = f / "decoder.onnx.data"
        p.write_bytes(bytes(p.stat().st_size))
        return chat(f)

    @add("c6", "Chat on a folder that does not exist", "refuse", ["no-such-folder"])
    def _(w, r, c):
        return chat(w / "no-such-folder")

    @add("c7", "Chat on a file (genai_config.json) instead of its folder", "refuse", ["genai_config.json"])
    def _(w, r, c):
        return chat(r / "deploy" / "plan-p3" / "genai_config.json")

    @add("c8", "Chat on a folder without genai_config.json (copied, file removed)", "refuse", ["genai_config.json"])
    def _(w, r, c):
        f = copied(r, w)
        (f / "genai_config.json").unlink()
        return chat(f)

    for key, what, expect, names in (
        ("dir", "a folder named folder.png", "refuse", ["folder.png"]),
        ("tiny", "a 1x1 PNG (transformers' processor scales it up)", "answer", []),
        ("empty", "an empty .jpg", "refuse", ["empty.jpg"]),
        ("html", "an HTML page named .jpg", "refuse", ["page.jpg"]),
        ("bomb", "a PNG whose header claims 40000x40000 pixels", "refuse", ["bomb.png"]),
        ("strip", "a 2000x20 strip (100:1; transformers takes up to 200:1)", "answer", []),
        ("webp", "a WebP photo", "answer", []),
        ("tiff", "a TIFF photo", "answer", []),
        ("cmyk", "a CMYK JPEG", "answer", []),
        ("gray16", "a 16-bit grayscale PNG", "answer", []),
        ("gif", "an animated GIF (2 frames)", "answer", []),
        ("rgba", "an RGBA PNG", "answer", []),
    ):
        def make(key=key):
            def action(w, r, c):
                imgs = image_files(w / "images")
                return chat(r / "deploy" / "int4-mixed", imgs[key])
            return action
        out.append((Case(f"i-{key}", f"Chat, one image: {what}", expect, tuple(names)), make()))

    # --- the config a user writes ---------------------------------------------------------------
    def with_config(w, text: str, *args):
        extra = w / "extra.yaml"
        extra.write_text(text)
        return smk(w, config, *(args or dry), extra_config=extra)

    for name, what, text, names in (
        ("k1", "plan.budgets: a folder of 0 bytes", "plan:\n  budgets: [{name: small, bytes: 0}]\n",
         ["plan", "bytes"]),
        ("k2", "plan.budgets: two budgets with the same name",
         "plan:\n  budgets: [{name: small, bytes: 900000}, {name: small, kl: 0.01}]\n", ["small"]),
        ("k3", "plan.budgets: a name the front's own folders use (p3)",
         "plan:\n  budgets: [{name: p3, bytes: 900000}]\n", ["p3"]),
        ("k4", "plan.budgets: bytes and kl in one budget",
         "plan:\n  budgets: [{name: small, bytes: 900000, kl: 0.01}]\n", ["budgets"]),
        ("k5", "plan.vision: [mixed] without the formats it is made of",
         "plan:\n  vision: [mixed]\n", ["mixed", "plan.vision"]),
        ("k6", "plan.points: 1", "plan:\n  points: 1\n", ["points"]),
        ("k7", "deploy.max_new_tokens: 0", "deploy:\n  max_new_tokens: 0\n", ["max_new_tokens"]),
        ("k9", "calibration.images: an empty folder", "calibration:\n  images: {empty}\n", ["images", "empty"]),
        ("k10", "threads: 0", "threads: 0\n", ["threads"]),
    ):
        def make(text=text):
            def action(w, r, c):
                (w / "empty").mkdir(exist_ok=True)
                return with_config(w, text.replace("{empty}", str(w / "empty")))
            return action
        out.append((Case(name, what, "refuse", tuple(names)), make()))

    @add("k8", "plan.budgets: bits_per_weight 0.5 (below the smallest plan); the search run (--until budget_front)",
         "answer")
    def _(w, r, c):
        rc, o = with_config(w, "plan:\n  budgets: [{name: tiny, bits_per_weight: 0.5}]\n", "--forcerun", "budget_front",
                            "--until", "budget_front")
        said = [ln for ln in o.splitlines() if "no plan meets it" in ln]
        return (rc, "\n".join(said) or o) if said or rc else (1, o + "\nvlsens sweep: no warning on the console")

    # --- a user's checkpoint and inputs ---------------------------------------------------------
    def user_checkpoint(w, r):
        ck = w / "mine"
        shutil.copytree(r / "checkpoint", ck)
        return ck

    def with_checkpoint(w, ck):
        return with_config(w, f"model:\n  checkpoint: {ck}\n  name: mine\n")

    for name, what, change, names in (
        ("h1", "checkpoint: tokenizer.json not JSON", lambda ck: (ck / "tokenizer.json").write_text("{oops"),
         ["tokenizer.json"]),
        ("h2", "checkpoint: preprocessor_config.json removed", lambda ck: (ck / "preprocessor_config.json").unlink(),
         ["preprocessor_config.json"]),
        ("h3", "checkpoint: model.safetensors a dangling symlink",
         lambda ck: ((ck / "model.safetensors").unlink(), (ck / "model.safetensors").symlink_to(ck / "gone")),
         ["model.safetensors"]),
        ("h4", "checkpoint: vision hidden_size not divisible by its heads",
         lambda ck: _config_edit(ck, ("vision_config", "num_heads"), 7), ["num_heads", "hidden_size"]),
        ("h5", "checkpoint: text vocab_size smaller than the tokenizer's ids",
         lambda ck: _config_edit(ck, ("vocab_size",), 100), ["vocab_size"]),
        ("h6", "checkpoint: image_token_id outside the vocabulary",
         lambda ck: _config_edit(ck, ("image_token_id",), 10 ** 7), ["image_token_id"]),
    ):
        def make(change=change):
            def action(w, r, c):
                ck = user_checkpoint(w, r)
                change(ck)
                return with_checkpoint(w, ck)
            return action
        out.append((Case(name, what, "refuse", tuple(names)), make()))

    def prompts_case(lines: list[str]):
        def action(w, r, c):
            p = w / "prompts.jsonl"
            p.write_text("".join(ln + "\n" for ln in lines))
            return with_config(w, f"text:\n  calibration:\n    prompts: {p}\n")
        return action

    img = str(REPO / "tests")  # any folder: the image paths below do not exist in it
    for name, what, lines, names in (
        ("p1", "prompt file: an image that does not exist",
         [json.dumps({"image": f"{img}/nope.png", "prompt": "What is this?"})] * 12, ["nope.png"]),
        ("p2", "prompt file: empty", [], ["prompts.jsonl"]),
        ("p3", "prompt file: a prompt that is an empty string", [json.dumps({"image": None, "prompt": ""})] * 12,
         ["prompts.jsonl"]),
        ("p4", "prompt file: a line that is a JSON list", ["[1, 2]"] * 12, ["prompts.jsonl"]),
    ):
        out.append((Case(name, what, "refuse", tuple(names)), prompts_case(lines)))

    @add("g1", "calibration images: a folder with a text file named .png among photos", "refuse", ["notes.png"])
    def _(w, r, c):
        from PIL import Image
        from skimage import data

        d = w / "photos"
        d.mkdir()
        for n in ("astronaut", "coffee", "chelsea", "rocket"):
            Image.fromarray(getattr(data, n)()).save(d / f"{n}.png")
        (d / "notes.png").write_text("shopping list\n")
        return with_config(w, f"calibration:\n  images: {d}\n  num_calib: 2\n  num_eval: 1\n")

    # --- faults ---------------------------------------------------------------------------------
    @add("f1", "Ctrl-C while the run rebuilds deploy/plan-p3 (--forcerun); then the run planned again", "answer")
    def _(w, r, c):
        folder = r / "deploy" / "plan-p3"
        log = r / "logs" / "deploy" / "deploy-plan-p3.log"
        log.unlink(missing_ok=True)

        kept = r / "deploy" / ".vlsens" / "previous" / "plan-p3"

        def started():  # the run moved the old folder aside, its job started and has not finished
            return kept.exists() and log.is_file()
        rc, o = smk(w, config, "--forcerun", str(folder.relative_to(w)), interrupt_when=started)
        if rc == 0:
            return 1, o + "\nvlsens sweep: the run was not interrupted (it ended first)"
        problems = []
        if not folder.is_dir() or not (r / "deploy" / ".vlsens" / "plan-p3.json").is_file():
            problems.append(f"{folder} or its record is missing after the interrupt")
        rc2, o2 = smk(w, config, "-n", "--quiet", "rules")
        if rc2 != 0 or "plan_folder" not in o2:
            problems.append("the interrupted job is not planned again")
        rc3, o3 = records(r)
        if rc3 != 0:
            problems.append("vlsens records finds a problem")
        said = [ln for ln in o.splitlines() if "previous version is back in place" in ln or "interrupted" in ln]
        return (1 if problems else 0), "\n".join(said + [f"vlsens sweep: {p}" for p in problems]) + "\n" + o2[-500:] + o3

    return out


def _config_edit(ck: Path, keys: tuple[str, ...], value) -> None:
    p = ck / "config.json"
    d = json.loads(p.read_text())
    node = d
    for k in keys[:-1]:
        node = node[k]
    if keys[-1] not in node and "text_config" in d and keys[-1] in d["text_config"]:
        node = d["text_config"]
    node[keys[-1]] = value
    if keys == ("vocab_size",) and "text_config" in d:
        d["text_config"]["vocab_size"] = value
        d["vocab_size"] = value
    p.write_text(json.dumps(d, indent=2))


# ----------------------------------------------------------------------------- main


def main(results: Path, config: Path, only: list[str]) -> int:
    results, config = results.resolve(), config.resolve()
    with tempfile.TemporaryDirectory(prefix="vlsens-sweep-") as tmp:
        base = Path(tmp) / "base"
        shutil.copytree(results, base / "results" / results.name, symlinks=True, copy_function=shutil.copy2)
        rc, o = smk(base, config, "-n")
        if rc != 0 or "Nothing to be done" not in o:
            print(o[-3000:], file=sys.stderr)
            raise SystemExit(f"{results}: the run is not complete and current; run it first "
                             f"(make run CONFIG={config.relative_to(REPO) if config.is_relative_to(REPO) else config})")
        todo = [(c, fn) for c, fn in cases(base, results.name, config, Path(tmp)) if not only or c.name in only]
        for case, action in todo:
            work = Path(tmp) / case.name
            shutil.copytree(base, work, symlinks=True, copy_function=shutil.copy2)
            t = time.perf_counter()
            try:
                rc, out = action(work, work / "results" / results.name, case)
            except subprocess.TimeoutExpired:
                rc, out = None, ""
            case.seconds = time.perf_counter() - t
            judge(case, rc, out)
            print(f"{case.name:7} {case.outcome:26} {case.seconds:6.1f} s  {case.line[:150]}", file=sys.stderr)
            if case.outcome not in ("refused", "answered"):
                print("    " + "\n    ".join((out or "")[-int(os.environ.get("SWEEP_SHOW", 3000)):].splitlines()),
                      file=sys.stderr)
            shutil.rmtree(work, ignore_errors=True)
    ok = {"refused", "answered"}
    bad = [c for c, _ in todo if c.outcome not in ok]
    print(f"{len(todo)} cases on a copy of {results.name} (one fresh copy each).\n")
    print("| case | what was done | a user must get | what happened | the line a user sees |")
    print("| --- | --- | --- | --- | --- |")
    for c, _ in todo:
        line = c.line.replace("|", "\\|")
        line = line if len(line) <= 220 else line[:217] + "..."
        print(f"| {c.name} | {c.what} | {c.expect} | {c.outcome} | {line} |")
    counts = {k: sum(c.outcome.startswith(k) for c, _ in todo)
              for k in ("refused", "answered", "SILENT", "TRACEBACK", "KILLED", "HANG", "REFUSED, NAMING", "FAILED")}
    print("\n" + ", ".join(f"{k.lower()}: {v}" for k, v in counts.items()) + ".")
    print(f"Goal: 0 silent, 0 killed or hanging, every refusal one line naming the file or key: "
          f"{'met' if not bad else 'not met (' + ', '.join(c.name for c in bad) + ')'}.")
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=REPO / "results" / "held-out")
    ap.add_argument("--config", type=Path, default=REPO / "config" / "held-out.yaml")
    ap.add_argument("--only", nargs="*", default=[], help="case names to run (default: all)")
    ap.add_argument("--no-publish", action="store_true", help="print only (a partial sweep)")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if a.no_publish or a.only:
        sys.exit(main(a.results, a.config, a.only))
    from _publish import published

    with published("integrity-sweep", "A tamper-and-fault sweep"):
        status = main(a.results, a.config, a.only)
    sys.exit(status)
