# vlsens: Qwen-VL checkpoint (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) -> verified ONNX models of the vision and text towers, FP16 and
# simplified variants, calibration sets, per-op quantization sensitivity and mixed-precision
# profiles. A table of contents: logic lives in src/vlsens/, rules in rules/ (one rule per stage,
# over a {graph} wildcard: vision/<H>x<W>, vision/dynamic, text), entry points in workflow/scripts/.
import os

from snakemake.utils import min_version

min_version("9.0")


# The default config, found next to this Snakefile from any working directory (-d); a
# --configfile extends it (nested keys are merged), it does not replace it.
configfile: os.path.join(workflow.basedir, "config", "config.yaml")


include: "rules/common.smk"
include: "rules/checkpoint.smk"
include: "rules/export.smk"
include: "rules/variants.smk"
include: "rules/npu.smk"
include: "rules/sensitivity.smk"
include: "rules/precision.smk"
include: "rules/deploy.smk"
include: "rules/report.smk"
include: "rules/budget.smk"


# `snakemake --report` (make report): the run's verdict (results/<model>/report/verdict.rst, written
# with the report's tables) above this workflow's description, the rule graph, and every output
# marked with report() (rules/report.smk).
report: landing_page()


# A failed job keeps the previous version of its outputs (vlsens.core.outputs.keep_previous): each
# output the run's jobs will write is moved aside when the run starts, dropped by the job that
# writes it anew, and put back when the run ends where its job did not complete.
onstart:
    if not (workflow.remote_exec or workflow.subprocess_exec or workflow.touch):
        from vlsens.core.outputs import keep_previous

        keep_previous((j.output, j.input) for j in workflow.dag.needrun_jobs())


onsuccess:
    if not (workflow.remote_exec or workflow.subprocess_exec):
        from vlsens.core.outputs import drop_timestamps, restore_previous

        restore_previous(RUN_DIR)
        drop_timestamps(RUN_DIR)  # nothing hidden in a folder that ships


onerror:
    if not (workflow.remote_exec or workflow.subprocess_exec):
        from vlsens.core.outputs import drop_timestamps, restore_previous

        drop_timestamps(RUN_DIR)
        for _kept in restore_previous(RUN_DIR):
            logger.warning(
                f"vlsens: {_kept}: its job did not complete; its previous version is back in place "
                "(the next run builds it again)"
            )


localrules:
    all,


rule all:
    default_target: True
    input:
        get_final_output(),
