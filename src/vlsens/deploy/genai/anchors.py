"""The anchors the int4-mixed decoder is compared with: onnxruntime-genai's model builder at
``-p int4`` with one ``algo_config`` (``rtn``, ``k_quant``, ``k_quant_mixed``, the last being the
builder's llama.cpp-style heuristic), each published as a gated decoder variant folder like
:func:`vlsens.precision.nbits.profile_folder`'s.

What ``-p int4`` does, done on the builder's own FP32 graph (``decoder/fp32``, already exported
and gated): the bits of every MatMul are the builder's own placement for the ``algo_config``
(its ``make_matmul_mixed_precision`` and alias table, called, not copied), and the weights are
quantized by the quantizer it calls, ``MatMulNBitsQuantizer``, with the same method, block size,
symmetry and accuracy level (:func:`vlsens.quantize.nbits.quantize`). The result equals the builder's
``-p int4`` graph weight for weight and output for output (``tests/test_nbits.py`` runs the builder
on the tiny preset), without a second export: at 36 layers the builder's own ``-p int4
algo_config=k_quant_mixed`` run was killed above 24 GiB (it holds the checkpoint in torch and the
FP32 graph in memory while k_quant runs in numpy).
"""

from __future__ import annotations

import json
from pathlib import Path

from vlsens.precision.nbits import MODEL, weight_facts


def builder_bits(algo: str, ops: list[str], num_layers: int) -> tuple[str, dict[str, int]]:
    """``(method, {MatMul: bits})``: the builder's base method for ``algo_config=<algo>`` and its
    bits for each of ``ops`` (INT4 unless its placement upgrades the MatMul)."""
    import types

    import onnxruntime_genai.models.builder  # noqa: F401  (puts the builder's own packages on sys.path)
    from onnxruntime_genai.models.builders.base import Model
    from onnxruntime_genai.models.quantization.quant_config import _LEGACY_ALGO_ALIASES

    method, placement = _LEGACY_ALGO_ALIASES.get(algo, (algo, {}))
    builder = types.SimpleNamespace(num_layers=int(num_layers))  # all its placement reads for these presets
    Model.make_matmul_mixed_precision(builder, placement)
    up = {n: int(c["bits"]) for n, c in builder.int4_customized_weight_config.items()}
    return method, {n: up.get(n, 4) for n in ops}


def builder_folder(checkpoint: str | Path, algo: str, settings, fp32_dir: str | Path, reference: str | Path,
                   out_dir: str | Path, tolerance: dict, exact_tolerance: dict, threads: int = 0) -> dict:
    """The builder's ``-p int4 --extra_options algo_config=<algo>`` decoder with the run's block
    size, accuracy level and symmetry, as a decoder variant folder gated against transformers on
    its own weights (:func:`vlsens.variants.gate_own_weights`)."""
    from dataclasses import replace

    from vlsens.core.onnxutil import copy_model
    from vlsens.export.towers.decoder import builder_version, weight_reference_for
    from vlsens.quantize.nbits import quantize, weight_matmuls
    from vlsens.variants import Gate, variant_folder

    layers = json.loads((Path(checkpoint) / "config.json").read_text())
    layers = int(layers.get("text_config", layers)["num_hidden_layers"])

    def transform(src: Path, feeds, staged: Path) -> dict:
        if src.name != MODEL:
            copy_model(src, staged)
            return {}
        method, bits = builder_bits(algo, [o["name"] for o in weight_matmuls(src)], layers)
        quantize(src, staged, bits, replace(settings, algorithm=method))
        return {**weight_facts(staged),
                "builder": {"precision": "int4", "algo_config": algo, "method": method,
                            "version": builder_version(), "not_int4": {n: b for n, b in bits.items() if b != 4},
                            "how": "the builder's placement (make_matmul_mixed_precision) and quantizer "
                                   "(MatMulNBitsQuantizer) on its FP32 graph, as -p int4 runs them",
                            "extra_options": {"algo_config": algo, "block_size": settings.block_size,
                                              "accuracy_level": settings.accuracy_level,
                                              "is_symmetric": str(settings.symmetric).lower()}}}

    return variant_folder(fp32_dir, reference, out_dir, f"int4-{algo}", transform,
                          Gate(tolerance, threads, reference_for=weight_reference_for(checkpoint),
                               exact_tolerance=exact_tolerance))
