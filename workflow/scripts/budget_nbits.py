"""The measure's cases as the decoder's evaluation set, through the fp32 folder's own graphs
(vlsens.deploy.genai.chain), and engine nbits on it: every decoder MatMul's INT4 / INT8 error where the folders
are judged (vlsens.sensitivity.nbits)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run, threads
from vlsens.data.inputs import checkpoint_dir
from vlsens.deploy.cases import load_cases
from vlsens.deploy.genai.chain import decoder_feeds
from vlsens.quantize.nbits import NBitsSettings
from vlsens.sensitivity import nbits


def main(sm):
    decoder_feeds(sm.input.folder, sm.input.reference, load_cases(sm.input.cases), checkpoint_dir(sm.input.checkpoint),
                  sm.output.feeds)
    nbits.prepare(sm.input.model, sm.output.feeds, sm.output.engine, NBitsSettings.from_config(sm.params.settings),
                  threads(sm), logits=True, suffix_cuts=sm.params.suffix_cuts)
    nbits.sensitivity(sm.output.engine, sm.output.feeds, sm.output.csv, sm.output.summary, threads(sm))


run(snakemake, main)  # noqa: F821
