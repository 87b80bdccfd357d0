"""The end-to-end measure (:mod:`vlsens.deploy.genai.measure`) as one ONNX Runtime graph's
evaluation set: what a search over decoder weight assignments runs instead of building a folder
for each.

The measure teacher-forces a folder through onnxruntime-genai step by step with its KV cache: a
prefill of the prompt, then one token at a time. The decoder computes the same logits in one
prefill of the whole sequence (the prompt and the reference tokens but the last) with an empty
cache, read at the positions the runtime returns logits for: the prompt's last position and each
appended token's. :func:`decoder_feeds` writes those prefills with the fp32 folder's own pieces --
its multimodal processor, ``vision.onnx`` (one image per call, as the runtime calls it),
``embedding.onnx`` -- and the 3-D mRoPE positions of transformers' ``get_rope_index`` over the
whole sequence (the runtime's decode positions continue its prompt's the same way), as a
:class:`~vlsens.data.samples.Samples` file the decoder graph (or the nbits engine built on it)
evaluates. :func:`chain_kl` runs a decoder graph on it and scores it like the measure: KL against
the reference's log-probabilities per generated step, top-1 against the reference token.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from vlsens.core.errors import VlsensError
from vlsens.deploy.genai import folder as genai
from vlsens.deploy.genai.measure import _check_cases, _paths, _row, load_reference
from vlsens.deploy.measure import kl_steps

_NUMPY = {1: np.float32, 6: np.int32, 7: np.int64, 10: np.float16, 11: np.float64}


def _signature(model: str | Path) -> tuple[list[tuple[str, int]], list[str]]:
    """``([(input, element type)], [output names])`` of a graph (its weights not loaded)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    return [(i.name, i.type.tensor_type.elem_type) for i in m.graph.input], [o.name for o in m.graph.output]


def _source_decoder(folder: Path) -> Path:
    """The decoder variant graph a deploy folder's ``decoder.onnx`` was copied from (its record)."""
    from vlsens.core import paths

    record = folder / paths.RECORD
    if not record.is_file():
        raise VlsensError(f"{record}: no record naming the decoder graph {folder} was built from")
    src = json.loads(record.read_text()).get("sources", {}).get("decoder")
    if not src:
        raise VlsensError(f"{record} names no decoder source graph")
    return Path(src)


def check_same_graph(folder: str | Path, decoder_graph: str | Path | None = None) -> dict[str, int]:
    """The deploy folder's decoder inputs ``{name: element type}``, after checking that
    ``decoder_graph`` (default: the variant graph the folder's record names as its source) takes
    the same inputs and gives the same outputs: an evaluation set written for the folder runs on it."""
    folder = Path(folder)
    src = Path(decoder_graph) if decoder_graph is not None else _source_decoder(folder)
    if not src.is_file():
        raise VlsensError(f"{src}: the decoder graph of {folder} is not there")
    mine, theirs = _signature(folder / genai.GRAPHS["decoder"]), _signature(src)
    if mine != theirs:
        raise VlsensError(f"{folder}/{genai.GRAPHS['decoder']} and {src} differ in their inputs or outputs: "
                          f"{mine} against {theirs}")
    return dict(mine[0])


def _processed(folder: Path, cases: list[dict]) -> list[dict[str, np.ndarray]]:
    """The folder's own multimodal processor on each case's chat text and images (``input_ids``,
    and ``pixel_values`` / ``image_grid_thw`` where it has images). The folder's sessions are
    released before the caller's open."""
    from vlsens.deploy.genai.runtime import Chat

    chat = Chat(folder, prepack=False, provider="cpu")
    out = []
    try:
        for case in cases:
            paths = _paths(case)
            inputs = chat.inputs(chat.prompt(case["prompt"], len(paths)), paths)
            p = {"input_ids": np.asarray(inputs["input_ids"].as_numpy(), np.int64)}
            if paths:
                p["pixel_values"] = np.asarray(inputs["pixel_values"].as_numpy())
                p["image_grid_thw"] = np.asarray(inputs["image_grid_thw"].as_numpy(), np.int64).reshape(-1, 3)
            out.append(p)
    finally:
        chat.close()
    return out


