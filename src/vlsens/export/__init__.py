"""From the checkpoint to gated ONNX graphs (``rules/export.smk``).

:mod:`~vlsens.export.towers` holds one class per kind of graph (the unit of extension: its
reference cases, export and calibration set); :mod:`~vlsens.export.stages` runs a tower's
reference, export and calibration stages for any tower; :mod:`~vlsens.export.parity` is the gate
every ONNX file passes against transformers before it is published.
"""
