"""The anchors the int4-mixed decoder is compared with: onnxruntime-genai's model builder at
``-p int4`` with one ``algo_config`` (``rtn``, ``k_quant``, ``k_quant_mixed``, the last being the
builder's llama.cpp-style heuristic), each published as a gated decoder variant folder like
:func:`vlsens.profile_nbits.profile_folder`'s."""

from __future__ import annotations

from pathlib import Path

from vlsens.profile_nbits import MODEL, weight_facts


def builder_folder(checkpoint: str | Path, algo: str, settings, fp32_dir: str | Path, reference: str | Path,
                   out_dir: str | Path, tolerance: dict, exact_tolerance: dict, threads: int = 0,
                   log_path: str | Path | None = None) -> dict:
    """onnxruntime-genai's builder decoder at ``-p int4 --extra_options algo_config=<algo>`` with the
    run's block size, accuracy level and symmetry, as a decoder variant folder gated against
    transformers on its own weights (:func:`vlsens.variants.gate_own_weights`)."""
    import tempfile

    from vlsens.onnxutil import copy_model, resave
    from vlsens.towers.decoder import build_decoder, weight_reference
    from vlsens.variants import build_variant

    options = {"algo_config": algo, "block_size": settings.block_size, "accuracy_level": settings.accuracy_level,
               "is_symmetric": str(settings.symmetric).lower()}
    with tempfile.TemporaryDirectory(prefix="vlsens-int4-") as work:
        built = build_decoder(checkpoint, work, log_path, precision="int4", options=options)

        def transform(src: Path, feeds, staged: Path) -> dict:
            if src.name != MODEL:
                copy_model(src, staged)
                return {}
            resave(built, staged)  # the builder's layout -> vlsens' (one compact data file)
            return {**weight_facts(staged), "builder": {"precision": "int4", "extra_options": options}}

        return build_variant(fp32_dir, reference, out_dir, tolerance, f"int4-{algo}", transform, threads,
                             reference_for=lambda staged, cases: weight_reference(checkpoint, staged[MODEL], cases),
                             exact_tolerance=exact_tolerance)
