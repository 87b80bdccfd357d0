"""A fixed-size graph's profile as NPU toolchains take it: pulsar2 configs, QNN overrides (vlsens.npu.toolchain)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.npu.toolchain import write_toolchain

run(snakemake, lambda sm: write_toolchain(  # noqa: F821
    sm.input.profile.rsplit("/", 1)[0], sm.input.model, sm.input.calib_tar, sm.output.toolchain, sm.params.root,
    sm.input.get("parts"), sm.input.get("parts_calib"), sm.input.get("unsmoothed")))
