"""Decode latency: the milliseconds of one generated token, the budget a user states as "80 ms per
token".

A decode step runs the decoder on one token with the KV cache of the tokens before it. Its MatMuls
read every weight once (a matrix-vector product each), so a step's time is a fixed part (attention
over the cache, norms, the runtime) plus, per MatMul, a time proportional to its weights in the
format they are stored in. With ``B`` the decoder's MatMul weights in float and ``B_w`` those a plan
keeps at width ``w`` (float, INT8, INT4), that model gives

    t(plan) = sum_w (B_w / B) x t_w

where ``t_w`` is the measured step of the decoder with every MatMul at width ``w``
(:func:`estimate_ms`): the fixed part cancels, so three measured graphs price every assignment.
The built plan folders test it: :func:`measure_plans` times their decoders and the three uniform
graphs in the same rounds (:func:`time_steps`: a load on the machine falls on all of them alike),
and ``budget/measured.md`` prints estimate against measured for every plan.

Times are this machine's, with the run's ``threads``, at a cache of ``plan.decode_context``
tokens, the median of the quietest round of steps with the quartiles of all of them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vlsens.core.errors import VlsensError

#: Steps run untimed first (allocations, thread pools).
WARMUP = 3
#: The uniform decoders of the nbits engine folder, by width (0: float).
UNIFORM = {0: "float", 4: "q4", 8: "q8"}
_NUMPY = {1: np.float32, 6: np.int32, 7: np.int64, 10: np.float16}


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value_info.type.tensor_type.shape.dim]


def step_feed(graph: str | Path, decoder: Mapping, context: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One decode step's inputs for a deploy decoder ``graph`` (the onnxruntime-genai layout:
    ``inputs_embeds``, ``attention_mask``, ``position_ids``, ``past_key_values.*``): one token
    after ``context`` cached ones, the cache and the embedding random (a step's time does not
    depend on the values). ``decoder``: ``genai_config.json``'s ``model.decoder`` (KV heads, head
    size, hidden size)."""
    import onnx

    if context < 1:
        raise ValueError(f"context must be >= 1 token, got {context}")
    m = onnx.load(str(graph), load_external_data=False)
    rng = np.random.default_rng(seed)
    kv = (1, int(decoder["num_key_value_heads"]), context, int(decoder["head_size"]))
    feed = {}
    for i in m.graph.input:
        kind = _NUMPY.get(i.type.tensor_type.elem_type)
        if kind is None:
            raise VlsensError(f"{graph}: input {i.name} has an element type a decode step does not feed")
        if i.name == "inputs_embeds":
            feed[i.name] = (rng.standard_normal((1, 1, int(decoder["hidden_size"]))) * 0.02).astype(kind)
        elif i.name == "input_ids":
            feed[i.name] = np.ones((1, 1), kind)
        elif i.name == "attention_mask":
            feed[i.name] = np.ones((1, context + 1), kind)
        elif i.name == "position_ids":
            feed[i.name] = np.full((3, 1, 1) if len(_dims(i)) == 3 else (1, 1), context, kind)
        elif i.name.startswith("past_key_values."):
            feed[i.name] = (rng.standard_normal(kv) * 0.1).astype(kind)
        else:
            raise VlsensError(f"{graph}: input {i.name} is not one a decode step feeds "
                              "(inputs_embeds / input_ids, attention_mask, position_ids, past_key_values.*)")
    return feed


def uniform_graphs(engine_dir: str | Path) -> dict[int, Path]:
    """The nbits engine folder's uniform decoders: width (0: float) -> graph."""
    from vlsens.sensitivity import nbits as nb

    folder = nb.Prepared(engine_dir).folder
    return {w: folder / nb.FILES[f] for w, f in UNIFORM.items()}


