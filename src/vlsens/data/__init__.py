"""What the workflow reads from outside ``results/`` and the sets it makes of it.

:mod:`~vlsens.data.images` (the built-in photos or the user's files), :mod:`~vlsens.data.prompts`
(text prompts), :mod:`~vlsens.data.inputs` (content manifests of outside inputs),
:mod:`~vlsens.data.samples` (model inputs as ``session.run`` feeds), :mod:`~vlsens.data.cases`
(parity cases: a graph's inputs and transformers' outputs) and :mod:`~vlsens.data.calibration`
(calibration and evaluation sets, and their NPU archives).
"""