def _image_patches(pixels: np.ndarray, grid: np.ndarray) -> list[np.ndarray]:
    """Each image's patches of the processor's ``pixel_values``: with several images it pads each
    image's patches with zero rows to the largest image's count (``(images x most patches, 1176)``);
    patches simply concatenated are read too."""
    counts = [int(n) for n in grid.prod(-1)]
    pixels = pixels.reshape(-1, pixels.shape[-1])
    if len(pixels) == len(counts) * max(counts):
        starts = [k * max(counts) for k in range(len(counts))]
    elif len(pixels) == sum(counts):
        starts = [int(s) for s in np.cumsum([0, *counts[:-1]])]
    else:
        raise VlsensError(f"{len(pixels)} patch rows for image grids {grid.tolist()}: neither padded per image nor "
                          "concatenated")
    return [pixels[s:s + n] for s, n in zip(starts, counts)]


def _features(session, processed: dict, hidden: int) -> np.ndarray:
    """``vision.onnx`` one image per call (its ``image_grid_thw`` is (1, 3)), features concatenated
    in image order; (0, hidden) without images."""
    if "image_grid_thw" not in processed:
        return np.zeros((0, hidden), np.float32)
    grid = processed["image_grid_thw"]
    types = {i.name: i.type for i in session.get_inputs()}
    dtype = np.float16 if types["pixel_values"] == "tensor(float16)" else np.float32
    feats = [session.run(None, {"pixel_values": p.astype(dtype), "image_grid_thw": grid[k:k + 1]})[0]
             for k, p in enumerate(_image_patches(processed["pixel_values"], grid))]
    return np.concatenate(feats).astype(np.float32)


def _empty_past(decoder: dict, types: dict[str, int]) -> dict[str, np.ndarray]:
    """The decoder's past key values of length 0, named and sized as ``genai_config.json`` says."""
    shape = (1, int(decoder["num_key_value_heads"]), 0, int(decoder["head_size"]))
    names = [decoder["inputs"][k] % i for i in range(int(decoder["num_hidden_layers"]))
             for k in ("past_key_names", "past_value_names")]
    missing = [n for n in names if n not in types]
    if missing:
        raise VlsensError(f"the decoder has no input {missing[0]} (genai_config.json names it)")
    return {n: np.zeros(shape, _NUMPY[types[n]]) for n in names}


def _mask_and_positions(sequence: np.ndarray, processed: dict, image_token_id: int, checkpoint) -> dict[str, np.ndarray]:
    """The decoder's ``attention_mask`` and 3-D ``position_ids`` of one whole sequence (1, S)."""
    from vlsens.deploy.genai.runtime import rope_positions

    mask = np.ones_like(sequence, dtype=np.int64)
    rope = {"input_ids": sequence, "attention_mask": mask,
            "mm_token_type_ids": (sequence == image_token_id).astype(np.int64)}
    if "image_grid_thw" in processed:
        rope["image_grid_thw"] = processed["image_grid_thw"]
    return {"attention_mask": mask, "position_ids": rope_positions(checkpoint, rope)}


def _sequence(processed: dict, tokens) -> np.ndarray:
    """A case's whole sequence (1, S) as one prefill: its prompt and the reference tokens but the
    last (the runtime appends each, and reads the logits after it)."""
    return np.concatenate([processed["input_ids"].reshape(1, -1), np.asarray(tokens, np.int64)[None, :-1]], axis=1)


def _sequence_feed(sequence: np.ndarray, processed: dict, pieces: dict, checkpoint) -> dict[str, np.ndarray]:
    """The decoder's prefill inputs of one whole sequence (1, S): embeddings with the image
    features, 3-D positions, mask; the past key values are the caller's."""
    feats = _features(pieces["vision"], processed, pieces["hidden"])
    embeds = pieces["embedding"].run(None, {"input_ids": sequence, "image_features": feats})[0]
    return {"inputs_embeds": embeds, **_mask_and_positions(sequence, processed, pieces["image_token_id"], checkpoint)}


def _pieces(folder: Path, threads: int) -> dict:
    """The folder's vision and embedding sessions and what the feeds need of its configuration."""
    from vlsens.core.onnxutil import make_session

    model = json.loads((folder / "genai_config.json").read_text())["model"]
    return {"vision": make_session(folder / genai.GRAPHS["vision"], threads=threads),
            "embedding": make_session(folder / genai.GRAPHS["embedding"], threads=threads),
            "hidden": int(model["decoder"]["hidden_size"]), "image_token_id": int(model["image_token_id"]),
            "decoder": model["decoder"]}


def _typed(feed: dict[str, np.ndarray], types: dict[str, int]) -> dict[str, np.ndarray]:
    """``feed`` in the decoder's input types; VlsensError unless it holds exactly its inputs."""
    if set(feed) != set(types):
        raise VlsensError(f"the decoder takes inputs {sorted(types)}, the feed holds {sorted(feed)}")
    return {k: np.asarray(v, _NUMPY[types[k]]) for k, v in feed.items()}


