"""Mixed-precision profile: search with the engine, build with ORT, measure, write."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.profile import build_profile
from vlsens.scripting import run


def main(sm):
    build_profile(sm.input.meta.rsplit("/", 1)[0], sm.input.ranking, sm.input.eval,
                  {"fp32": sm.input.fp32, "fp16": sm.input.fp16}, sm.output.eval.rsplit("/", 1)[0],
                  sm.params.metric, float(sm.params.target), sm.params.max_evals, sm.wildcards.variant, sm.threads,
                  fail_if_unreachable=sm.params.fail_if_unreachable)


run(snakemake, main)  # noqa: F821
