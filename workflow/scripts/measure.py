"""One deploy folder teacher-forced on the fp32 folder's tokens through onnxruntime-genai: KL and top-1 per
case, per modality with its spread (vlsens.deploy.genai.measure)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.fsutil import write_json
from vlsens.core.scripting import run
from vlsens.deploy import prepacked
from vlsens.deploy.cases import load_cases
from vlsens.deploy.genai.measure import measure_folder


def main(sm):
    precision = sm.wildcards.precision
    write_json(sm.output[0], measure_folder(sm.input.folder, sm.input.reference, load_cases(sm.input.cases),
                                            precision, prepack=prepacked(precision)))


run(snakemake, main)  # noqa: F821