def decoder_feeds(folder: str | Path, reference_npz: str | Path, cases: list[dict], checkpoint: str | Path,
                  out_npz: str | Path, decoder_graph: str | Path | None = None, threads: int = 0) -> dict:
    """The measure's cases as the decoder graph's evaluation set, written atomically to
    ``out_npz`` (:meth:`Samples.save <vlsens.data.samples.Samples.save>`, one feed per case in the
    reference's order, named by case): the prefill of the prompt and the reference tokens but the
    last, computed with the fp32 deploy ``folder``'s own processor, vision and embedding graphs,
    an empty cache, and ``valid`` at the positions whose logits the runtime's teacher forcing
    returns (one per reference token), the only ones it returns (``read_only``: engine nbits
    computes lm_head there alone). ``decoder_graph``: the graph the set is for (default: the
    one the folder's record names), checked to take the inputs of the folder's decoder. Returns
    facts: cases, positions, per case its prompt, sequence and step counts."""
    t0 = time.perf_counter()
    folder = Path(folder)
    types = check_same_graph(folder, decoder_graph)
    index, _ = load_reference(reference_npz)
    ordered = _check_cases(index, cases, reference_npz)
    processed = _processed(folder, ordered)
    pieces = _pieces(folder, threads)
    past = _empty_past(pieces["decoder"], types)
    feeds, valid, rows = [], [], []
    for ref, proc in zip(index["cases"], processed):
        prompt = proc["input_ids"].reshape(1, -1)
        tokens = np.asarray(ref["tokens"], np.int64)
        sequence = _sequence(proc, tokens)
        feed = {**_sequence_feed(sequence, proc, pieces, checkpoint), **past}
        feeds.append(_typed(feed, types))
        mask = np.zeros(sequence.shape, bool)
        mask[0, prompt.shape[1] - 1:] = True
        valid.append(mask)
        rows.append({"name": ref["name"], "prompt": int(prompt.shape[1]), "sequence": int(sequence.shape[1]),
                     "steps": int(tokens.size)})
    from vlsens.data.samples import Samples

    Samples(feeds, valid, [r["name"] for r in rows], read_only=True).save(out_npz)
    return {"folder": str(folder), "reference": str(reference_npz), "cases": len(rows),
            "positions": int(sum(r["steps"] for r in rows)), "per_case": rows, "seconds": time.perf_counter() - t0}


def chain_kl(decoder_graph: str | Path, feeds_npz: str | Path, reference_npz: str | Path, threads: int = 0) -> list[dict]:
    """``decoder_graph`` (a plain ONNX Runtime session) on every feed of :func:`decoder_feeds`:
    per case (the feeds' order) its logits at the valid positions against the reference's
    log-probabilities, as :func:`~vlsens.deploy.genai.measure.measure_folder`'s rows (mean and max
    KL over the steps, top-1 agreement with the reference token, steps) plus the seconds it took."""
    from vlsens.core.onnxutil import make_session
    from vlsens.data.samples import Samples

    samples = Samples.load(feeds_npz)
    index, logps = load_reference(reference_npz)
    refs = {c["name"]: (c, logp) for c, logp in zip(index["cases"], logps)}
    if sorted(samples.names) != sorted(refs):
        raise VlsensError(f"{feeds_npz} holds cases {samples.names}, the reference {reference_npz} {sorted(refs)}")
    session = make_session(decoder_graph, threads=threads)
    output = session.get_outputs()[0].name
    rows = []
    for feed, valid, name in zip(samples.feeds, samples.valid, samples.names):
        t0 = time.perf_counter()
        q = session.run([output], feed)[0][valid]
        case, logp = refs[name]
        if q.shape[0] != len(case["tokens"]):
            raise VlsensError(f"case {name}: {q.shape[0]} valid positions for {len(case['tokens'])} reference tokens")
        kl = kl_steps(logp, q)
        rows.append({"name": name, "modality": case["modality"], "kl": float(kl.mean()), "max_kl": float(kl.max()),
                     "top1": float(np.mean(q.argmax(-1) == np.asarray(case["tokens"]))), "steps": int(kl.size),
                     "seconds": time.perf_counter() - t0})
    return rows


