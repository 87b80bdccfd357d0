"""Each vision and embedding format measured end to end in the fp32 folder, then the front's search: decoder
assignments by byte budget on the measure's cases, combined with those formats, plans picked along the front
and at each anchor's bytes (vlsens.budget.build)."""
import json
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.build import formats_of, write_components, write_front
from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.deploy.cases import load_cases


def main(sm):
    base = {"decoder": sm.input.decoder_model, "embedding": Path(sm.input.decoder_model).with_name("embedding.onnx"),
            "vision": sm.input.vision_fp32, "folder": sm.input.fp32_folder}
    write_components(checkpoint_dir(sm.input.checkpoint), sm.input.reference, load_cases(sm.input.cases), base,
                     formats_of(dict(sm.input.items())), sm.input.csv, sm.output.components)
    anchors = {k.removeprefix("anchor_"): v for k, v in sm.input.items() if k.startswith("anchor_")}
    components = json.loads(Path(sm.output.components).read_text())
    write_front(sm.input.engine, sm.input.eval, sm.input.csv, components, sm.output.front, sm.output.plans,
                sm.params.search, anchors, threads(sm))


run(snakemake, main)  # noqa: F821
