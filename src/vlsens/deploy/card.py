"""A deploy folder's ``README.md``: the model card a folder ships with (Hugging Face's format: YAML
front matter, then Markdown), written by the deploy job from its own records before the folder's
file list is taken, so a copy of the folder is checked against it too.

It says where the folder comes from (the checkpoint and the SHA-256 of its files, as the run's
content manifest ``results/<model>/inputs/checkpoint.json`` holds them; a preset: its recipe), what
each graph is (the gated graph it was assembled from, a plan's file where there is one), what was
measured (the folder's own check: per case, KL per generated step and top-1 against the fp32
folder, or for the fp32 folder its tokens against transformers' ``generate``), how to run it with
onnxruntime-genai and with :class:`vlsens.deploy.genai.runtime.Chat`, and its license: the
checkpoint's own (its README's front matter, and its LICENSE file, copied beside the card).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

CARD = "README.md"
LICENSE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md")


def checkpoint_identity(checkpoint: str | Path, run_root: str | Path) -> dict:
    """Where the weights come from: a local checkpoint's files by SHA-256 (the run's content
    manifest, written when the DAG was built), digested into one hash; a vlsens preset's recipe."""
    checkpoint = Path(checkpoint)
    out = {"source": f"`{checkpoint.name}`"}
    manifest = Path(run_root) / "inputs" / "checkpoint.json"
    if manifest.is_file():
        files = json.loads(manifest.read_text())["files"]
        out.update(files=len(files), sha256=hashlib.sha256(
            "".join(f"{n}\0{f['sha256']}\n" for n, f in sorted(files.items())).encode()).hexdigest())
    preset = checkpoint / "vlsens_preset.json"
    if preset.is_file():
        out["recipe"] = json.loads(preset.read_text())
    return out


def checkpoint_license(checkpoint: str | Path) -> tuple[str, Path | None]:
    """The checkpoint's license: its README's ``license:`` front matter (else ``other``), and its
    license file where it has one."""
    checkpoint = Path(checkpoint)
    name = "other"
    readme = checkpoint / "README.md"
    if readme.is_file():
        m = re.match(r"---\n(.*?)\n---", readme.read_text(encoding="utf-8", errors="replace"), re.S)
        if m:
            found = re.search(r"^license:\s*(\S+)\s*$", m.group(1), re.M)
            name = found.group(1).strip("'\"") if found else name
    file = next((checkpoint / f for f in LICENSE_FILES if (checkpoint / f).is_file()), None)
    return name, file


def _measured(record: dict) -> list[str]:
    rows = ["| case | images | KL per generated step | top-1 | tokens |", "| --- | ---: | ---: | ---: | ---: |"]
    for c in record["cases"]:
        if "mean_kl" in c:
            rows.append(f"| {c['case']} | {len(c.get('images') or [])} | {c['mean_kl']:.3g} | "
                        f"{c['top1_agreement']:.2f} | {len(c['tokens'])} |")
        else:
            rows.append(f"| {c['case']} | {len(c.get('images') or [])} | reference | "
                        f"{'identical to transformers' if c.get('identical') else 'DIFFERS from transformers'} | "
                        f"{len(c['tokens'])} |")
    if "mean_kl" in record:
        rows.append(f"\nMean KL per generated step {record['mean_kl']:.3g}, top-1 {record['top1_agreement']:.2f}, against "
                    f"{record['reference']}.")
    else:
        rows.append(f"\nThe reference folder: its greedy tokens against {record['reference']}.")
    return rows


def _usage(folder_name: str) -> list[str]:
    return ["## Run it", "", "With onnxruntime-genai (`pip install onnxruntime-genai`):", "", "```python",
            "import json", "", "import onnxruntime_genai as og", "",
            f'model = og.Model("{folder_name}")', "processor = model.create_multimodal_processor()",
            "tokenizer = og.Tokenizer(model)",
            'messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]',
            "prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)",
            'inputs = processor(prompt, images=og.Images.open("photo.jpg"))',
            "params = og.GeneratorParams(model)",
            "# the KV cache is allocated at max_length: the folder's is its context length",
            'params.set_search_options(max_length=inputs["input_ids"].shape()[-1] + 256)',
            "generator = og.Generator(model, params)",
            "generator.set_inputs(inputs)", "stream = tokenizer.create_stream()", "while not generator.is_done():",
            "    generator.generate_next_token()",
            '    print(stream.decode(generator.get_next_tokens()[0]), end="", flush=True)',
            "```", "", "With vlsens (checks the folder against its records and every image before loading):", "",
            "```python", "from vlsens.deploy.genai.runtime import Chat", "",
            f'print(Chat("{folder_name}")("Describe this image.", images=["photo.jpg"]))', "```", ""]


