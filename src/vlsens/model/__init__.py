"""The checkpoint as transformers sees it: everything vlsens knows about a model family.

:mod:`~vlsens.model.family` (the one table of what differs between Qwen2-VL, Qwen2.5-VL and
Qwen3-VL, module prefixes and names included), :mod:`~vlsens.model.checkpoint` (a directory
checked without torch), :mod:`~vlsens.model.loading` (safetensors-only loading),
:mod:`~vlsens.model.processor` (tokenizer and image processor), :mod:`~vlsens.model.vision` (the
vision tower's patch geometry) and :mod:`~vlsens.model.presets` (the built-in random checkpoints).
"""
