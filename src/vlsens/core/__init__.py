"""The base layer every package may import, and which imports no other vlsens package.

:mod:`~vlsens.core.errors` (messages for the person running the workflow), :mod:`~vlsens.core.job`
and :mod:`~vlsens.core.faults` (the job this process runs; fault injection for the tests),
:mod:`~vlsens.core.device` (torch's device), :mod:`~vlsens.core.fsutil` (every atomic write),
:mod:`~vlsens.core.paths` (the one path layout of ``results/``), :mod:`~vlsens.core.sizes` (image
sizes), :mod:`~vlsens.core.versions` (library versions and code hashes: the rerun triggers),
:mod:`~vlsens.core.metrics` (the one output comparison), :mod:`~vlsens.core.records` (the JSON
records and their schemas), :mod:`~vlsens.core.artifacts` (published ONNX files with sizes and
hashes), :mod:`~vlsens.core.onnxutil` (ONNX files and sessions), :mod:`~vlsens.core.onnxgraph`
(graph surgery and graph facts) and :mod:`~vlsens.core.scripting` (the thin workflow scripts'
support).
"""
