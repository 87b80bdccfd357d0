#!/usr/bin/env python
"""The mixed-precision profile in its deployment target's arithmetic: does the shipped model
measure what the search estimated, how much of it is INT8, how big and how fast is it?

``held-out`` (default): vision towers of planted checkpoints no test or default run uses, each
through export -> calibration -> engine ``ort`` -> profile (``quant.target: ort-cpu``), once per
saturation guard (``none``: U8S8 with 8-bit weights, ``reduce_range``, ``u8u8``). Prints, per
tower and guard: the search's choice and estimate, the built model's value (ONNX Runtime's
default session: integer kernels), the gap, the number of builds, the shipped INT8 weight share,
bytes against float, latency against FP32.

``results``: a finished run's profiles (``--results results/3b``, e.g. after ``make scale``):
the same table from their ``eval.json``; ``--latency`` also profiles each graph again with
``objective: latency`` (from the run's engine, into ``--out``); ``--kernels`` breaks the float and
the INT8-mixed model's time down by operator type (ONNX Runtime's profiler), which says where an
INT8 model's time goes on this CPU.

    python bench/bench_profile.py                                   # held-out towers
    python bench/bench_profile.py --results results/3b --graphs vision/448x448 --latency --kernels
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

#: Held-out planted towers: (vision config overrides, plant, image size, seed). None of them is a
#: test's or the default run's (depth 4, width 64, site attn, 224x224 / 224x336).
HELD_OUT = {
    "d6-w96-proj": ({"depth": 6, "hidden_size": 96, "intermediate_size": 192, "num_heads": 3, "out_hidden_size": 64,
                     "fullatt_block_indexes": [2, 5]}, {"block": 3, "channels": 2, "scale": 1000.0, "site": "proj"},
                    "308x196", 7),
    "d10-w160-mlp": ({"depth": 10, "hidden_size": 160, "intermediate_size": 320, "num_heads": 5,
                      "out_hidden_size": 64, "fullatt_block_indexes": [4, 9]},
                     {"block": 7, "channels": 3, "scale": 500.0, "site": "mlp"}, "252x336", 11),
}
GUARDS = ("none", "reduce_range", "u8u8")


def row(name: str, guard: str, ev: dict) -> dict:
    t = ev["target"]["metric"]
    est = (ev.get("estimate") or {}).get(t)
    first = ev["builds"][0][t]
    lat = ev["latency_ms"]
    return {"graph": name, "guard": guard, "search ops": f"{ev['search_choice']['int8_ops']}/{ev['quantizable_ops']}",
            "estimate": est, "built": first, "gap": None if est is None else first - est,
            "builds": len(ev["builds"]), "shipped ops": ev["int8_ops"],
            "INT8 w (search→shipped)": f"{ev['search_choice']['int8_weight_share']:.0%}→{ev['int8_weight_share']:.0%}",
            "bytes vs float": ev["model_bytes"] / ev["float_model_bytes"],
            "int8 ms": lat["int8_mixed"], "fp32 ms": lat.get("fp32"), "fp16 ms": lat.get("fp16"),
            "x fp32": ev["speedup"].get("vs_fp32")}


def print_table(rows: list[dict]) -> None:
    if not rows:
        return
    cols = list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.6f}" if 0.99 < abs(v) < 1 else f"{v:.3g}"
        return "–" if v is None else str(v)

    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for r in rows:
        print("| " + " | ".join(fmt(r[c]) for c in cols) + " |")


def held_out(names: list[str], guards: list[str], work: Path, objective: str) -> list[dict]:
    from conftest import build_graph, run_settings

    from vlsens.data.images import resolve_images
    from vlsens.model.presets.build import build_tiny_checkpoint
    from vlsens.precision.int8 import ProfileSettings, build_profile
    from vlsens.sensitivity.stages import gather, prepare, run_shard

    rows = []
    for name in names:
        vision, plant, size, seed = HELD_OUT[name]
        root = work / name
        if not (root / "calib" / "eval.npz").exists():
            ckpt = build_tiny_checkpoint(root / "ckpt", seed=seed, outlier=plant, vision=vision)
            build_graph(f"vision/{size}", ckpt, root, resolve_images("builtin")[:2], **{"vision.sizes": [size]})
        ev_npz = root / "calib" / "eval.npz"
        for guard in guards:
            g = root / guard
            prepare(root / "fp32" / "model.onnx", root / "calib" / "calib.npz", ev_npz, g / "engine",
                    run_settings(**{"quant.saturation": guard}), logits=False)
            run_shard(g / "engine", ev_npz, 0, 1, g / "ort.0-of-1.csv")
            gather(g / "engine", ev_npz, [g / "ort.0-of-1.csv"], g / "ort.csv", g / "ort.json")
            t0 = time.perf_counter()
            ev = build_profile(g / "engine", g / "ort.csv", ev_npz, {"fp32": root / "fp32" / "model.onnx"},
                               g / "profile", ProfileSettings("cosine", 0.999, objective=objective))
            rows.append({**row(f"{name} ({size})", guard, ev), "profile s": time.perf_counter() - t0})
            print(f"# {name} {guard}: done", file=sys.stderr, flush=True)
    return rows


def kernels(model: Path, feed: dict, runs: int = 3) -> dict[str, float]:
    """Milliseconds per run by operator type (ONNX Runtime's profiler; CPU provider, default
    optimizations: the fused integer kernels of ``ort-cpu``)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(d) / "p")
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        sess.run(None, feed)
        for _ in range(runs):
            sess.run(None, feed)
        trace = json.loads(Path(sess.end_profiling()).read_text())
    per = defaultdict(float)
    for e in trace:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per[e["args"]["op_name"]] += e["dur"] / 1000.0
    return {k: v / (runs + 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


def from_results(results: Path, graphs: list[str], latency: bool, with_kernels: bool, out: Path) -> list[dict]:
    from vlsens.data.samples import Samples
    from vlsens.precision.int8 import ProfileSettings, build_profile

    rows, breakdowns = [], {}
    for graph in graphs:
        for ev_path in sorted((results / "profile" / graph).glob("*/eval.json")):
            variant = ev_path.parent.name
            ev = json.loads(ev_path.read_text())
            rows.append(row(f"{graph} [{variant}]", ev["settings"].get("guard", "?"), ev))
            eng = results / "sensitivity" / graph / variant / "engine"
            calib = results / "calib" / graph / "eval.npz"
            bases = {v: results / graph / v / "model.onnx" for v in ("fp32", "fp16")
                     if (results / graph / v / "model.onnx").exists()}
            if latency:
                t = ev["target"]
                lat = build_profile(eng, results / "sensitivity" / graph / variant / "ort.csv", calib, bases,
                                    out / graph / variant, ProfileSettings(t["metric"], t["value"], objective="latency"))
                rows.append(row(f"{graph} [{variant}] latency", lat["settings"].get("guard", "?"), lat))
            if with_kernels:
                feed = Samples.load(calib, eng / "float.onnx").feeds[0]
                breakdowns[f"{graph} [{variant}] fp32"] = kernels(bases["fp32"], feed)
                breakdowns[f"{graph} [{variant}] int8-mixed"] = kernels(ev_path.parent / "model.onnx", feed)
    if breakdowns:
        print("\n## Time by operator type (ms per run, ONNX Runtime profiler, CPU provider)\n")
        ops = sorted({k for b in breakdowns.values() for k in b}, key=lambda k: -max(b.get(k, 0) for b in breakdowns.values()))
        print("| op type | " + " | ".join(breakdowns) + " |")
        print("|---|" + "---|" * len(breakdowns))
        for k in ops[:16]:
            print(f"| {k} | " + " | ".join(f"{b.get(k, 0.0):.1f}" for b in breakdowns.values()) + " |")
        print("| **total** | " + " | ".join(f"{sum(b.values()):.1f}" for b in breakdowns.values()) + " |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--towers", nargs="*", default=list(HELD_OUT), choices=list(HELD_OUT))
    ap.add_argument("--guards", nargs="*", default=list(GUARDS), choices=list(GUARDS))
    ap.add_argument("--objective", default="accuracy", choices=["accuracy", "latency"])
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--results", type=Path, help="a finished run's results/<model> folder instead")
    ap.add_argument("--graphs", nargs="*", default=["vision/448x448"])
    ap.add_argument("--latency", action="store_true", help="--results: also profile with objective latency")
    ap.add_argument("--kernels", action="store_true", help="--results: time by operator type, fp32 vs INT8-mixed")
    ap.add_argument("--out", type=Path, default=Path("results/bench-profile"))
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("root").setLevel(logging.ERROR)  # ORT's "consider pre-processing" on every quantize
    from _publish import published

    if args.results:
        with published(f"profile-{args.results.name}", f"Profiles of a finished run ({args.results})"):
            rows = from_results(args.results, args.graphs, args.latency, args.kernels, args.out)
            print()
            print_table(rows)
    else:
        with published("profile-held-out", "Profiles of held-out planted checkpoints"), \
                tempfile.TemporaryDirectory() as d:
            rows = held_out(args.towers, args.guards, args.work or Path(d), args.objective)
            print()
            print_table(rows)


if __name__ == "__main__":
    main()