#: How a measure record the chain writes was run (its ``runner``; the runtime's own measure has none).
RUNNER = ("the part chain: the folder's own processor, vision, embedding and decoder graphs as plain ONNX Runtime "
          "sessions, each case one prefill read at the runtime's teacher-forced steps, lm_head computed there alone "
          "(equal to onnxruntime-genai's measure of the folder within the kernels' rounding, tests/test_chain.py)")

#: The part chain's decoder input: the positions of a case whose logits are read (:func:`read_rows_session`).
READ_POSITIONS = "vlsens_read_positions"


def read_rows_session(decoder: str | Path, threads: int = 0):
    """``(session, True)``: the decoder graph computing its logits (its first output) only at the
    positions fed as :data:`READ_POSITIONS` -- the node that writes them (lm_head: ``MatMul`` or
    ``MatMulNBits``) reads ``Gather(x, positions, axis=1)`` of its input ``x`` -- changed in memory,
    its data read from the graph's folder (the folder's files untouched). Each row of lm_head is
    its own dot products, so the rows kept are the whole graph's there within the kernel's
    rounding; lm_head over Qwen's 151 936-token vocabulary is computed at every position of a
    case's prefill while the measure reads its answer's (192 of 2 637 positions on the default
    cases). ``(session of the graph as it is, False)`` where the logits are written by another node."""
    import onnx

    from vlsens.core.onnxgraph import gather_rows_before
    from vlsens.core.onnxutil import make_session

    decoder = Path(decoder)
    m = onnx.load(str(decoder), load_external_data=False)
    logits = m.graph.output[0]
    head = next((n for n in m.graph.node if logits.name in n.output), None)
    if head is None or head.op_type not in ("MatMul", "MatMulNBits"):
        return make_session(decoder, threads=threads), False
    m.graph.input.append(gather_rows_before(m, head, READ_POSITIONS))
    dims = logits.type.tensor_type.shape.dim
    if len(dims) == 3:
        dims[1].Clear()
        dims[1].dim_param = "read_positions"
    return make_session(m, threads=threads, data_dir=decoder.parent), True


