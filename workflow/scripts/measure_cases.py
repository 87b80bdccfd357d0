"""The folders' evaluation cases: text, one-image and two-image prompts over the calibration photos at
several sizes, or the task's evaluation questions (vlsens.deploy.cases)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.data.inputs import image_refs
from vlsens.deploy.cases import folder_cases, task_cases


def main(sm):
    if sm.input.questions:
        return task_cases(sm.input.questions, sm.output[0], sm.params.per_modality)
    return folder_cases(image_refs(sm.input.images), sm.output[0], sm.params.per_modality,
                        [tuple(s) for s in sm.params.sizes], sm.params.seed)


run(snakemake, main)  # noqa: F821
