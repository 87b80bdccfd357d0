"""FP16 or simplified variant of the dynamic vision graph; parity-gated at every case."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from vlsens.dynamic import dynamic_fp16, dynamic_simplify
from vlsens.scripting import run


def main(sm):
    args = (sm.input.model, sm.input.reference, sm.output.model, sm.output.parity, sm.params.tolerance)
    if sm.rule == "dynamic_fp16":
        dynamic_fp16(*args, sm.params.max_activation, sm.params.max_initializer, sm.threads, sm.config["device"])
    else:
        dynamic_simplify(*args, f"{sm.wildcards.base}-sim", sm.params.check_max_bytes, sm.threads, sm.config["device"])


run(snakemake, main)  # noqa: F821
