"""Parity cases of one graph: inputs from the checkpoint's processor and real images, and
transformers' outputs (the reference every gate of that graph uses)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.device import torch_device
from vlsens.core.scripting import run
from vlsens.data.inputs import checkpoint_dir, image_refs
from vlsens.export import stages, towers

run(snakemake, lambda sm: stages.reference(  # noqa: F821
    towers.for_graph(sm.config, sm.wildcards.graph), checkpoint_dir(sm.input.checkpoint), image_refs(sm.input.images),
    sm.output.reference, sm.params.settings, device=torch_device(sm.config["device"])))
