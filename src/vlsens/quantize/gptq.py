"""GPTQ for ``MatMulNBits`` weights: a data-aware INT4 / INT8 weight-only algorithm per MatMul.

GPTQ (Frantar et al., 2022) quantizes a weight ``W`` (K x N, ``y = x W``) one input row at a time
and spreads each row's rounding error onto the rows not yet quantized through the inverse of the
Hessian ``H = X^T X`` of the MatMul's calibration inputs ``X``, so that ``||X (W_q - W)||`` is
small rather than ``||W_q - W||``. The loop is the reference one (blocks of 128 rows, the error of
a block pushed onto the rest at once, dampening 1 % of the mean diagonal, rows in their order) as
ONNX Runtime's vendored copy runs it (``onnxruntime.quantization.neural_compressor.gptq``), with
one difference: each block's scale and zero point are fixed when GPTQ reaches the block, by the
rule round to nearest uses (:func:`onnxruntime.quantization.neural_compressor.weight_only.quant_tensor`:
symmetric ``2 max|w| / 15`` around 8, or asymmetric min / max), and the integer codes are written
as they are. ONNX Runtime's copy instead fake-quantizes, then quantizes the result again by round
to nearest (a second rounding where the two grids differ) and writes INT8 as a float MatMul. So:
with no correlation between inputs (``H`` diagonal) GPTQ here is round to nearest code for code
(test), and both widths are ``MatMulNBits`` blocks like every other algorithm's.

The Hessians come from the float model itself: one pass over the calibration samples with every
quantized MatMul's input added to the outputs (a graph-only copy reading the model's own data
file), each input's rows appended to a scratch file, then per input ``X^T X`` in float64. Memory:
one sample's captured inputs (tokens x the sum of the distinct inputs' widths, float32) during the
pass; then the largest ``K x K`` Hessian in float64 (three: it, its inverse, the factor), its rows
``X``, one weight and ``K x 8192`` of it in float64. Disk: the
captured rows, tokens x sum of widths x 4 bytes (about 2.5 GB per 1 000 calibration tokens for a
36-layer 3B decoder).

A MatMul's GPTQ codes are a function of its weight, the Hessian (the float model upstream of it and
the calibration samples) and the format, so a run computes each once: a :class:`Store` keeps them
per MatMul in a folder, keyed by the float model's published content, the samples' SHA-256, the
MatMul, its shape, width, block size and symmetry and this loop's constants (:data:`FORMAT`). The
sensitivity engine of the plan fills it; the jobs after it (the engine built with the choice, each
plan's decoder) read their MatMuls from it and compute only what it lacks (the same codes either way,
test).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlsens.quantize.scale_estimation import grid

log = logging.getLogger(__name__)

#: fraction of the mean Hessian diagonal added to it (GPTQ's ``percdamp``, ONNX Runtime's default)
DAMP = 0.01
#: rows a lazy update covers (GPTQ's ``blocksize``; a multiple of the quantization block)
ROWS = 128
#: output columns quantized at a time (they do not interact)
COLUMNS = 8192
#: the version of the codes a :class:`Store` holds: raised whenever :func:`codes` gives other codes
FORMAT = 2  # 2: the factor by a triangular inverse (up to 0.4 % of the codes differ from 1's, same output error)


class Store:
    """GPTQ codes per MatMul kept in ``folder`` (one ``.npz`` of plain arrays per MatMul and
    format, written atomically: INT4 codes two a byte, the scales and zero points; about the
    quantized weight's bytes), for the float model ``source`` (a published model: its record's
    SHA-256s name it, else its files are hashed) and the calibration ``samples``. ``writable``:
    whether codes computed here are added (a job writes only into its own outputs)."""

    def __init__(self, folder: str | Path, source: str | Path, samples: str | Path, writable: bool = False):
        from vlsens.core.fsutil import file_sha256

        self.folder, self.writable = Path(folder), writable
        self.base = {"format": FORMAT, "damp": DAMP, "rows": ROWS, "float": model_digest(source),
                     "calibration": file_sha256(samples)}
        if writable:
            self.folder.mkdir(parents=True, exist_ok=True)
        elif not self.folder.is_dir():
            raise FileNotFoundError(f"GPTQ store {self.folder}: not a folder")

    def path(self, op: Mapping, bits: int, settings, algorithm: str = "gptq") -> Path:
        key = {**self.base, "op": op["name"], "K": op["K"], "N": op["N"], "bits": int(bits),
               "block_size": settings.block_size, "symmetric": bool(settings.symmetric)}
        if algorithm != "gptq":  # GPTQ's keys are those of the stores written before other algorithms
            key["algorithm"] = algorithm
        return self.folder / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:40] + ".npz")

    def load(self, op: Mapping, bits: int, settings, algorithm: str = "gptq") -> tuple[np.ndarray, ...] | None:
        """The codes, scales and zero points of ``op`` at ``bits``, and AWQ's ``1 / s`` where the
        algorithm has one (None when not kept)."""
        p = self.path(op, bits, settings, algorithm)
        if not p.is_file():
            return None
        with np.load(p, allow_pickle=False) as z:
            q = z["q"]
            if bits == 4:  # two codes a byte, the even one low
                q = np.stack([q & 15, q >> 4], axis=-1).reshape(*q.shape[:-1], 2 * q.shape[-1])
            return (q, z["scales"], z["zeros"], *((z["inverse"],) if "inverse" in z.files else ()))

    def save(self, op: Mapping, bits: int, settings, got: Sequence[np.ndarray], algorithm: str = "gptq") -> None:
        """Keep ``got`` (codes, scales, zero points and, for AWQ, ``1 / s``) for ``op`` at ``bits``."""
        from vlsens.core.fsutil import savez

        if self.writable:
            q = got[0]
            packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8) if bits == 4 else q
            arrays = {"q": packed, "scales": got[1], "zeros": got[2], **({"inverse": got[3]} if len(got) > 3 else {})}
            savez(self.path(op, bits, settings, algorithm), arrays)


def model_digest(model: str | Path) -> str:
    """A SHA-256 that names ``model``'s content, graph and weights: from its record once
    :func:`vlsens.core.artifacts.verify` passes (no rehash), else from its files (and its data
    file where it has one); the same either way."""
    from vlsens.core.artifacts import find_record, verify
    from vlsens.core.fsutil import file_sha256
    from vlsens.core.onnxutil import data_path

    model = Path(model)
    found = find_record(model)
    if found is not None:
        verify(model)
        parts = [found[1]["files"][p.name]["sha256"] for p in (model, data_path(model)) if p.name in found[1]["files"]]
    else:
        parts = [file_sha256(p) for p in (model, data_path(model)) if p.is_file()]
    return hashlib.sha256(" ".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class Calibration:
    """What GPTQ reads beside the weights: the calibration ``samples`` (a Samples npz of the float
    model's inputs) and the run's :class:`Store` (None: the codes are computed and not kept)."""

    samples: Path
    store: Store | None = None

    @classmethod
    def of(cls, calibration: str | Path | Calibration | None) -> Calibration | None:
        """``calibration`` as a Calibration (a path: its samples, no store)."""
        if calibration is None or isinstance(calibration, Calibration):
            return calibration
        return cls(Path(calibration))


def codes(weight: np.ndarray, hessian: np.ndarray | None, bits: int, block_size: int, symmetric: bool,
          damp: float = DAMP, estimate_scales: bool = False,
          factored: tuple[np.ndarray | None, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ of ``weight`` (K x N) against ``hessian`` (K x K; ``None``: round to nearest): the codes
    (N x k_blocks x block_size, uint8, padded rows included), the scales (N x k_blocks, float32) and
    the zero points (N x k_blocks, uint8), in ``MatMulNBits``' block order. Output columns do not
    interact, so they are quantized :data:`COLUMNS` at a time (the same codes, test): the float64
    copy is K x COLUMNS, not K x N (2.5 GB for a 3B lm_head). ``estimate_scales``: each block's scale
    chosen by scale estimation (:func:`vlsens.quantize.scale_estimation.block_scale`, on the block's
    weights as GPTQ has updated them and the block's diagonal block of ``hessian``) instead of round
    to nearest's rule. ``factored``: :func:`factor` of ``hessian`` at this block size and ``damp``,
    where the caller has it (the MatMuls of one input)."""
    k, n = weight.shape
    blocks = -(-k // block_size)
    kp = blocks * block_size
    hinv, dead = factored if factored is not None else factor(hessian, k, kp, damp)
    if dead.shape != (kp,):
        raise ValueError(f"factored: a factor of {dead.shape[0]} rows for a {k}-row weight in blocks of {block_size}")
    q = np.zeros((n, blocks, block_size), np.uint8)
    scales, zeros = np.zeros((n, blocks), np.float32), np.zeros((n, blocks), np.uint8)
    for c0 in range(0, n, COLUMNS):
        c1 = min(c0 + COLUMNS, n)
        w = np.zeros((kp, c1 - c0), np.float64)
        w[:k] = weight[:, c0:c1]
        w[dead] = 0.0
        pick = _estimated(hessian, k, bits, symmetric) if estimate_scales and hessian is not None else None
        cq, cs, cz = _rows(w, hinv, bits, block_size, symmetric, pick)
        q[c0:c1] = cq.T.reshape(c1 - c0, blocks, block_size)
        scales[c0:c1], zeros[c0:c1] = cs.T, cz.T
    return q, scales, zeros


def factor(hessian: np.ndarray | None, k: int, kp: int, damp: float = DAMP) -> tuple[np.ndarray | None, np.ndarray]:
    """The upper Cholesky factor ``U`` of the dampened inverse Hessian (``H^-1 = U^T U``, padded to
    ``kp`` rows; row i holds what row i's error moves) and the rows no input reaches (``None`` and
    none without a Hessian). MatMuls that read one input share it (:func:`codes`' ``factored``).

    With ``J`` the reversal of the rows, ``J H J = L L^T`` (``L`` lower) gives ``U = J L^-1 J``: a
    Cholesky factorization and a triangular inverse, about ``2/3 K^3`` multiply-adds, where the
    inverse and then the Cholesky factor of it took about ``7/3 K^3`` (the same factor to 1e-11
    relative, test; 2.4x faster for the 11008-wide Hessian of a 3B down projection,
    ``bench/bench_gptq_factor.py``). GPTQ's row loop carries a rounding tie's other outcome onto
    every later row, so up to 0.4 % of the codes differ from the old factor's, at the same output
    error on the calibration rows (0.999-1.001x, the same bench)."""
    from scipy.linalg import cholesky, lapack

    if hessian is None:
        return None, np.zeros(kp, bool)
    h = np.zeros((kp, kp), np.float64)
    h[:k, :k] = hessian
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h[np.diag_indices(kp)] += damp * np.mean(np.diag(h))
    low = cholesky(np.ascontiguousarray(h[::-1, ::-1]), lower=True, overwrite_a=True, check_finite=False)
    del h
    inv, info = lapack.dtrtri(low, lower=1, overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"the dampened Hessian's Cholesky factor is singular (LAPACK dtrtri info {info})")
    return np.ascontiguousarray(inv[::-1, ::-1]), dead


def _estimated(hessian: np.ndarray, k: int, bits: int, symmetric: bool):
    """A block's scale and zero point by scale estimation on ``hessian``'s diagonal block (rows r..)."""
    from vlsens.quantize.scale_estimation import block_scale

    def pick(w: np.ndarray, r: int):
        h = np.zeros((w.shape[0], w.shape[0]))
        m = max(0, min(k, r + w.shape[0]) - r)
        h[:m, :m] = hessian[r:r + m, r:r + m]
        return block_scale(w, h, bits, symmetric)

    return pick


def _rows(w: np.ndarray, hinv: np.ndarray | None, bits: int, block_size: int, symmetric: bool, pick=None):
    """GPTQ's row loop over ``w`` (kp x columns, float64, changed in place): codes (kp x columns),
    scales and zero points (k_blocks x columns)."""
    kp, n = w.shape
    maxq = (1 << bits) - 1
    q = np.zeros((kp, n), np.uint8)
    scales, zeros = np.zeros((kp // block_size, n), np.float32), np.zeros((kp // block_size, n), np.uint8)
    step = block_size * max(1, ROWS // block_size)
    for i1 in range(0, kp, step):
        i2 = min(i1 + step, kp)
        w1 = w[i1:i2].copy()
        err = np.zeros_like(w1)
        for i in range(i2 - i1):
            r = i1 + i
            if r % block_size == 0:
                scale, zero = (pick(w1[i:i + block_size], r) if pick is not None
                               else grid(w1[i:i + block_size], bits, symmetric))
                scales[r // block_size], zeros[r // block_size] = scale, zero
            c = np.clip(np.round(w1[i] / scale) + zero, 0, maxq)
            q[r] = c
            if hinv is None:
                continue
            e = (w1[i] - (c - zero) * scale) / hinv[r, r]
            w1[i:] -= np.outer(hinv[r, r:i2], e)
            err[i] = e
        if hinv is not None:
            w[i2:] -= hinv[i1:i2, i2:].T @ err
    return q, scales, zeros


def channel_codes(weight: np.ndarray, hessian: np.ndarray, scale: np.ndarray, zero: np.ndarray, qmin: int, qmax: int,
                  damp: float = DAMP) -> np.ndarray:
    """GPTQ of ``weight`` (K x N) on a grid fixed beforehand: one ``scale`` and ``zero`` point per
    output column (a QDQ model's per-channel weight grid) and codes in ``qmin .. qmax``. The integer
    codes (K x N, int32). Rows in their order, lazy batches of :data:`ROWS` rows; with a diagonal
    Hessian the codes are round to nearest's (test)."""
    k = weight.shape[0]
    hinv, dead = factor(hessian, k, k, damp)
    s, z = np.asarray(scale, np.float64), np.asarray(zero, np.float64)
    w = np.array(weight, np.float64)
    w[dead] = 0.0
    q = np.zeros(w.shape, np.int32)
    for i1 in range(0, k, ROWS):
        i2 = min(i1 + ROWS, k)
        w1, err, hb = w[i1:i2].copy(), np.zeros((i2 - i1, w.shape[1])), hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            c = np.clip(np.round(w1[i] / s) + z, qmin, qmax)
            q[i1 + i] = c
            err[i] = (w1[i] - (c - z) * s) / hb[i, i]
            w1[i:] -= np.outer(hb[i, i:], err[i])
        w[i2:] -= hinv[i1:i2, i2:].T @ err
    return q


def dequantized(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, k: int) -> np.ndarray:
    """The K x N float weight that codes, scales and zero points of :func:`codes` stand for."""
    n, blocks, block = q.shape
    w = (q.astype(np.float64) - zeros[:, :, None]) * scales[:, :, None].astype(np.float64)
    return w.reshape(n, blocks * block)[:, :k].T.astype(np.float32)


def node(matmul, k: int, bits: int, settings, q: np.ndarray, scales: np.ndarray, zeros: np.ndarray,
         inverse: np.ndarray | None = None) -> tuple:
    """The ``MatMulNBits`` node ``<name>_Q<bits>`` and its weight tensors for ``matmul`` (a MatMul
    NodeProto with a K x N weight; ``settings``: block size, symmetry, ``accuracy_level``), written
    by ONNX Runtime's own writer (the one its round to nearest uses: the same packing, names and
    attributes); zero points only where asymmetric. ``inverse``: AWQ's ``1 / s`` (K, the
    activations' type): unless all ones, a third item, the nodes before it (:mod:`vlsens.quantize.awq`'s
    ``Mul``, whose vector is among the weight tensors; the node reads the Mul's output)."""
    from onnx import helper, numpy_helper
    from onnxruntime.quantization.neural_compressor.weight_only import make_matmul_weight_only_node

    from vlsens.core.onnxgraph import AWQ_SUFFIX as SUFFIX

    n, blocks, block = q.shape
    qnode, weights = make_matmul_weight_only_node(node=matmul, weight_shape=(k, n), num_bits=bits, group_size=block,
                                                  k_blocks=blocks, q_weight=q.reshape(n * blocks, block),
                                                  scale=scales.reshape(-1, 1),
                                                  zero_point=None if settings.symmetric else zeros.reshape(-1, 1),
                                                  accuracy_level=settings.accuracy_level)
    if inverse is None or np.all(inverse == 1):
        return qnode, weights
    name = f"{matmul.name}{SUFFIX}"
    mul = helper.make_node("Mul", [matmul.input[0], f"{name}_scale"], [f"{name}_out"], name=name)
    qnode.input[0] = mul.output[0]
    return qnode, [*weights, numpy_helper.from_array(np.asarray(inverse), f"{name}_scale")], [mul]


def captured(float_model: str | Path, feeds: Iterable[Mapping[str, np.ndarray]], tensors: Sequence[str],
             threads: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Per feed, each of ``tensors`` (tensors of ``float_model``, its inputs among them) as rows
    (positions x width, float32): one session of a graph-only copy of the model with them as
    outputs, beside the data file it reads, removed after."""
    import onnx
    from onnx import helper

    from vlsens.core.onnxgraph import element_types
    from vlsens.core.onnxutil import make_session

    float_model = Path(float_model)
    model = onnx.load(str(float_model), load_external_data=False)
    given = {i.name for i in model.graph.input}
    types = element_types(float_model)
    have = {o.name for o in model.graph.output}
    for t in tensors:
        if t not in given and t not in have:
            model.graph.output.append(helper.make_tensor_value_info(t, types.get(t, onnx.TensorProto.FLOAT), None))
    probe = float_model.with_name(f".vlsens-gptq-{uuid.uuid4().hex}.onnx")  # beside the data file it reads
    onnx.save(model, str(probe))
    del model
    try:
        sess = make_session(probe, threads=threads, lean=True)
        outs = [t for t in tensors if t not in given]
        for feed in feeds:
            got = dict(zip(outs, sess.run(outs, feed)))
            yield {t: (x := np.asarray(got[t] if t in got else feed[t], np.float32)).reshape(-1, x.shape[-1])
                   for t in tensors}
        del sess
    finally:
        probe.unlink(missing_ok=True)


def spill(float_model: str | Path, feeds: Iterable[Mapping[str, np.ndarray]], tensors: Sequence[str],
          scratch: str | Path, threads: int = 0) -> tuple[dict[str, Path], dict[str, int]]:
    """Each of ``tensors`` over every feed (:func:`captured`), its rows appended to a float32 file
    of its own in ``scratch``: ``({tensor: file}, {tensor: row width})``."""
    files = {t: Path(scratch) / f"x{j}.f32" for j, t in enumerate(tensors)}
    widths: dict[str, int] = {}
    for rows in captured(float_model, feeds, tensors, threads):
        for t, x in rows.items():
            widths[t] = x.shape[1]
            with open(files[t], "ab") as f:
                x.tofile(f)
    return files, widths


def hessians(float_model: str | Path, calibration: str | Path, inputs: Sequence[str], scratch: str | Path,
             threads: int = 0, widths: Mapping[str, int] | None = None,
             magnitudes: dict | None = None) -> Iterator[tuple[str, np.ndarray, int]]:
    """``(input, X^T X, rows)`` for each tensor of ``inputs`` (MatMul inputs of ``float_model``), over
    every position of the calibration samples (:class:`vlsens.data.samples.Samples` npz of the
    model's inputs), one session pass (:func:`captured`); the rows are kept in ``scratch`` until read.
    ``widths``: a row width per input other than its last axis (a patch embedding's Conv, whose
    kernel covers its whole input: one row per patch). ``magnitudes``: filled with each input's
    mean ``|x|`` per channel (AWQ's activation sizes) before its Hessian is yielded."""
    from vlsens.data.samples import Samples

    samples = Samples.load(calibration, float_model)
    files, width = spill(float_model, samples.feeds, inputs, scratch, threads)
    log.info("GPTQ: %d MatMul inputs captured over %d calibration samples", len(inputs), samples.count)
    for t in inputs:
        x = np.fromfile(files[t], np.float32).reshape(-1, (widths or {}).get(t, width[t])).astype(np.float64)
        files[t].unlink()
        if magnitudes is not None:
            magnitudes[t] = np.abs(x).mean(axis=0)
        yield t, x.T @ x, x.shape[0]
