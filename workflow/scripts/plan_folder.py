"""One plan's deploy folder: its decoder built and gated, its vision graph and table, assembled, checked
and evaluated like every folder, then measured (vlsens.budget.build)."""
from pathlib import Path

import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.budget.build import formats_of, plan_folder
from vlsens.core.fsutil import write_json
from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir, image_refs
from vlsens.deploy.cases import load_cases
from vlsens.deploy.genai.evaluate import Checks
from vlsens.deploy.genai.measure import measure_folder
from vlsens.export.towers.decoder import weight_reference_for
from vlsens.variants import Gate


def main(sm):
    ckpt = checkpoint_dir(sm.input.checkpoint)
    formats = formats_of(dict(sm.input.items()))
    formats["embedding"]["fp32"] = Path(sm.input.decoder_model).with_name("embedding.onnx")
    sources = {"decoder_dir": Path(sm.input.decoder_model).parent, "reference": sm.input.decoder_reference, **formats}
    gate = Gate(sm.params.tolerance, threads(sm), reference_for=weight_reference_for(ckpt),
                exact_tolerance=sm.params.exact_tolerance)
    # the plan's vision graph is measured, not gated, in the folder (each format passed its gate on
    # its own weights; what it costs is in the plan's estimate and its measure)
    checks = Checks(sm.params.max_new_tokens, None, fp32_folder=sm.input.fp32_folder)
    plan_folder(sm.input.plan, sm.output.folder, ckpt, sources, image_refs(sm.input.images), checks, gate)
    # measured here, in the job that built it (one process: the measure rule's job for the other folders)
    name = f"plan-{sm.wildcards.plan}"
    write_json(sm.output.measure, measure_folder(sm.output.folder, sm.input.reference, load_cases(sm.input.cases), name))


run(snakemake, main)  # noqa: F821