def decoder_config(folder: str | Path) -> dict:
    """``model.decoder`` of a deploy folder's ``genai_config.json``."""
    path = Path(folder) / "genai_config.json"
    try:
        return dict(json.loads(path.read_text())["model"]["decoder"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise VlsensError(f"{path}: no model.decoder to size a decode step from ({e})") from None


def uniform_latency(engine_dir, latency: Mapping, threads: int = 0) -> dict:
    """The decode step of the engine's uniform decoders (all float, all INT8, all INT4:
    :func:`time_steps`) at ``latency["context"]`` cached tokens, sized by the deploy folder
    ``latency["folder"]``'s ``genai_config.json``: ``{"context", "uniform": {width: timing}}``."""
    timed = time_steps({str(w): g for w, g in uniform_graphs(engine_dir).items()}, decoder_config(latency["folder"]),
                       int(latency["context"]), threads=threads)
    return {"context": int(latency["context"]), "uniform": timed}


def time_steps(graphs: Mapping[str, str | Path], decoder: Mapping, context: int, steps: int = 30,
               threads: int = 0, rounds: int = 3) -> dict[str, dict]:
    """Per graph (name -> deploy decoder graph) the milliseconds of one decode step (:func:`step_feed`).
    In each of ``rounds`` rounds every graph in turn gets a session of its own (one at a time: the
    memory is the largest graph's, not their sum), :data:`WARMUP` untimed steps and its share of
    ``steps`` timed ones; a load that comes and goes on the machine falls on every graph alike,
    and ``ms`` is the median of the graph's quietest round (other jobs of a run share the cores).
    ``{name: {"ms", "q1", "q3" (of every step), "steps", "context", "threads"}}``."""
    from vlsens.core.onnxutil import make_session

    if steps < 1 or rounds < 1:
        raise ValueError(f"steps and rounds must be >= 1, got {steps}, {rounds}")
    feeds = {name: step_feed(graph, decoder, context) for name, graph in graphs.items()}
    times: dict[str, list[float]] = {name: [] for name in graphs}
    rounds_ms: dict[str, list[float]] = {name: [] for name in graphs}
    for r in range(rounds):
        share = steps // rounds + (1 if r < steps % rounds else 0)
        for name, graph in graphs.items():
            if not share:
                continue
            session = make_session(graph, threads=threads)
            for _ in range(WARMUP):
                session.run(None, feeds[name])
            taken = []
            for _ in range(share):
                t0 = time.perf_counter()
                session.run(None, feeds[name])
                taken.append((time.perf_counter() - t0) * 1e3)
            times[name] += taken
            rounds_ms[name].append(float(np.median(taken)))
            del session
    return {name: {"ms": min(rounds_ms[name]), "q1": float(np.percentile(t, 25)), "q3": float(np.percentile(t, 75)),
                   "steps": len(t), "context": context, "threads": threads} for name, t in times.items()}


def estimate_ms(bits: Mapping[str, int], rows: Sequence[Mapping], uniform: Mapping[int, float]) -> float:
    """A decoder assignment's decode step (ms): its MatMuls' float bytes at each width (``rows``:
    the sensitivity CSV's, ``op`` and ``bytes_float``; an op absent from ``bits`` is float) as
    shares of the measured uniform steps ``uniform`` (width -> ms; 0 = float)."""
    total = sum(float(r["bytes_float"]) for r in rows)
    if total <= 0:
        raise VlsensError("no MatMul weights to share a decode step over")
    missing = {int(bits.get(r["op"], 0)) for r in rows} - {int(w) for w in uniform}
    if missing:
        raise VlsensError(f"no measured uniform decode step at width(s) {sorted(missing)}")
    share: dict[int, float] = {}
    for r in rows:
        w = int(bits.get(r["op"], 0))
        share[w] = share.get(w, 0.0) + float(r["bytes_float"]) / total
    return float(sum(s * float(uniform[w]) for w, s in share.items()))


def measure_plans(engine_dir: str | Path, folders: Mapping[str, str | Path], front: Mapping, context: int,
                  threads: int = 0, steps: int = 30) -> dict:
    """``budget/latency.json``: the decode step of every plan folder (name -> its deploy folder,
    holding its ``plan.yaml``) and of the engine's uniform decoders, timed in the same rounds
    (:func:`time_steps`); per plan its measured step, the estimate from the uniform steps measured
    here (:func:`estimate_ms` on ``front["float_bytes"]``), their relative error, and the search's
    own estimate (``front``'s, timed in the search's job)."""
    from vlsens.budget.plan import PLAN_FILE, Plan

    if not folders:
        raise VlsensError("no plan folder to time")
    if not front.get("float_bytes"):
        raise VlsensError("the front's record holds no float_bytes to share a decode step over")
    uniform = {f"uniform-{w}": g for w, g in uniform_graphs(engine_dir).items()}
    plans = {name: Path(f) for name, f in folders.items()}
    config = decoder_config(next(iter(plans.values())))
    graphs = {**uniform, **{name: f / config["filename"] for name, f in plans.items()}}
    timed = time_steps(graphs, config, context, steps, threads)
    widths = {int(k.split("-")[1]): timed[k]["ms"] for k in uniform}
    rows = [{"op": op, "bytes_float": b} for op, b in front["float_bytes"].items()]
    searched = {p["name"]: p.get("decode_ms") for p in front.get("plans", [])}
    out = {}
    for name, folder in plans.items():
        plan = Plan.load(folder / PLAN_FILE)
        est, got = estimate_ms(plan.decoder, rows, widths), timed[name]["ms"]
        out[name] = {"measured": timed[name], "estimate_ms": est, "error": (est - got) / got,
                     "search_estimate_ms": searched.get(plan.name)}
    return {"context": context, "uniform": {str(w): timed[f"uniform-{w}"] for w in widths}, "plans": out}


def latency_job(inputs: Mapping, outputs: Mapping, context: int, threads: int = 0) -> dict:
    """The ``budget_latency`` job: :func:`measure_plans` on the plan folders (inputs
    ``plan_<name>``), the engine and the front's record, written to ``latency``."""
    from vlsens.core.fsutil import write_json

    front = json.loads(Path(inputs["front"]).read_text())
    folders = {k.removeprefix("plan_"): Path(v) for k, v in inputs.items() if k.startswith("plan_")}
    record = measure_plans(inputs["engine"], folders, front, int(context), threads)
    record["volatile_keys"] = ["error", "q1", "q3"]  # measured times (vlsens.core.canonical): not results
    write_json(outputs["latency"], record)
    return record
