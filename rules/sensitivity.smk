# Per-op sensitivity of any graph's analysed file (vlsens.sensitivity). Engine "ort" (INT8): one
# switch model, the op list sharded over jobs, gathered into one ranked CSV. Engine "inc": Intel
# Neural Compressor's mse_v2, in its own environment (fixed-size FP32 graphs). Engine "nbits": the
# decoder's MatMuls weight-only at INT4 and INT8 (vlsens.sensitivity.nbits), one switch session, a
# CSV beside ort.csv.

NBITS = paths.files(paths.SENSITIVITY, paths.NBITS_FILES)
# What an engine reads of a variant: its record (the graph files, by hash) and the calibration set.
ENGINE_INPUTS = {"parity": record("{variant}"), **CALIB_SETS}


rule sensitivity_prepare:
    input:
        **ENGINE_INPUTS,
    output:
        **ENGINE,
    params:
        model=analysed_model,
        settings=quant_settings(),
        suffix_cuts=config["sensitivity"]["suffix_cuts"],
        weights_only=config["sensitivity"]["weights_only"],
        logits=lambda wc: tower(wc).logits,
        provenance=provenance("sensitivity", "sensitivity_prepare.py"),
    log:
        paths.log("sensitivity_prepare", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_prepare", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_prepare", threads=config["threads"]),
    script:
        "../workflow/scripts/sensitivity_prepare.py"


rule sensitivity_shard:
    input:
        **engine_files("meta", "switch", "switch_data", "float_model", "float_data", "probe", "probe_data", "reference"),
        eval=CALIB["eval"],
    output:
        csv=f"{paths.SHARD}.csv",
        timing=f"{paths.SHARD}.json",
    wildcard_constraints:
        i=r"\d+",
        n=r"\d+",
    params:
        provenance=provenance("sensitivity", "sensitivity_shard.py"),
    log:
        paths.log("sensitivity_shard", "{variant}", "{i}-of-{n}"),
    benchmark:
        paths.benchmark("sensitivity_shard", "{variant}", "{i}-of-{n}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_shard", threads=config["threads"]),
    script:
        "../workflow/scripts/sensitivity_shard.py"


rule sensitivity_gather:
    input:
        **engine_files("meta", "switch", "switch_data", "float_model", "float_data", "reference"),
        eval=CALIB["eval"],
        shards=shard_csvs,
    output:
        csv=f"{paths.SENSITIVITY}/ort.csv",
        summary=f"{paths.SENSITIVITY}/ort.json",
    params:
        provenance=provenance("sensitivity", "sensitivity_gather.py"),
    log:
        paths.log("sensitivity_gather", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_gather", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_gather", threads=config["threads"]),
    script:
        "../workflow/scripts/sensitivity_gather.py"


# Engine inc: shell rules, the script runs with INC's interpreter, not Snakemake's
# (vlsens.sensitivity.inc says why). CPU only: INC's ONNX Runtime adaptor creates its sessions
# with the CPU provider. Its two tasks take the same inputs and params and one command line.
INC_PARAMS = {
    "model": analysed_model,
    "python": INC_PYTHON,
    "script": INC_SCRIPT,
    "settings": json.dumps(quant_settings(), sort_keys=True),
}


# The ranking: every op quantized alone.
rule sensitivity_inc:
    input:
        **ENGINE_INPUTS,
    output:
        csv=f"{paths.SENSITIVITY}/inc.csv",
        summary=f"{paths.SENSITIVITY}/inc.json",
    wildcard_constraints:
        variant="fp32",
    params:
        **INC_PARAMS,
        max_ops=config["sensitivity"]["inc"]["max_ops"],
        provenance=inc_provenance(),
    log:
        paths.log("sensitivity_inc", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_inc", "{variant}")
    conda:
        "../envs/inc.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_inc", gpu=False, threads=config["threads"]),
    shell:
        inc_command("", "--csv {output.csv:q} --summary {output.summary:q}", "--max-ops {params.max_ops}")


# INC's own fallback run to the profile's target (sensitivity.inc.tune: true).
rule sensitivity_inc_tune:
    input:
        **ENGINE_INPUTS,
    output:
        eval=f"{paths.INC_TUNE}/eval.json",
    wildcard_constraints:
        variant="fp32",
    params:
        **INC_PARAMS,
        metric=lambda wildcards: tower(wildcards).profile_settings()["metric"],
        target=lambda wildcards: tower(wildcards).profile_settings()["target"],
        max_trials=config["sensitivity"]["inc"]["max_trials"],
        provenance=inc_provenance(),
    log:
        paths.log("sensitivity_inc_tune", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_inc_tune", "{variant}")
    conda:
        "../envs/inc.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_inc_tune", gpu=False, threads=config["threads"]),
    shell:
        inc_command(
            " --tune",
            "--summary {output.eval:q}",
            "--metric {params.metric} --target {params.target} --max-trials {params.max_trials}",
        )


rule sensitivity_compare:
    input:
        ort_csv=rules.sensitivity_gather.output.csv,
        ort_json=rules.sensitivity_gather.output.summary,
        inc_csv=rules.sensitivity_inc.output.csv,
        inc_json=rules.sensitivity_inc.output.summary,
    output:
        f"{paths.SENSITIVITY}/compare.json",
    params:
        top_k=config["sensitivity"]["compare"]["top_k"],
        provenance=provenance("compare", "sensitivity_compare.py"),
    log:
        paths.log("sensitivity_compare", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_compare", "{variant}")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("sensitivity_compare", gpu=False),
    script:
        "../workflow/scripts/sensitivity_compare.py"


# Engine nbits: the error of each MatMul at INT4 and INT8, weight-only (the int4-mixed profile,
# rules/precision.smk, reads its CSV and its switch session's folder).
rule sensitivity_nbits:
    input:
        parity=ENGINE_INPUTS["parity"],
        eval=ENGINE_INPUTS["eval"],
    output:
        **NBITS,
        engine=directory(paths.NBITS_ENGINE),
    params:
        model=analysed_model,
        settings=nbits_settings(),
        logits=lambda wc: tower(wc).logits,
        suffix_cuts=config["sensitivity"]["suffix_cuts"],
        provenance=provenance("sensitivity", "sensitivity_nbits.py"),
    log:
        paths.log("sensitivity_nbits", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_nbits", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_nbits", threads=config["threads"]),
    script:
        "../workflow/scripts/sensitivity_nbits.py"