class PartChain:
    """A deploy ``folder``'s measure, as is or with one part changed -- its vision graph or its
    embedding graph -- as plain ONNX Runtime sessions instead of the folder (or one assembled for
    the change) through onnxruntime-genai: what the whole-VLM plan prices every vision and
    embedding format on in the fp32 folder (:mod:`vlsens.budget.vision`,
    :func:`vlsens.budget.build.measure_components`), and each plan folder's own measure
    (:func:`vlsens.budget.build.plan_job`).

    The cases (``modalities``: only those of these, as
    :func:`~vlsens.deploy.genai.measure.measure_folder` takes it) are processed once by the folder's
    own processor, their 3-D positions computed once, and the folder's decoder and embedding
    sessions opened once for every call (the measure opens the whole folder anew for each). A
    call runs the changed vision graph once per distinct image (a case's images are the
    processor's patches of its files; the measure runs each case's), the embedding graph and one
    prefill of each case's prompt and reference tokens but the last with an empty cache, read at
    the positions the runtime's teacher forcing returns (:func:`decoder_feeds`' sequences), lm_head
    computed at those alone (:func:`read_rows_session`; ``read_rows``). Equal
    to the measure of the folder so assembled within the kernels' rounding (``tests/test_chain.py``).

    Memory: the folder's decoder and embedding sessions (the fp32 folder's float32 weights:
    12.8 GB peak at Qwen2.5-VL-3B with the decoder alone), the (changed) vision graph's session while its features
    are computed (closed before the decoder runs), one case's prefill activations and logits
    (sequence x vocabulary x 4 bytes)."""

    def __init__(self, folder: str | Path, reference_npz: str | Path, cases: list[dict], checkpoint: str | Path,
                 threads: int = 0, modalities: set[str] | None = None):
        from vlsens.core.onnxutil import make_session

        self.folder, self.threads = Path(folder), threads
        self.types = dict(_signature(self.folder / genai.GRAPHS["decoder"])[0])  # the folder's own decoder runs
        index, logps = load_reference(reference_npz)
        ordered = _check_cases(index, cases, reference_npz)
        keep = [i for i, c in enumerate(ordered) if modalities is None or c["modality"] in modalities]
        if not keep:
            raise VlsensError(f"none of the cases is of modalities {sorted(modalities or ())}: nothing to measure")
        self.cases = [ordered[i] for i in keep]
        self.refs, self.logps = [index["cases"][i] for i in keep], [logps[i] for i in keep]
        self.max_new_tokens = index["max_new_tokens"]
        self.processed = _processed(self.folder, self.cases)
        model = json.loads((self.folder / "genai_config.json").read_text())["model"]
        self.hidden, self.image_token_id = int(model["decoder"]["hidden_size"]), int(model["image_token_id"])
        past = _empty_past(model["decoder"], self.types)
        self.sequences = [_sequence(proc, ref["tokens"]) for ref, proc in zip(self.refs, self.processed)]
        self.fixed = [{**_mask_and_positions(seq, proc, self.image_token_id, checkpoint), **past}
                      for seq, proc in zip(self.sequences, self.processed)]
        self.embedding = make_session(self.folder / genai.GRAPHS["embedding"], threads=threads)
        self.decoder, self.read_rows = read_rows_session(self.folder / genai.GRAPHS["decoder"], threads)
        self.output = self.decoder.get_outputs()[0].name
        self._fp32_features: list[np.ndarray] | None = None

    def _features(self, vision: Path) -> list[np.ndarray]:
        """Each case's image features from the folder-form ``vision`` graph (:func:`_features`),
        every distinct image (its patches and grid) run once; the session closed after."""
        import hashlib

        from vlsens.core.onnxutil import make_session

        session, seen, out = make_session(vision, threads=self.threads), {}, []
        for proc in self.processed:
            if "image_grid_thw" not in proc:
                out.append(np.zeros((0, self.hidden), np.float32))
                continue
            grid = proc["image_grid_thw"]
            feats = []
            for k, patches in enumerate(_image_patches(proc["pixel_values"], grid)):
                key = hashlib.sha1(np.ascontiguousarray(patches).tobytes() + grid[k].tobytes()).hexdigest()
                if key not in seen:
                    seen[key] = _features(session, {"pixel_values": patches, "image_grid_thw": grid[k:k + 1]},
                                          self.hidden)
                feats.append(seen[key])
            out.append(np.concatenate(feats))
        del session
        return out

    def measure(self, name: str, vision: str | Path | None = None, embedding: str | Path | None = None) -> dict:
        """The measure (:func:`~vlsens.deploy.genai.measure.measure_folder`'s record: per case
        its mean and max KL over the steps, top-1, steps; their summary, ``runner``: :data:`RUNNER`)
        of the folder as it is, or with ``vision`` (a folder-form vision graph: :func:`~vlsens.deploy.genai.folder.wrap_vision`'s)
        and / or ``embedding`` (an embedding graph) in place of its own. ``bytes``: the folder's
        graph bytes with the changed part's as given (a folder's graph names its data file after
        itself: a graph so named, ``embedding.onnx``, counts as the folder ships it)."""
        from vlsens.core.onnxutil import make_session, model_bytes
        from vlsens.deploy.genai.measure import POSITIONS, REFERENCE, folder_weight_bytes
        from vlsens.deploy.measure import summarize

        t0 = time.perf_counter()
        nbytes = folder_weight_bytes(self.folder)
        if vision is None:
            if self._fp32_features is None:
                self._fp32_features = self._features(self.folder / genai.GRAPHS["vision"])
            features = self._fp32_features
        else:
            features = self._features(Path(vision))
            nbytes += model_bytes(vision) - model_bytes(self.folder / genai.GRAPHS["vision"])
        table = self.embedding
        if embedding is not None:
            table = make_session(embedding, threads=self.threads)
            nbytes += model_bytes(embedding) - model_bytes(self.folder / genai.GRAPHS["embedding"])
        rows = []
        for case, ref, logp, sequence, fixed, feats in zip(self.cases, self.refs, self.logps, self.sequences,
                                                            self.fixed, features):
            embeds = table.run(None, {"input_ids": sequence, "image_features": feats})[0]
            feed = _typed({"inputs_embeds": embeds, **fixed}, self.types)
            start = sequence.shape[1] - len(ref["tokens"])  # the answer's steps: the logits read
            if self.read_rows:
                feed[READ_POSITIONS] = np.arange(start, sequence.shape[1], dtype=np.int64)
                q = self.decoder.run([self.output], feed)[0][0]
            else:
                q = self.decoder.run([self.output], feed)[0][0, start:]
            rows.append(_row(case, logp, ref["tokens"], q))  # as the measure scores a case
        return {"folder": name, "reference": REFERENCE, "runner": RUNNER,
                "positions": POSITIONS, "max_new_tokens": self.max_new_tokens, "bytes": nbytes,
                **summarize(rows), "cases": rows, "seconds": time.perf_counter() - t0}
