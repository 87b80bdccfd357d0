"""A calibration set as NPU toolchains take it: one .npy per sample in calib.tar / eval.tar."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.export import stages

run(snakemake, lambda sm: stages.npu_archive(  # noqa: F821
    sm.input.calib, sm.input.eval, sm.output.calib_tar, sm.output.eval_tar))
