"""Which folder to ship, per device: ``results/<model>/recommend.json`` and ``recommend.md``.

Every candidate is judged one way. A deploy folder's error is its mean KL per generated step
against the fp32 folder (teacher-forced through onnxruntime-genai): from the folders' measure
(``measure/<folder>.json``: 24 text, one-image and two-image cases) where the run measured it,
else from the folder's own check (``eval.json``: one case per modality). A folder is shippable when
its vision graph passed its gate against transformers (``parity.json``) and its KL is within the
run's KL budget (``text.profile.target``); the recommendation for a device is the shippable folder
written for that device with the fewest bytes on disk (ties: more tokens per second). The fp32
folder is always within the budget (KL 0), so a device with any folder gets one.

Devices: ``cpu`` and ``cuda`` by the provider a folder's ``genai_config.json`` names (none: CPU);
``npu``: the fixed-size graphs' single-file parts with the INT8 profile of that graph and variant
(the op list a toolchain's per-layer config takes).

What was missed is listed, not hidden: a folder whose own profile target (``eval.json``: target)
is not met end to end, a ``plan.budgets`` request whose built folder misses it, an NPU profile that
did not meet its target. Each is logged as a warning by the job, and ``vlsens run --strict`` fails
on them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

MODALITIES = ("text", "image", "images")  # a modality, not a graph
DEVICES = ("cpu", "cuda", "npu")


def _json(path) -> dict:
    return json.loads(Path(path).read_text())


def provider(folder: str | Path) -> str:
    """The execution provider a folder's ``genai_config.json`` asks for (``cpu`` when it names none)."""
    model = _json(Path(folder) / "genai_config.json")["model"]
    sessions = [v["session_options"] for v in model.values() if isinstance(v, dict) and "session_options" in v]
    names = [k for so in sessions for o in so.get("provider_options") or [] for k in o]
    return names[0] if names else "cpu"


def gate_state(parity: dict) -> str:
    """A folder's vision gate (``parity.json``): ``passed`` against transformers; ``measured``: a
    graph that passed its own gate on its own weights and whose format's cost is the folder's
    measure (a plan's or a peer's vision graph, ``gated: false``); else ``failed``."""
    if parity.get("passed"):
        return "passed"
    return "measured" if parity.get("gated") is False else "failed"


def folder_facts(name: str, folder: str | Path, measure: str | Path | None = None) -> dict:
    """One folder: bytes on disk, its error (from its measure, else its own check), top-1, tokens per
    second, whether its gate passed, its provider, and its own profile target where it has one."""
    folder = Path(folder)
    ev = _json(folder / "eval.json")
    gate = _json(folder / "parity.json")
    out = {"folder": name, "path": str(folder), "provider": provider(folder),
           "bytes": sum(p.stat().st_size for p in folder.iterdir() if p.is_file()),
           "gate": gate_state(gate), "tokens_per_second": ev.get("tokens_per_second"),
           "target": ev.get("target")}
    if measure is not None and Path(measure).is_file():
        m = _json(measure)
        mods = m["modalities"]
        out.update(source="measure", cases=len(m["cases"]), kl=m["mean_kl"], top1=m["top1"],
                   modalities={k: {"kl": mods[k]["mean_kl"], "min": mods[k]["min"], "max": mods[k]["max"],
                                   "cases": mods[k]["cases"]} for k in MODALITIES if k in mods})
    else:
        cases = ev["cases"]
        by = {"text": "text", "one-image": "image", "two-images": "images"}  # a modality, not a graph
        reference = "mean_kl" not in ev  # the fp32 folder: the reference itself (its tokens are transformers')
        kls = [0.0 if reference else c["mean_kl"] for c in cases]
        out.update(source="reference" if reference else "deploy check", cases=len(cases),
                   kl=0.0 if reference else ev["mean_kl"], top1=1.0 if reference else ev["top1_agreement"],
                   modalities={by.get(c["case"], c["case"]): {"kl": k, "min": k, "max": k, "cases": 1}
                               for c, k in zip(cases, kls)})
    return out


def add_accuracy(facts: list[dict], table: dict | None) -> None:
    """Each folder's task accuracy (``measure/accuracy.json``, :mod:`vlsens.deploy.accuracy`) in its
    facts: overall and per modality with the Wilson interval, its paired drop against fp32 and
    whether that drop is resolved (``below_fp32``)."""
    if not table:
        return
    for f in facts:
        row = table["rows"].get(f["folder"])
        if row is None:
            continue
        pair = row.get("vs_fp32")
        f["accuracy"] = {"all": row["accuracy"], "modalities": row["modalities"], "questions": table["count"],
                         "drop": pair["all"] if pair else None, "below_fp32": bool(row.get("below_fp32"))}


