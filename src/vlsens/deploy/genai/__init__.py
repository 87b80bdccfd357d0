"""The onnxruntime-genai folder format: one subpackage of :mod:`vlsens.deploy` per format.

:mod:`~vlsens.deploy.genai.folder` (the folder's graphs and configs), :mod:`~vlsens.deploy.genai.assemble`
(its files from gated graphs), :mod:`~vlsens.deploy.genai.evaluate` (checked end to end through
onnxruntime-genai), :mod:`~vlsens.deploy.genai.anchors` (the model builder's ``-p int4`` decoders)
and :mod:`~vlsens.deploy.genai.runtime` (``Chat``: a folder in an application). A second format (a
TensorRT-LLM engine folder, a QNN context binary) is a sibling subpackage with the same parts.
"""
