"""Engine ``inc``: Intel Neural Compressor's ``mse_v2`` op sensitivity, next to engine ``ort``.

The package runs in INC's own environment (``envs/inc.yaml`` or the ``.venv-inc`` virtualenv the
Makefile creates): neural-compressor 3.7.1 is the last release with the ONNX Runtime adaptor and
``mse_v2``, and it needs onnx <= 1.18 and numpy < 2, which the main environment cannot have. Only
numpy, onnx and the standard library are imported at module level, plus vlsens modules that need
nothing else, so the helpers can also be imported and tested from the main environment.

Modules: :mod:`~vlsens.sensitivity.inc.settings` (the pinned release, what INC can honour, its config),
:mod:`~vlsens.sensitivity.inc.names` (INC's node names back to the exported graph),
:mod:`~vlsens.sensitivity.inc.capture` (the private adaptor calls, captured into one typed object),
:mod:`~vlsens.sensitivity.inc.stages` (the ``sensitivity_inc`` and ``sensitivity_inc_tune`` rules) and
:mod:`~vlsens.sensitivity.inc.env` (the engine's interpreter, seen from the main environment).

How the numbers are obtained. INC has no public per-op API: ``mse_v2`` ranks ops with its ONNX
Runtime adaptor's ``_get_mse_order``: for every INT8 op k, re-quantize the model with op k back in
FP32 (every other op INT8, re-calibrated, as INC does it) and take the MSE of the final outputs
against the FP32 model. A *low* MSE therefore means op k matters: putting it back in float removes
much of the error. We run INC's own tuning (``quantization.fit`` with ``quant_format="QDQ"``,
``quant_level=1`` -- ``"auto"`` silently replaces mse_v2 -- and strategy ``mse_v2``) and capture,
by wrapping three private adaptor methods (pinned in :data:`~vlsens.sensitivity.inc.settings.PRIVATE_API`
and checked by :func:`~vlsens.sensitivity.inc.settings.check_environment`, so an upgrade that removes them fails loudly):

* ``_get_mse_order``: the op list and INC's MSE per op (the first call is the fallback stage over
  every INT8 op); sensitivity mode stops the tuning right after it;
* ``_calculate_mse``: the float and quantized outputs behind each MSE, from which cosine and SQNR
  are computed with the same function the ``ort`` engine uses;
* ``_inference_model_on_batches``: redirected to the *evaluation* set, so ``inc`` scores ops on
  the same images as ``ort`` (INC calibrates on the calibration set, as ``ort`` does).

INC renames nodes (``Gemm`` -> ``<name>_MatMul`` + ``<name>_Add``; ORT fusions): :func:`~vlsens.sensitivity.inc.names.map_names`
maps every scored op back to the exported graph's node names (by name, then by weight, then by
output tensor, then by name prefix); ops it cannot map are kept under INC's name and listed.
"""