def pick(facts: list[dict], device: str, kl_budget: float) -> dict:
    """The shippable folder for ``device`` with the fewest bytes, and why; or why there is none.
    Shippable: its gate passed, its KL is within the budget and, where the run scored the task's
    answers, its accuracy is not resolved below fp32's (paired, overall and per modality)."""
    mine = [f for f in facts if f["provider"] == device]
    if not mine:
        return {"folder": None, "why": f"no folder of this run is written for {device} "
                                       f"(deploy.provider: {device} writes them)"}
    scored = all("accuracy" in f for f in mine)
    ok = [f for f in mine if f["gate"] != "failed" and f["kl"] <= kl_budget
          and not (scored and f["accuracy"]["below_fp32"])]
    what = ("whose accuracy on the task is not resolved below fp32's and " if scored else "")
    if not ok:
        return {"folder": None, "why": f"none of the {len(mine)} {device} folders passed its gate {what}within the KL "
                                       f"budget {kl_budget:g}"}
    best = min(ok, key=lambda f: (f["bytes"], -(f["tokens_per_second"] or 0)))
    out = {"folder": best["folder"], "path": best["path"], "bytes": best["bytes"], "kl": best["kl"],
           "why": f"the fewest bytes of the {len(ok)} of {len(mine)} {device} folders whose vision graph passed its gate, "
                  f"{what}whose mean KL per generated step against the fp32 folder is within the budget "
                  f"{kl_budget:g} ({best['source']}, {best['cases']} cases)"}
    if scored:
        out["accuracy"] = best["accuracy"]["all"]["accuracy"]
    return out


def npu_facts(entries: dict[str, dict]) -> list[dict]:
    """Per fixed-size graph: its parts folder (single-file graphs for a toolchain) and its INT8
    profile (op list, met or not), as ``{graph: {"parts": folder, "profile": eval.json}}``."""
    out = []
    for graph, e in sorted(entries.items()):
        parts = _json(Path(e["parts"]) / "parts.json")
        prof = _json(e["profile"]) if e.get("profile") else None
        out.append({"graph": graph, "path": str(e["parts"]), "parts": len(parts["parts"]), "gate": bool(parts["passed"]),
                    "profile": None if prof is None else {
                        "path": str(Path(e["profile"]).parent), "int8_ops": prof["int8_ops"],
                        "quantizable_ops": prof["quantizable_ops"], "status": prof["status"],
                        "a16_ops": prof.get("a16_ops", 0), "int8_weight_share": prof.get("int8_weight_share"),
                        "measured": prof["measured"].get(prof["target"]["metric"]), "target": prof["target"]},
                    "toolchain": str(e["toolchain"]) if e.get("toolchain") else None})
    return out


def npu_picks(toolchains: list[str]) -> list[str]:
    """Per fixed-size graph, the toolchain folder to ship: a met profile first, then the most
    8-bit weights, the fewest float ops and the fewest W8A16 ops (fp32-smooth wins where it
    brought ops back to W8A8). Folders are ``.../toolchain/<graph>/<variant>``."""
    by_graph: dict[str, list] = {}
    for t in toolchains:
        rec = _json(Path(t) / "toolchain.json")
        if rec is None:
            continue
        key = (rec.get("status") != "met", -rec["int8_weight_share"], rec["ops"]["float"], rec["ops"]["int8-a16"])
        by_graph.setdefault(str(Path(t).parent), []).append((key, str(t)))
    return [min(v)[1] for _, v in sorted(by_graph.items())]


def apart(measured: float, target: float) -> tuple[str, str]:
    """``measured`` and ``target`` written with the fewest significant digits (3 at least) that tell
    them apart: a miss by 0.2 % does not read as "0.0001 against 0.0001"."""
    for digits in range(3, 10):
        a, b = f"{measured:.{digits}g}", f"{target:.{digits}g}"
        if a != b:
            return a, b
    return a, b


