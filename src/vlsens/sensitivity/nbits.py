"""Engine ``nbits``: weight-only sensitivity of every weight MatMul, INT4 and INT8
(:mod:`vlsens.quantize.nbits`), measured the fast way: one session over a switch model.

The switch model holds, for every weight MatMul k,

    If(bits[k] == 4) then MatMulNBits(x, W4_k ...)            (copied from the all-INT4 model)
    else If(bits[k] == 8) then MatMulNBits(x, W8_k ...)       (copied from the all-INT8 model)
    else MatMul(x, W_k)                                       (the float model's)

with ``bits`` an int64 graph input (:data:`BITS_INPUT`), so one session evaluates any assignment
of widths, and ONNX Runtime runs only the taken branch. The quantized nodes and weights are the
ones ``MatMulNBitsQuantizer`` wrote (per node independent for ``rtn`` and ``k_quant``): an
assignment evaluated here equals the model :func:`vlsens.quantize.nbits.quantize` builds for it, kernel for
kernel (``tests/test_nbits.py`` checks every op against its one-op model, bit for bit).

Suffix-only (:mod:`vlsens.sensitivity.suffix`, ``sensitivity.suffix_cuts``): an op changes nothing
computed before its switch, so the sensitivity pass (one op at a time) runs each op from the cut
before it on, the float state at that cut cached once per evaluation input; on a decoder whose
MatMuls are spread evenly that is about half a forward per op. The same test runs through it.

Engine folder: ``float.onnx`` (the base model untied), ``q4.onnx`` and ``q8.onnx`` (the all-op
models), ``switch.onnx`` (a graph only: it reads the float weights from ``float.onnx.data`` and the
quantized ones from ``q4.onnx.data`` / ``q8.onnx.data``, so building it loads no weight and writes
none), ``reference.npz`` (float outputs on the evaluation set) and ``engine.json``.

Memory of the switch session: ONNX Runtime prepacks the quantized weights (each branch's own
initializers) into its own buffers, about their size on disk, and memory-maps the float weights
(outer-scope initializers are not prepacked): resident ``bytes_int4 + bytes_int8`` plus the float
weights as file pages the kernel may drop and re-read. At 3B (36 layers, 3.1 B MatMul weights):
1.7 + 3.3 GB resident, 12.4 GB mapped.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlsens.core.metrics import Metrics
from vlsens.core.onnxgraph import copy_node, element_types, input_scale, producers
from vlsens.quantize.nbits import (
    BITS,
    DATA_AWARE,
    DATA_AWARE_BITS,
    FLOAT,
    NBitsSettings,
    data_aware,
    float_bytes,
    quantize,
    quantized_nodes,
    weight_matmuls,
)
from vlsens.sensitivity.suffix import SKIP_INPUT, SuffixCache, SuffixPlan
from vlsens.sensitivity.suffix import build as build_suffix
from vlsens.sensitivity.switch import SwitchMap, check_beside, switch_gather, write_switch_model

log = logging.getLogger(__name__)

BITS_INPUT = "vlsens_nbits"
#: The positions whose logits an engine on the measure's cases computes (:func:`gather_read_rows`).
POSITIONS_INPUT = "vlsens_read_positions"
#: Columns of ``nbits.csv`` (``kl_*`` / ``top1_*`` only for graphs with logits).
CSV_COLUMNS = ["rank", "op", "block", "role", "K", "N", "bytes_float", "bytes_int8", "bytes_int4",
               "error_int4", "error_int8", "cosine_int4", "cosine_int8"]
LOGIT_COLUMNS = ["kl_int4", "top1_int4", "kl_int8", "top1_int8"]
#: Columns added where only some MatMuls are measured (``measured`` 0: the row's errors are estimates).
ESTIMATE_COLUMNS = ["measured", "output_error_int4", "output_error_int8", "estimate_int4", "estimate_int8"]
FILES = {"float": "float.onnx", "q4": "q4.onnx", "q8": "q8.onnx", "switch": "switch.onnx", "probe": "probe.onnx",
         "reference": "reference.npz", "meta": "engine.json"}


def build_switch_model(float_model: str | Path, quantized: Mapping[int, str | Path], out_model: str | Path,
                       ops: Sequence[str], read_rows: bool = False) -> None:
    """The switch model of ``float_model`` and its all-op quantized models (``{bits: path}``),
    all in one folder: written beside them, a graph whose weights stay in their data files (loaded
    without weights: its memory is the graphs', whatever the model's size). Made of the pieces
    every switch model shares (:mod:`vlsens.sensitivity.switch`). ``read_rows``: the logits only at
    the positions fed as :data:`POSITIONS_INPUT` (:func:`gather_read_rows`)."""
    import onnx
    from onnx import TensorProto, helper

    check_beside(out_model, float_model, *quantized.values())
    fm = onnx.load(str(float_model), load_external_data=False)
    positions = gather_read_rows(fm, ops) if read_rows else []
    sw = BitsSwitches(element_types(float_model), quantized)
    index = {n: k for k, n in enumerate(ops)}
    new_nodes: list = []
    for node in fm.graph.node:
        k = index.get(node.name)
        new_nodes.extend([node] if k is None else sw.select(node, k))
    domains = {o.domain for o in fm.opset_import}
    for m in sw.models.values():
        for imp in m.opset_import:
            if imp.domain not in domains:
                fm.opset_import.append(imp)
                domains.add(imp.domain)
    write_switch_model(fm, new_nodes, sw.needed,
                       [helper.make_tensor_value_info(BITS_INPUT, TensorProto.INT64, [len(ops)]), *positions], out_model)


def gather_read_rows(fm, ops: Sequence[str]) -> list:
    """Make ``fm`` (in place) compute its logits only at the positions it is fed: the weight
    MatMul that writes the first output (lm_head) reads ``Gather(x, positions, axis=1)`` of its
    input ``x`` (batch 1, ``positions`` the int64 graph input :data:`POSITIONS_INPUT`). Each row
    of a MatMul is its own dot products, so the rows kept are the whole graph's there up to the
    kernel's order of summation over fewer rows (float and INT4 measured equal; lm_head at INT8
    differs in the last bits, which moves its tiny KL by under 1 %, ``bench/bench_read_rows.py``).
    lm_head over a 3B decoder's vocabulary is about a tenth of a forward, spent on positions no
    one reads when only the answer's are scored (:attr:`Samples.read_only
    <vlsens.data.samples.Samples.read_only>`). Returns the input's value info (for the graph's inputs)."""
    from vlsens.core.onnxgraph import gather_rows_before

    head = next((n for n in fm.graph.node if fm.graph.output[0].name in n.output), None)
    if head is None or head.op_type != "MatMul" or head.name not in set(ops):
        raise ValueError(f"the first output ({fm.graph.output[0].name}) is not written by a weight MatMul of the engine")
    return [gather_rows_before(fm, head, POSITIONS_INPUT)]


def at_read_rows(samples):
    """``samples`` for a switch model made with ``read_rows``: each feed with its read positions
    (:data:`POSITIONS_INPUT`, from its ``valid`` mask), every output row then read (``valid`` None)."""
    from vlsens.data.samples import Samples

    feeds = [{**f, POSITIONS_INPUT: np.flatnonzero(v[0]).astype(np.int64)} for f, v in zip(samples.feeds, samples.valid)]
    return Samples(feeds, None, samples.names)  # every row read: no longer a read_only set


def plain_feed(feed: Mapping[str, np.ndarray]) -> dict:
    """An engine's ``feed`` without :data:`POSITIONS_INPUT`: what a plain session of the graph takes."""
    return {k: v for k, v in feed.items() if k != POSITIONS_INPUT}


def plain_rows(session, output: str, feed: Mapping[str, np.ndarray], valid) -> tuple:
    """A plain session of the engine's graph (a model built from it) on one of the engine's feeds:
    its ``output`` as ``(rows, valid)`` the way the engine's reference holds them (at the feed's
    read positions where it has them)."""
    out = session.run([output], plain_feed(feed))[0]
    at = feed.get(POSITIONS_INPUT)
    return (out, valid) if at is None else (out[:, at], None)


class BitsSwitches:
    """The width switches of a float graph, made from its all-op quantized models (``{bits:
    path}``, loaded without weights), and the initializers they add (``needed``: switch indices
    and widths)."""

    def __init__(self, elem: dict[str, int], quantized: Mapping[int, str | Path]):
        import onnx

        self.elem, self.paths = elem, quantized
        self.models = {b: onnx.load(str(p), load_external_data=False) for b, p in quantized.items()}
        self.q_nodes = {b: {n.name: n for n in m.graph.node} for b, m in self.models.items()}
        self.q_inits = {b: {i.name: i for i in m.graph.initializer} for b, m in self.models.items()}
        self.q_writers = {b: producers(m.graph.node) for b, m in self.models.items()}
        self.needed: dict[str, object] = {}

    def _out_info(self, name: str):
        from onnx import TensorProto, helper

        return helper.make_tensor_value_info(name, self.elem.get(name, TensorProto.FLOAT), None)

    def select(self, node, k: int) -> list:
        """Op ``node`` (switch ``k``) as nested Ifs on its width: the nodes that replace it."""
        from onnx import helper

        tag = f"vlsens_nb{k}"
        # named like every engine's switch of op k: the suffix plan starts op k's group there
        nodes = [switch_gather(BITS_INPUT, k, tag, f"{tag}_bits", f"vlsens_op{k}_Gather", self.needed)]
        out = node.output[0]
        branch = helper.make_graph([copy_node(node, {out: f"{tag}_float"}, f"{node.name}__{tag}_float")],
                                   f"{tag}_float", [], [self._out_info(f"{tag}_float")])
        for b in sorted(self.paths, reverse=True):  # innermost: the widest
            branch = self._width(node, b, tag, branch)
        # The outermost selection computes ``out`` itself.
        for n in branch.node:
            if n.op_type == "If":
                n.output[0] = out
            nodes.append(n)
        return nodes

    def _width(self, node, b: int, tag: str, otherwise):
        """The graph ``If(bits[k] == b) then node at b bits else otherwise``."""
        import onnx
        from onnx import TensorProto, helper

        qn = self.q_nodes[b].get(f"{node.name}_Q{b}")
        if qn is None:
            raise ValueError(f"{node.name} is not quantized to {b} bits in {self.paths[b]}")
        inits = self.q_inits[b]
        # The quantized weights are the branch's own initializers: ONNX Runtime prepacks a
        # kernel's constant weights only from its own graph (an outer-scope weight takes
        # MatMulNBits' unpacked path, whose INT8 arithmetic differs at accuracy_level 4).
        # Copied as references: a large one still points into q<b>.onnx.data.
        awq = input_scale(qn, self.q_writers[b], inits)  # AWQ's Mul in front: in the branch too
        pairs = ([(awq[0], "awq")] if awq else []) + [(qn, "q")]
        weights, rename = [], {qn.output[0]: f"{tag}_q{b}"} | ({awq[0].output[0]: f"{tag}_awq{b}"} if awq else {})
        if pairs[0][0].input[0] != node.input[0]:  # the float op reads another tensor (gather_read_rows)
            rename[pairs[0][0].input[0]] = node.input[0]
        for x in (x for n, _ in pairs for x in n.input[1:]):
            if x in inits and x not in rename:
                t = onnx.TensorProto()
                t.CopyFrom(inits[x])
                t.name = rename[x] = f"{x}__nb{b}"
                weights.append(t)
        copies = [copy_node(n, rename, f"{node.name}__{tag}_{kind}{b}") for n, kind in pairs]
        q_graph = helper.make_graph(copies, f"{tag}_q{b}", [], [self._out_info(f"{tag}_q{b}")], initializer=weights)
        lit = f"{tag}_is{b}"
        self.needed[lit] = helper.make_tensor(lit, TensorProto.INT64, [], [b])
        cond, res = f"{tag}_cond{b}", f"{tag}_sel{b}"
        equal = helper.make_node("Equal", [f"{tag}_bits", lit], [cond], name=f"{tag}_Equal{b}")
        if_node = helper.make_node("If", [cond], [res], name=f"{tag}_If{b}", then_branch=q_graph, else_branch=otherwise)
        return helper.make_graph([equal, if_node], f"{tag}_sel{b}", [], [self._out_info(res)])


class NBitsEngine:
    """One session over the switch model: any assignment ``{op: 4 | 8}`` (others float). With a
    :class:`~vlsens.sensitivity.suffix.SuffixCache`, an assignment runs from the cut of its
    earliest non-float op on (:mod:`vlsens.sensitivity.suffix`; the float prefix is cached)."""

    def __init__(self, switch_model: str | Path, ops: Sequence[str], samples, logits: bool, threads: int = 0,
                 suffix: SuffixCache | None = None):
        from vlsens.core.onnxutil import make_session

        self.ops = list(ops)
        self._index = {n: i for i, n in enumerate(self.ops)}
        self.session = make_session(switch_model, threads=threads)
        self.samples = samples
        self.logits = bool(logits)
        self.output = self.session.get_outputs()[0].name
        self.suffix = suffix
        skip = next((i for i in self.session.get_inputs() if i.name == SKIP_INPUT), None)
        self._no_skip = {SKIP_INPUT: np.zeros(skip.shape[0], dtype=bool)} if skip is not None else {}
        self.tied: tuple[str, Mapping[int, list]] | None = None

    def tie(self, op: str, feeds: Mapping[int, list]) -> None:
        """Evaluate ``op`` (lm_head) with its table: an assignment giving ``op`` b bits runs on
        ``feeds[b]`` (the evaluation feeds with every text row gathered from lm_head's weight at b
        bits, :func:`vlsens.precision.nbits.tied_feeds`) instead of the float feeds."""
        if self.suffix is not None:
            raise ValueError("a tied table changes the inputs: the suffix cache (float prefix) does not apply")
        if op not in self._index or set(feeds) != {FLOAT, *BITS}:
            raise ValueError(f"tie: {op} is not an op of the engine, or feeds for {sorted(feeds)} bits")
        self.tied = (op, feeds)

    def feeds(self, bits: Mapping[str, int]) -> list:
        return self.samples.feeds if self.tied is None else self.tied[1][bits.get(self.tied[0], FLOAT)]

    def vector(self, bits: Mapping[str, int]) -> np.ndarray:
        v = np.full(len(self.ops), FLOAT, dtype=np.int64)
        for name, b in bits.items():
            if b not in (FLOAT, *BITS):
                raise ValueError(f"{name}: {b} bits; valid: {(FLOAT, *BITS)}")
            v[self._index[name]] = b
        return v

    def outputs(self, bits: Mapping[str, int], cases: Sequence[int] | None = None):
        """The model's output on every feed (``cases``: on those feeds' indices alone, in that order)."""
        v = self.vector(bits)
        group = None
        if self.suffix is not None:
            group = self.suffix.plan.group_of([n for n, b in bits.items() if b != FLOAT])
        feeds = self.feeds(bits)
        for i in range(len(feeds)) if cases is None else cases:
            start = self.suffix.feed(group, i) if group is not None else self._no_skip
            yield self.session.run([self.output], {**feeds[i], BITS_INPUT: v, **start})[0]

    def evaluate(self, bits: Mapping[str, int], reference, cases: Sequence[int] | None = None) -> dict[str, float]:
        """Metrics against ``reference`` over every feed, or over the feeds ``cases`` (indices)."""
        acc = Metrics(self.logits)
        cases = range(len(self.samples.feeds)) if cases is None else cases
        for i, out in zip(cases, self.outputs(bits, cases), strict=True):
            acc.add(out, reference[i], self.samples.valid[i])
        return acc.result()

    def indices(self, names: Sequence[str] | None) -> list[int] | None:
        """The feeds' indices of the cases ``names`` (None: every feed)."""
        if names is None:
            return None
        where = {n: i for i, n in enumerate(self.samples.names)}
        missing = [n for n in names if n not in where]
        if missing:
            raise ValueError(f"cases {missing} are not in the evaluation set ({self.samples.names})")
        return sorted(where[n] for n in names)


class Prepared:
    """A prepared engine folder (``engine.json`` and the models)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.meta = json.loads((self.folder / FILES["meta"]).read_text())
        self.ops = [o["name"] for o in self.meta["ops"]]
        self.settings = NBitsSettings.from_config(self.meta["settings"])

    def session(self, eval_npz: str | Path, threads: int = 0, cache_dir: str | Path | None = None) -> NBitsEngine:
        """The engine on the evaluation set; with ``cache_dir`` (a private scratch folder) and a
        segmented switch model, the suffix engine (its cache filled there by one float pass)."""

        samples = self.samples(eval_npz)
        suffix = None
        plan = SuffixPlan.from_json(self.meta["suffix"]) if self.meta.get("suffix") else None
        if cache_dir is not None and plan is not None and plan.segments:
            suffix = SuffixCache.fill(self.folder / FILES["probe"], plan, samples.feeds, cache_dir, BITS_INPUT,
                                      len(self.ops), threads, mask_dtype=np.int64, basic=False)
        return NBitsEngine(self.folder / FILES["switch"], self.ops, samples, self.meta["logits"], threads, suffix)

    def samples(self, eval_npz: str | Path):
        """The evaluation set as the engine reads it (with its read positions where it computes
        the logits at those alone)."""
        from vlsens.data.samples import Samples

        samples = Samples.load(eval_npz, self.folder / FILES["float"])
        return at_read_rows(samples) if self.meta.get("read_rows") else samples

    def reference(self):
        from vlsens.data.samples import ReferenceStore

        return ReferenceStore(self.folder / FILES["reference"])


@dataclass(frozen=True)
class Quantizing:
    """How an engine's all-INT4 and all-INT8 models are quantized beside its settings:
    ``algorithms`` per width (4, 8) the MatMuls by another algorithm than ``settings.algorithm``
    (:func:`vlsens.quantize.nbits.quantize`), recorded in ``engine.json``; ``calibration`` the
    float model's calibration samples a data-aware algorithm reads (its SHA-256 recorded);
    ``reuse`` a :class:`vlsens.quantize.nbits.Reuse` (:func:`reuse_of` another engine of the same
    float weights and settings) whose data-free MatMuls are taken instead of quantized again."""

    algorithms: Mapping[int, Mapping[str, str]] | None = None
    calibration: object = None
    reuse: object = None


def prepare(base_model: str | Path, eval_npz: str | Path, engine_dir: str | Path, settings: NBitsSettings,
            threads: int = 0, *, logits: bool, suffix_cuts: int = 32, how: Quantizing = Quantizing()) -> dict:
    """Engine folder of ``base_model``: the float model, the all-INT4 and all-INT8 models (quantized
    as ``how`` says), the switch model (segmented for the suffix engine when ``suffix_cuts`` > 0,
    its probe beside it), the float reference on the evaluation set; ``engine.json`` written last."""
    from vlsens.core.artifacts import verify
    from vlsens.core.fsutil import savez_stream, write_json
    from vlsens.data.samples import Samples
    from vlsens.quantize.gptq import model_digest
    from vlsens.quantize.qdq import prepare_float_model

    t0 = time.perf_counter()
    d = Path(engine_dir)
    d.mkdir(parents=True, exist_ok=True)
    fl = prepare_float_model(verify(base_model), d / FILES["float"])
    ops = weight_matmuls(fl)
    if not ops:
        raise ValueError(f"no MatMul with a constant weight in {base_model}")
    names = [o["name"] for o in ops]
    log.info("quantizing all %d weight MatMuls to %s bits (%s, block %d)", len(names), " and ".join(map(str, BITS)),
             settings.algorithm, settings.block_size)
    algorithms, calibration = how.algorithms, how.calibration
    paths = {b: quantize(fl, d / FILES[f"q{b}"], dict.fromkeys(names, b), settings, algorithms=(algorithms or {}).get(b),
                         calibration=calibration, threads=threads, reuse=how.reuse) for b in BITS}
    t_q = time.perf_counter()
    log.info("quantized in %.0f s; building the switch model", t_q - t0)
    nodes = {b: quantized_nodes(p) for b, p in paths.items()}
    samples = Samples.load(eval_npz, fl)
    rows_read = logits and samples.read_only and all(v.shape[0] == 1 for v in samples.valid)
    build_switch_model(fl, paths, d / FILES["switch"], names, read_rows=rows_read)
    sp = build_suffix(d / FILES["switch"], d / FILES["probe"], SwitchMap(names, {}), suffix_cuts) if suffix_cuts > 0 \
        else None
    if sp is None:
        (d / FILES["probe"]).write_bytes(b"")
    eng = NBitsEngine(d / FILES["switch"], names, at_read_rows(samples) if rows_read else samples, logits, threads)
    log.info("switch session ready (%.0f s); float reference on %d evaluation samples", time.perf_counter() - t0,
             samples.count)
    savez_stream(d / FILES["reference"], eng.outputs({}))
    fb = float_bytes(ops)
    meta = {
        "engine": "nbits",
        "base_model": str(base_model),
        "float_digest": model_digest(base_model),
        "settings": settings.as_dict(),
        "algorithms": {str(b): dict(a) for b, a in (algorithms or {}).items() if a},
        **({"calibration": calibration_record(calibration)}
           if data_aware(a for per in (algorithms or {}).values() for a in per.values()) else {}),
        "logits": bool(logits),
        "read_rows": rows_read,
        "ops": [{**o, "bytes": {"float": fb[o["name"]], **{str(b): nodes[b][o["name"]]["bytes"] for b in BITS}}}
                for o in ops],
        "eval_samples": samples.count,
        "suffix": sp.to_json() if sp is not None else None,
        "seconds": {"quantize": t_q - t0, "total": time.perf_counter() - t0},
    }
    write_json(d / FILES["meta"], meta)
    return meta


def reuse_of(engine_dir: str | Path, float_model: str | Path):
    """The engine's all-INT4 and all-INT8 models as a :class:`vlsens.quantize.nbits.Reuse` for
    quantizing ``float_model`` (a plan's decoder takes its data-free MatMuls from them instead of
    quantizing them again), or None where the engine was prepared from other float weights (the
    content digest it recorded differs) or recorded none."""
    from vlsens.quantize.gptq import model_digest
    from vlsens.quantize.nbits import Reuse

    eng = Prepared(engine_dir)
    if eng.meta.get("float_digest") != model_digest(float_model):
        log.info("engine %s: prepared from other float weights than %s; nothing reused", engine_dir, float_model)
        return None
    return Reuse({b: eng.folder / FILES[f"q{b}"] for b in BITS}, eng.settings,
                 {int(b): dict(a) for b, a in eng.meta.get("algorithms", {}).items()},
                 {o["name"]: o["weight"] for o in eng.meta["ops"]})


def calibration_record(calibration) -> dict:
    """``{"file", "sha256"}`` of the calibration samples a data-aware algorithm read (a path or a
    :class:`vlsens.quantize.gptq.Calibration`): what a plan that takes the algorithm's weights
    names, and checks before it is rebuilt."""
    from vlsens.core.fsutil import file_sha256
    from vlsens.quantize.gptq import Calibration

    samples = Calibration.of(calibration).samples
    return {"file": str(samples), "sha256": file_sha256(samples)}


def sensitivity(engine_dir: str | Path, eval_npz: str | Path, out_csv: str | Path, out_json: str | Path,
                threads: int = 0, measured: int | None = None, price_on: Sequence[str] | None = None,
                errors: Mapping[str, Mapping[str, float]] | None = None) -> dict:
    """One row per weight MatMul: its error with only it at INT4, and at INT8 (the rest float),
    ranked by the INT4 error (KL per real token for logits, else 1 - cosine); plus the all-INT4
    and all-INT8 models' metrics in the sidecar JSON. ``measured`` below the MatMuls' number:
    only that many are measured so, the others estimated from their output errors on the same
    evaluation set (:mod:`vlsens.sensitivity.estimate`; the CSV's ``measured`` column, the JSON's
    ``estimate``). ``price_on``: the cases (names of the set's samples) every op alone is priced
    on, and its output error taken on, the uniform models' metrics staying on the whole set (JSON
    ``priced_on``). Not a setting of the workflow: on the 36-layer tiny checkpoint a subset
    misranks the MatMuls enough that the search's curve loses 1.2-4.5x in KL
    (``bench/bench_decoder_estimate.py --price-cases``; docs/plan.md, "Pricing on fewer cases does
    not pay"). ``errors``: the output errors the estimate reads, already computed on the whole
    evaluation set for this engine's weights (:func:`chosen_errors`), instead of a capture pass and
    an error pass of its own (JSON ``output_errors``)."""
    from vlsens.core.fsutil import staging_dir, write_csv, write_json

    eng_dir = Prepared(engine_dir)
    estimating = measured is not None and measured < len(eng_dir.ops)
    if errors is not None:
        _check_errors(errors, eng_dir, price_on)
    with staging_dir(out_csv) as scratch:  # the suffix cache: private to this job, removed after
        t0 = time.perf_counter()
        eng = eng_dir.session(eval_npz, threads, cache_dir=scratch)
        setup = time.perf_counter() - t0
        cases = eng.indices(price_on)
        feeds = eng.samples.feeds if cases is None else [eng.samples.feeds[i] for i in cases]
        given = errors is not None
        if estimating and not given:
            errors = _output_errors(eng_dir, feeds, scratch, threads)
        rows, per_op, totals = _score(eng_dir, eng, eng_dir.reference(), measured if estimating else None, errors,
                                      cases)
        priced_on = _priced_on(eng.samples, cases) if cases is not None else None
        del eng
    write_csv(out_csv, rows, CSV_COLUMNS + (LOGIT_COLUMNS if eng_dir.meta["logits"] else []) +
              (ESTIMATE_COLUMNS if estimating else []))
    summary = {
        "engine": "nbits",
        "ops": len(rows),
        "settings": eng_dir.meta["settings"],
        **totals,
        "bytes": {"float": sum(r["bytes_float"] for r in rows), "int4": sum(r["bytes_int4"] for r in rows),
                  "int8": sum(r["bytes_int8"] for r in rows)},
        "seconds_per_op": per_op,
        "suffix": bool(eng_dir.meta.get("suffix") and eng_dir.meta["suffix"]["segments"]),
        "setup_seconds": setup,
        **({"priced_on": priced_on} if priced_on else {}),
        **({"output_errors": "from the algorithm choice" if given else "computed"} if estimating else {}),
        "most_sensitive": [r["op"] for r in rows[:5]],
    }
    write_json(out_json, summary)
    return summary


def _output_errors(eng_dir: Prepared, feeds, scratch: str | Path, threads: int) -> dict:
    """Every MatMul's output error at each width on the evaluation feeds (:func:`vlsens.sensitivity.estimate.output_errors`)."""
    t0 = time.perf_counter()
    inputs = _capture_once(eng_dir, feeds, Path(scratch) / "inputs", threads)
    errors = _errors_by_output(eng_dir, inputs, BITS)
    for f in inputs.files.values():
        f.unlink(missing_ok=True)
    log.info("output errors of %d MatMuls at %s bits (%.0f s)", len(errors), "/".join(map(str, BITS)),
             time.perf_counter() - t0)
    return errors


def _check_errors(errors: Mapping[str, Mapping[str, float]], eng_dir: Prepared, price_on) -> None:
    """Given output errors must price every MatMul of the engine at every width, on the whole set."""
    if price_on is not None:
        raise ValueError("errors= are taken on the whole evaluation set: they cannot be priced on a subset (price_on)")
    names = [o["name"] for o in eng_dir.meta["ops"]]
    short = [n for n in names if set(map(str, BITS)) - set(errors.get(n, {}))]
    if short or set(errors) - set(names):
        raise ValueError(f"errors= do not match the engine {eng_dir.folder}'s MatMuls at {BITS} bits: "
                         f"missing {short[:5]}, not in it {sorted(set(errors) - set(names))[:5]}")


def chosen_errors(choice: Mapping, engine_dir: str | Path) -> dict[str, dict[str, float]] | None:
    """Each MatMul's output error at each width in the engine built with ``choice``
    (:func:`choose_algorithms` scored by output error): the chosen algorithm's own, computed there
    on the same float inputs (the whole evaluation set) and the same quantized MatMuls (the
    default's reused, a data-aware one's read from its store), so :func:`sensitivity` need not
    capture and compute them again. None where the choice was scored by measured error. Raises
    where the engine was not prepared from the choice's float weights or with its algorithms."""
    if choice.get("scored_by") != "output error":
        return None
    eng = Prepared(engine_dir)
    default, errors = choice["candidates"][0], choice["errors"]
    built = {str(b): dict(a) for b, a in eng.meta.get("algorithms", {}).items() if a}
    if built != {str(b): dict(a) for b, a in choice["chosen"].items() if a} or eng.settings.algorithm != default:
        raise ValueError(f"engine {engine_dir} was not built with the algorithm choice ({default}, "
                         f"{ {b: len(a) for b, a in choice['chosen'].items()} } ops by another): its output errors differ")
    return {op: {str(b): float(errors[choice["chosen"].get(str(b), {}).get(op, default)][op][str(b)]) for b in BITS}
            for op in errors[default]}


def _priced_on(samples, cases: Sequence[int]) -> dict:
    """Which cases of the set the ops alone were priced on, and their positions (a forward's cost)
    against the whole set's."""
    def positions(idx) -> int:
        return sum(int(samples.feeds[i]["inputs_embeds"].shape[1]) for i in idx)

    return {"cases": [samples.names[i] for i in cases], "of": len(samples.feeds), "positions": positions(cases),
            "positions_of": positions(range(len(samples.feeds)))}


def _score(eng_dir: Prepared, eng: NBitsEngine, ref, measured: int | None = None,
           errors: Mapping | None = None, cases: Sequence[int] | None = None) -> tuple[list[dict], float, dict]:
    """The ranked rows, seconds per op, and the all-INT4 / all-INT8 metrics (with ``measured``:
    only the ops :func:`vlsens.sensitivity.estimate.choose_measured` picks on ``errors`` measured,
    the others estimated, and the estimate's record under ``estimate``; ``cases``: the feeds every
    op alone is priced on, the uniform models on all)."""
    from vlsens.quantize.qdq import parse_op_name
    from vlsens.sensitivity.estimate import choose_measured, estimate_widths

    t0 = time.perf_counter()
    rows = []
    ops = eng_dir.meta["ops"]
    chosen = set(choose_measured({o: {"all": e["4"]} for o, e in errors.items()}, measured)) \
        if measured is not None else {o["name"] for o in ops}
    n = len(chosen)
    every = max(10, n // 10)  # about ten progress lines on a real-size decoder
    k = 0
    for o in ops:
        if o["name"] in chosen:
            if k and k % every == 0:
                done = time.perf_counter() - t0
                log.info("%d of %d ops scored (%.0f s, about %.0f s left)", k, n, done, done / k * (n - k))
            k += 1
        block, role = parse_op_name(o["name"], "MatMul")
        row = {"op": o["name"], "block": "" if block is None else block, "role": role, "K": o["K"], "N": o["N"],
               "bytes_float": o["bytes"]["float"], "measured": int(o["name"] in chosen)}
        for b in BITS:
            row[f"bytes_int{b}"] = o["bytes"][str(b)]
            if not row["measured"]:
                continue
            m = eng.evaluate({o["name"]: b}, ref, cases)
            row[f"error_int{b}"] = error(m, eng.logits)
            row[f"cosine_int{b}"] = m["cosine"]
            if eng.logits:
                row[f"kl_int{b}"], row[f"top1_int{b}"] = m["kl"], m["top1"]
        rows.append(row)
    per_op = (time.perf_counter() - t0) / max(n, 1)
    record = estimate_widths(rows, errors, BITS, eng.logits) if measured is not None else None
    rows.sort(key=lambda r: -r["error_int4"])
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    names = [r["op"] for r in rows]
    totals = {"all_int4": eng.evaluate(dict.fromkeys(names, 4), ref),
              "all_int8": eng.evaluate(dict.fromkeys(names, 8), ref)}
    return rows, per_op, ({**totals, "estimate": record} if record is not None else totals)


@dataclass(frozen=True)
class Scoring:
    """How every op is scored alone: through the suffix engine with ``suffix_cuts`` cuts (0: whole
    forwards), and by the engine for every op (``measured`` None) or for that many, the others by
    their output error (``plan.decoder_measured``, :func:`sensitivity`)."""

    suffix_cuts: int = 32
    measured: int | None = None


def keep_quantized(engine_dir: str | Path) -> None:
    """Leave of a prepared engine folder only what :func:`reuse_of` reads (``engine.json`` and the
    all-INT4 and all-INT8 models with their data files): the float copy, the switch model, the
    reference and the caches go (at 36 layers of 3B the float copy alone is 12.4 GB)."""
    from vlsens.core.onnxutil import data_path

    d = Path(engine_dir)
    keep = {FILES["meta"], *(n for b in BITS for n in (FILES[f"q{b}"], data_path(d / FILES[f"q{b}"]).name))}
    for p in d.iterdir():
        if p.name in keep:
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()


def choose_algorithms(base_model: str | Path, eval_npz: str | Path, settings: NBitsSettings, candidates: Sequence[str],
                      work: str | Path, threads: int = 0, *, logits: bool, scoring: Scoring = Scoring(),
                      calibration: str | Path | None = None) -> dict:
    """Per MatMul and width the algorithm (of ``candidates`` and ``settings.algorithm``) under which
    it alone costs the least: an engine per algorithm (:func:`prepare` in ``work``, removed after),
    every op at 4 and at 8 bits alone scored as :func:`sensitivity` scores it; a tie keeps
    ``settings.algorithm``. With ``scoring.measured`` below the MatMuls' number (``plan.decoder_measured``)
    each op is scored by its output error on the evaluation set instead
    (:func:`vlsens.sensitivity.estimate.output_errors`: for one op and width, the estimate of
    :func:`sensitivity` is one scale times it, so the algorithm of least output error is the one the
    estimate prices lowest); the uniform models are measured either way. The algorithms write the
    same ``MatMulNBits`` blocks, k_quant with zero points symmetric RTN omits (0.5 byte a block):
    the engine built with the choice reads each op's bytes from its graphs, so the search counts
    them. A data-aware candidate (``gptq``) reads ``calibration`` (the float model's calibration
    samples, not the evaluation set it is scored on), at
    :data:`~vlsens.quantize.nbits.DATA_AWARE_BITS` only. A candidate takes ops at a width only where
    every op at that width by it costs no more than every op by the default (``uniform``): errors
    alone do not add up. The default's quantized models stay in ``work`` (:func:`keep_quantized`):
    the candidates' other widths and the engine built with the choice take their MatMuls from them.
    ``{"candidates", "chosen": {width: {op: algorithm}} (only where not settings.algorithm),
    "errors": {algorithm: {op: {"4", "8"}}}, "uniform": {algorithm: {"4", "8"}}, "allowed":
    {width: [algorithm]}}``."""
    from dataclasses import replace

    default = settings.algorithm
    order = [default, *sorted(set(candidates) - {default})]
    if calibration is None and data_aware(order):
        raise ValueError(f"candidates {data_aware(order)} read calibration inputs: pass calibration=")
    errors: dict[str, dict] = {}
    uniform: dict[str, dict] = {}
    inputs = None  # estimating: every MatMul's input on the evaluation set, captured once
    for algo in order:
        d = Path(work) / algo
        widths = DATA_AWARE_BITS if algo in DATA_AWARE else BITS
        if algo in DATA_AWARE:  # per MatMul only: every one the default's engine holds, at its widths (the rest its)
            how = Quantizing({b: dict.fromkeys(errors[default], algo) for b in widths}, calibration,
                             reuse_of(d.parent / default, base_model))
            prepare(base_model, eval_npz, d, settings, threads, logits=logits, suffix_cuts=scoring.suffix_cuts, how=how)
        else:
            prepare(base_model, eval_npz, d, replace(settings, algorithm=algo), threads, logits=logits,
                    suffix_cuts=scoring.suffix_cuts)
        eng_dir = Prepared(d)
        eng, ref = eng_dir.session(eval_npz, threads, cache_dir=d / "cache"), eng_dir.reference()
        if scoring.measured is not None and scoring.measured < len(eng_dir.ops):
            inputs = inputs or _capture_once(eng_dir, eng.samples.feeds, Path(work) / "inputs", threads)
            errors[algo] = _errors_by_output(eng_dir, inputs, widths)
        else:
            errors[algo] = {o["name"]: {str(b): error(eng.evaluate({o["name"]: b}, ref), eng.logits) for b in widths}
                            for o in eng_dir.meta["ops"]}
        uniform[algo] = {str(b): error(eng.evaluate(dict.fromkeys(errors[algo], b), ref), eng.logits) for b in widths}
        del eng, ref
        keep_quantized(d) if algo == default else shutil.rmtree(d, ignore_errors=True)  # the default's: reused
        log.info("algorithm %s: every op alone scored at %s bits", algo, "/".join(map(str, widths)))
    allowed = {str(b): [a for a in order if str(b) in uniform[a] and uniform[a][str(b)] <= uniform[default][str(b)]]
               for b in BITS}
    chosen = _least(errors, allowed, default)
    log.info("per-op algorithms: %s (allowed per width: %s)", {b: len(c) for b, c in chosen.items()} or
             "every op keeps " + default, allowed)
    return {"candidates": order, "chosen": {str(b): c for b, c in chosen.items()}, "errors": errors,
            "uniform": uniform, "allowed": allowed, "scored_by": "measured error" if inputs is None else "output error"}


def _least(errors: Mapping[str, Mapping], allowed: Mapping[str, Sequence[str]], default: str) -> dict[int, dict[str, str]]:
    """Per width, each op whose least-error allowed algorithm is not ``default`` (a tie keeps it)."""
    chosen: dict[int, dict[str, str]] = {}
    for b in BITS:
        for op in errors[default]:
            best = min(allowed[str(b)], key=lambda a: (errors[a][op][str(b)], a != default))
            if best != default:
                chosen.setdefault(b, {})[op] = best
    return chosen


def _capture_once(eng_dir: Prepared, feeds, folder: Path, threads: int):
    """Every MatMul's input of the engine's float model over ``feeds``, in ``folder`` (the same float
    model in every algorithm's engine of :func:`choose_algorithms`: captured for the first, read for all)."""
    from vlsens.sensitivity.estimate import capture

    folder.mkdir(parents=True, exist_ok=True)
    return capture(eng_dir.folder / FILES["float"], [plain_feed(f) for f in feeds], eng_dir.meta["ops"], folder, threads)


def _errors_by_output(eng_dir: Prepared, inputs, widths: Sequence[int]) -> dict[str, dict[str, float]]:
    """Each op's output error at ``widths`` in the engine folder ``eng_dir`` (``inputs``: captured)."""
    from vlsens.sensitivity.estimate import output_errors

    return output_errors(inputs, eng_dir.folder / FILES["float"], {b: eng_dir.folder / FILES[f"q{b}"] for b in widths},
                         eng_dir.meta["ops"])


def error(metrics: Mapping[str, float], logits: bool) -> float:
    """The number an op is ranked and a profile is held to: KL per real token for logits, else
    1 - cosine."""
    return float(metrics["kl"]) if logits else 1.0 - float(metrics["cosine"])
