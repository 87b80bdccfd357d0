"""Per-size calibration/evaluation feeds for the dynamic graph, from every size's sets."""
import _vlsens  # noqa: F401  (src/ on sys.path when vlsens is not installed)
from transformers import AutoConfig

from vlsens.dynamic import dynamic_calibration
from vlsens.scripting import run


def main(sm):
    cfg = AutoConfig.from_pretrained(sm.input.checkpoint, local_files_only=True, trust_remote_code=False)
    for split in ("calib", "eval"):
        dynamic_calibration(dict(zip(sm.params.sizes, sm.input[split])), cfg.vision_config, sm.output[split])


run(snakemake, main)  # noqa: F821