def _accuracy(answers: dict | None) -> list[str]:
    """The card's first section: the folder's task accuracy per modality with its Wilson interval
    and, beside the fp32 folder's answers, its paired drop (McNemar)."""
    if not answers:
        return []
    from vlsens.deploy.accuracy import paired
    from vlsens.task.questions import MODALITIES

    own, fp32 = answers["own"], answers.get("fp32")
    pair = paired(fp32, own) if fp32 is not None and fp32["folder"] != own["folder"] else None
    rows = ["## Task accuracy", "",
            f"Greedy answers to {own['count']} evaluation questions of vlsens' visual question task "
            "(`answers.json`, through onnxruntime-genai), with the 95 % Wilson interval"
            + ("; against the fp32 folder: the paired difference in points on the same questions (McNemar's exact "
               "test: 'worse' only where it is resolved)." if pair else "."), "",
            "| questions | accuracy % | " + ("against fp32, points |" if pair else ""),
            "| --- | --- | " + ("--- |" if pair else "")]
    titles = {"text": "text", "image": "one image", "images": "two images"}
    for key, acc in [("all", own["accuracy"]), *[(m, own["modalities"][m]) for m in MODALITIES if m in own["modalities"]]]:
        cell = f"{100 * acc['accuracy']:.1f} [{100 * acc['low']:.1f}, {100 * acc['high']:.1f}]"
        if pair:
            d = pair["all"] if key == "all" else pair["modalities"][key]
            cell += (f" | {100 * d['difference']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}], "
                     f"{d['lost']} lost / {d['gained']} gained: {d['resolved']}")
        rows.append(f"| {titles.get(key, key)} ({acc['questions']}) | {cell} |")
    return rows + [""]


def write_card(folder: str | Path, name: str, record: dict, parity: dict, checkpoint: str | Path,
               run_root: str | Path, plan: bool = False, answers: dict | None = None) -> Path:
    """Write ``README.md`` (and the checkpoint's license file) into the staged ``folder``, the deploy
    folder ``name`` (its precision, or ``plan-<name>``; ``plan``: a plan.yaml ships beside it);
    ``answers``: its answers to the task (``own``) and the fp32 folder's (``fp32``), shown first."""
    import shutil

    from vlsens import __version__

    folder = Path(folder)
    ident = checkpoint_identity(checkpoint, run_root)
    license_name, license_file = checkpoint_license(checkpoint)
    if license_file is not None:
        shutil.copyfile(license_file, folder / license_file.name)
    model = Path(run_root).name
    where = ident["source"] + (f", {ident['files']} files, SHA-256 of their hashes `{ident['sha256']}`"
                               if ident.get("sha256") else "")
    if "recipe" in ident:
        kind = ("trained on vlsens' visual question task (`training.json`)"
                if ident["recipe"].get("weights") == "trained" else "with random weights")
        where += (f", a vlsens preset {kind} (`vlsens_preset.json`: "
                  f"`{json.dumps(ident['recipe'], sort_keys=True)}`)")
    gate = ("passed" if parity.get("passed") else "measured, not gated (its graph passed its own gate)"
            if parity.get("gated") is False else "FAILED")
    lines = ["---", f"license: {license_name}", "library_name: onnxruntime-genai",
             f"tags: [onnx, onnxruntime-genai, vlsens, {name}]", "---", "",
             f"# {model}: {name} (onnxruntime-genai)", "",
             f"Built by vlsens {__version__} from {where}.", "", *_accuracy(answers),
             "## What is in it", "", "| graph | built from |", "| --- | --- |"]
    lines += [f"| `{g}.onnx` | `{src}` |" for g, src in sorted((parity.get("sources") or {}).items())]
    lines += ["", f"Vision graph against transformers' features on onnxruntime-genai's own preprocessing: **{gate}**.",
              *(["`plan.yaml` beside this card lists the format of every weight (it rebuilds this folder)."] if plan
                else []), "", "## Measured", "", *_measured(record), "", *_usage(name),
              f"## License\n\n{license_name}" + (f" (`{license_file.name}`, the checkpoint's own)" if license_file
                                                 else " (as the checkpoint says; it ships no license file)") + "."]
    (folder / CARD).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / CARD