def missed(facts: list[dict], npu: list[dict], measured: dict | None) -> list[str]:
    """Targets this run set and did not meet, one line each."""
    out = []
    for f in facts:
        t = f.get("target")
        if t and t.get("met") is False:  # None: a metric the end-to-end check does not measure
            got, want = apart(t["measured"], t["target"])
            out.append(f"{f['folder']}: its profile's target {t['metric']} {want} is not met end to end "
                       f"(measured {got} in {f['path']}/eval.json)")
    for n in npu:
        p = n["profile"]
        if p and p["status"] != "met":
            got, want = apart(p["measured"], p["target"]["value"])
            out.append(f"{n['graph']}: its INT8 profile is {p['status']} ({p['target']['metric']} "
                       f"{got} against {want}; {p['path']}/eval.json)")
    for name, r in ((measured or {}).get("requested") or {}).items():
        if not r.get("met"):
            out.append(f"plan.budgets '{name}': not met by its built folder"
                       + (f" (deploy/plan-{name}: {r['bytes']} bytes, KL {r['kl']:.3g})" if "kl" in r else " (no plan)"))
    return out


def recommend(folders: dict[str, str], measures: dict[str, str], kl_budget: float,
              npu: dict[str, dict] | None = None, measured: str | None = None,
              toolchains: list[str] | None = None, accuracy: str | None = None) -> dict:
    """The record: every candidate's facts, the pick per device, what was missed; ``toolchains``:
    toolchain folders of profiled variants that are not cut into parts; ``accuracy``: the folders'
    task accuracy table (``measure/accuracy.json``)."""
    facts = [folder_facts(n, f, measures.get(n)) for n, f in folders.items()]
    add_accuracy(facts, _json(accuracy) if accuracy else None)
    npu_rows = npu_facts(npu or {})
    front = _json(measured) if measured else None
    devices = {d: pick(facts, d, kl_budget) for d in ("cpu", "cuda")}
    shippable = [n for n in npu_rows if n["gate"]]
    tools = npu_picks([n["toolchain"] for n in shippable if n.get("toolchain")] + [str(t) for t in toolchains or []])
    devices["npu"] = ({"graphs": [n["graph"] for n in shippable], "paths": [n["path"] for n in shippable] + tools,
                       "why": "each fixed-size graph's single-file parts (gated against transformers) with the INT8 "
                              "profile of that graph" + (": per graph, the toolchain folder of the variant whose "
                                                         "profile keeps the most weights 8-bit with the fewest float "
                                                         "and W8A16 ops (its pulsar2 build configs: the float graph "
                                                         "and parts, and pulsar2_qdq.json on the profile's QDQ model "
                                                         "(QuantONNX, the measured codes); the QNN QDQ model's "
                                                         "tensor overrides)"
                                                         if tools else "")} if shippable else
                      {"folder": None, "why": "no NPU parts in this run (goal npu or all builds them)"})
    return {"kl_budget": kl_budget, "reference": "the fp32 folder through onnxruntime-genai, teacher-forced on its "
                                                 "greedy tokens",
            "folders": facts, "npu": npu_rows, "devices": devices, "missed": missed(facts, npu_rows, front)}


def accuracy_cell(f: dict) -> str:
    """``91.5 % [88.9, 93.5]`` and the paired drop against fp32, or ``-`` where not scored."""
    a = f.get("accuracy")
    if not a:
        return "-"
    acc, d = a["all"], a["drop"]
    cell = f"{100 * acc['accuracy']:.1f} % [{100 * acc['low']:.1f}, {100 * acc['high']:.1f}]"
    if d:
        cell += f", {100 * d['difference']:+.1f} pt vs fp32 ({'resolved below' if a['below_fp32'] else d['resolved']})"
    return cell


def _modality_accuracy(f: dict) -> str:
    a = f.get("accuracy")
    if not a:
        return "-"
    return " / ".join(f"{100 * a['modalities'][m]['accuracy']:.1f}" if m in a["modalities"] else "-"
                      for m in MODALITIES)


def _kl_cell(f: dict) -> str:
    mods = f["modalities"]
    return " / ".join(f"{mods[m]['kl']:.3g}" if m in mods else "-" for m in MODALITIES)


