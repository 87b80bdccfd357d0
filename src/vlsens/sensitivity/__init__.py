"""Per-op quantization sensitivity: the error of every quantizable op alone, by engine: ``ort``
(INT8 QDQ, below), ``nbits`` (weight-only INT4 / INT8 of every MatMul, :mod:`~vlsens.sensitivity.nbits`),
``inc`` (Intel Neural Compressor, :mod:`~vlsens.sensitivity.inc`), and the engines side by side
(:mod:`~vlsens.sensitivity.compare`).

Question asked for every quantizable op k: how far does the model's final output on the
evaluation set move from the float output when *only k* runs in INT8 (ONNX Runtime QDQ, same
settings and calibration as a deployment would use)?

The straightforward method (:mod:`~vlsens.sensitivity.baseline`) builds one quantized model and one
session per op. The engine gets the same numbers at close to the cost of one forward pass per op:
calibration runs once, ``quantize_static`` runs once with every op selected, and a *switch model*
(:mod:`~vlsens.sensitivity.switch`) built from that result and the float model evaluates any set of
INT8 ops in one session (:mod:`~vlsens.sensitivity.engine`). Both methods run with basic graph
optimizations (Q/DQ not fused into integer kernels), so they compute exactly the same arithmetic;
the tests check that their outputs are identical, op by op, for every tower.

:mod:`~vlsens.sensitivity.ranking` turns rows into the ranked CSV and cuts the op list into
shards; :mod:`~vlsens.sensitivity.stages` runs prepare / shard / gather as the workflow does.
"""
