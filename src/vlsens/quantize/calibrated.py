"""Data-aware weight-only quantization of a graph's MatMuls: each from the float model's calibration
inputs (its Hessian ``X^T X`` and, for AWQ, its activations' sizes) by GPTQ
(:mod:`vlsens.quantize.gptq`), scale estimation (:mod:`vlsens.quantize.scale_estimation`), both
together, or AWQ (:mod:`vlsens.quantize.awq`): one capture pass over the calibration samples for
every MatMul the run's store of codes does not hold yet, the codes written by ONNX Runtime's
``MatMulNBits`` writer (:func:`vlsens.quantize.gptq.node`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlsens.quantize import gptq
from vlsens.quantize.gptq import Calibration

log = logging.getLogger(__name__)


def quantize_nodes(float_model: str | Path, ops: Sequence[Mapping], model, bits: Mapping[str, int], settings,
                   calibration: Calibration, scratch: str | Path, threads: int = 0,
                   algorithm: str = "gptq") -> dict[str, tuple]:
    """``{MatMul name: (MatMulNBits node, its weight tensors[, the nodes before it])}`` for ``ops``
    (weight MatMuls of :func:`vlsens.quantize.nbits.weight_matmuls`; ``model`` the float graph,
    loaded without its data) by ``algorithm`` at their ``bits`` and ``settings``' block size,
    symmetry and ``accuracy_level``: read from ``calibration.store`` where it holds them, the others
    computed (and kept there when it is writable). MatMuls that read the same input share its
    Hessian; only the inputs of MatMuls computed here are captured. ``algorithm``: ``gptq``,
    ``scale_estimation``, ``gptq_se`` (GPTQ with each block's scale by scale estimation,
    :func:`vlsens.quantize.gptq.codes`' ``estimate_scales``), ``awq`` or ``awq_se`` (with a ``Mul``
    before the node): the same Hessians, the same store and writer."""
    from vlsens.core.onnxutil import tensor_array

    nodes = {n.name: n for n in model.graph.node}
    inits = {i.name: i for i in model.graph.initializer}
    store, done = calibration.store, {}
    ctx = _Context.of(float_model, model, algorithm)
    by_input: dict[str, list[Mapping]] = {}
    for o in ops:
        b = int(bits[o["name"]])
        kept = store.load(o, b, settings, ctx.key) if store is not None else None
        if kept is not None:
            done[o["name"]] = gptq.node(nodes[o["name"]], o["K"], b, settings, *kept)
        else:
            by_input.setdefault(nodes[o["name"]].input[0], []).append(o)
    if store is not None:
        log.info("GPTQ: %d of %d MatMuls read from %s, %d to compute", len(done), len(ops), store.folder,
                 len(ops) - len(done))
    if not by_input:
        return done
    weights_dir = Path(float_model).parent
    for t, h, rows in gptq.hessians(float_model, calibration.samples, list(by_input), scratch, threads,
                                    magnitudes=ctx.magnitudes):
        if rows < h.shape[0]:
            log.warning("GPTQ: %d calibration rows for the %d inputs of %s: the Hessian is singular (dampening "
                        "keeps it invertible, but the fit follows these rows; more calibration samples, "
                        "calibration.num_calib, give it more)", rows, h.shape[0], t)
        factors: dict = {}  # GPTQ's factor of this Hessian, shared by the MatMuls that read it
        for o in by_input[t]:
            b = int(bits[o["name"]])
            w = np.asarray(tensor_array(inits[o["weight"]], weights_dir), np.float32)
            got = ctx.compute(o["name"], t, w, h, b, settings, factors)
            if store is not None:
                store.save(o, b, settings, got, ctx.key)
            done[o["name"]] = gptq.node(nodes[o["name"]], o["K"], b, settings, *got)
        log.debug("GPTQ: %s (%d rows): %s", t, rows, [o["name"] for o in by_input[t]])
    return done


@dataclass
class _Context:
    """What an algorithm reads beside a weight and its Hessian: AWQ's activation sizes per input
    (``magnitudes``, filled by :func:`vlsens.quantize.gptq.hessians`), the activations' types and the
    decoder's head; ``key``: the algorithm as the store keys its codes."""

    algorithm: str
    magnitudes: dict | None
    dtypes: dict
    head: frozenset

    @property
    def key(self) -> str:
        from vlsens.quantize import awq

        return f"{self.algorithm}:{awq.FORMAT}" if self.algorithm.startswith("awq") else self.algorithm

    @classmethod
    def of(cls, float_model, model, algorithm: str) -> _Context:
        from onnx import helper

        from vlsens.core.onnxgraph import element_types
        from vlsens.model.family import NODE_NAMES

        if not algorithm.startswith("awq"):
            return cls(algorithm, None, {}, frozenset())
        types = element_types(float_model)
        dtypes = {n.input[0]: helper.tensor_dtype_to_np_dtype(types.get(n.input[0], 1)) for n in model.graph.node
                  if n.input}
        head = frozenset(n.name for n in model.graph.node if NODE_NAMES.logits in n.output)
        return cls(algorithm, {}, dtypes, head)

    def compute(self, name: str, tensor: str, w: np.ndarray, h: np.ndarray, bits: int, settings,
                factors: dict | None = None) -> tuple:
        """The codes of weight ``w`` (MatMul ``name``, input ``tensor``, Hessian ``h``); ``factors``:
        GPTQ's factors of ``h`` by padded rows, filled and read here (one per Hessian and block size)."""
        from vlsens.quantize import awq, scale_estimation

        a, bs, sym = self.algorithm, settings.block_size, settings.symmetric
        if a in ("gptq", "gptq_se"):
            factors = {} if factors is None else factors
            kp = -(-w.shape[0] // bs) * bs
            if kp not in factors:
                factors[kp] = gptq.factor(h, w.shape[0], kp)
            return gptq.codes(w, h, bits, bs, sym, estimate_scales=a == "gptq_se", factored=factors[kp])
        if a == "scale_estimation":
            return scale_estimation.codes(w, h, bits, bs, sym)
        then, dtype = ("se" if a == "awq_se" else "rtn"), self.dtypes.get(tensor, np.float32)
        if name in self.head:
            return awq.unscaled(w, h, bits, bs, sym, then, dtype)
        return awq.codes(w, h, self.magnitudes[tensor], bits, bs, sym, then, dtype)
