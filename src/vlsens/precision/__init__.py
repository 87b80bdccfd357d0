"""Which precision each op gets: the mixed-precision profiles, built and verified
(``rules/precision.smk``).

:mod:`~vlsens.precision.int8` (INT8 / float per op, QDQ, for a deployment target),
:mod:`~vlsens.precision.nbits` (INT4 / INT8 / float per weight MatMul: the int4-mixed decoder) and
:mod:`~vlsens.precision.weight_only` (the INT4 embedding table and vision graph of the int4
folders). Where INT4 lives: the format in :mod:`vlsens.quantize.nbits`, its sensitivity engine in
:mod:`vlsens.sensitivity.nbits`, the choice here, the builder's INT4 decoders it is compared with
in :mod:`vlsens.deploy.genai.anchors`.
"""
