"""One deploy folder's greedy answers to the task's evaluation questions through onnxruntime-genai,
accuracy per modality with its Wilson interval (vlsens.deploy.genai.answers)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.fsutil import write_json
from vlsens.core.scripting import run
from vlsens.deploy import prepacked
from vlsens.deploy.genai.answers import answer_folder


def main(sm):
    precision = sm.wildcards.precision
    write_json(sm.output[0], answer_folder(sm.input.folder, sm.input.questions, precision,
                                           prepack=prepacked(precision)))


run(snakemake, main)  # noqa: F821
