"""Quantization formats and how a graph gets them, without any search.

:mod:`~vlsens.quantize.target` (deployment targets: the arithmetic a QDQ model runs in),
:mod:`~vlsens.quantize.qdq` (ONNX Runtime's static INT8 QDQ with one calibration) and
:mod:`~vlsens.quantize.nbits` (weight-only INT4 / INT8 ``MatMulNBits``). What each op costs in
such a format is measured by :mod:`vlsens.sensitivity`; which format each op gets is chosen by
:mod:`vlsens.precision`.
"""