def device_lines(rec: dict, ship=lambda device, path: f"**{device}: ship {path}**",
                 path=lambda p: p) -> list[str]:
    """A line per device: the folder to ship with its facts and why, or why there is none;
    ``ship`` and ``path`` mark up the head and a path (Markdown by default; the verdict's RST)."""
    facts = {f["folder"]: f for f in rec["folders"]}
    lines = []
    for d in ("cpu", "cuda"):
        r = rec["devices"][d]
        if r.get("folder"):
            f = facts[r["folder"]]
            speed = f"; about {f['tokens_per_second']:.0f} tokens/s in its check" if f.get("tokens_per_second") else ""
            acc = (f"task accuracy {accuracy_cell(f)}, text / one image / two images {_modality_accuracy(f)} %; "
                   if f.get("accuracy") else "")
            lines.append(f"- {ship(d.upper(), r['path'])} ({f['bytes'] / 1e6:.2f} MB folder, {acc}KL per step {f['kl']:.3g}; "
                         f"text / one image / two images {_kl_cell(f)}; top-1 {f['top1']:.2f}{speed}; vision gate "
                         f"{f['gate']}): {r['why']}.")
        else:
            lines.append(f"- {d.upper()}: {r['why']}.")
    n = rec["devices"]["npu"]
    lines.append(f"- **NPU:** {', '.join(path(x) for x in n['paths'])}: {n['why']}." if n.get("paths")
                 else f"- NPU: {n['why']}.")
    return lines


def markdown(rec: dict) -> str:
    """What a person reads at the end of a run and on the report's first page."""
    lines = device_lines(rec)
    if rec["missed"]:
        lines += ["", f"WARNING: {len(rec['missed'])} target(s) missed:"] + [f"- {m}" for m in rec["missed"]]
    lines += ["", "| folder | device | MB | task accuracy [95 % interval], paired drop | text / image / images % "
                  "| KL per step | text / image / images | top-1 | check tok/s | gate | from |",
              "| --- | --- | ---: | --- | --- | ---: | --- | ---: | ---: | --- | --- |"]
    for f in sorted(rec["folders"], key=lambda x: x["bytes"]):
        tps = f"{f['tokens_per_second']:.0f}" if f.get("tokens_per_second") else "-"
        lines.append(f"| {f['folder']} | {f['provider']} | {f['bytes'] / 1e6:.3f} | {accuracy_cell(f)} | "
                     f"{_modality_accuracy(f)} | {f['kl']:.3g} | {_kl_cell(f)} | "
                     f"{f['top1']:.2f} | {tps} | {f['gate']} | {f['source']}, "
                     f"{f['cases']} cases |")
    lines += ["", "check tok/s: the deploy check's one pass over its cases (first call included): a rough figure. "
                  "`bench/bench_deploy.py` measures speed (prefill and decode apart, the median of 5 runs after a "
                  "warm-up, with their spread)."]
    return "\n".join(lines) + "\n"


def write(rec: dict, json_path: str | Path, md_path: str | Path) -> None:
    from vlsens.core.fsutil import atomic_file, write_json

    for m in rec["missed"]:
        log.warning("%s", m)
    write_json(json_path, rec)
    with atomic_file(md_path) as tmp:
        scored = any("accuracy" in f for f in rec["folders"])
        first = ("Task accuracy first: greedy answers to the task's evaluation questions through onnxruntime-genai, "
                 "each folder paired with fp32 on the same questions (measure/accuracy.md); a folder whose accuracy is "
                 "resolved below fp32's is not recommended. Then the " if scored else "")
        tmp.write_text(f"# Which folder to ship\n\n{first}KL budget {rec['kl_budget']:g} per generated step, against "
                       f"{rec['reference']}.\n\n" + markdown(rec))


def recommend_job(sources: dict[str, dict[str, str]], kl_budget: float, json_path: str | Path,
                  md_path: str | Path) -> dict:
    """The rule's job: ``sources`` by kind (``folder``, ``measure``, ``measured``, ``parts``,
    ``profile``, ``toolchain``: name -> path, rules/common.smk: recommend_items) into the record and its page."""
    npu: dict[str, dict] = {}
    for kind in ("parts", "profile", "toolchain"):
        for name, path in (sources.get(kind) or {}).items():
            npu.setdefault(name, {})[kind] = path
    # a profiled variant without parts (fp32-smooth when only fp32 is cut) still has toolchain files
    extra = [e["toolchain"] for e in npu.values() if "parts" not in e and e.get("toolchain")]
    npu = {k: e for k, e in npu.items() if "parts" in e}
    measured = next(iter((sources.get("measured") or {}).values()), None)
    accuracy = next(iter((sources.get("accuracy") or {}).values()), None)
    rec = recommend(sources.get("folder") or {}, sources.get("measure") or {}, kl_budget, npu, measured, extra,
                    accuracy)
    write(rec, json_path, md_path)
    return rec
