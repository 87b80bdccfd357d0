# Per-op INT8 sensitivity of any graph's analysed file (vlsens.sensitivity, vlsens.sensitivity.inc). Engine
# "ort": one switch model, the op list sharded over jobs, gathered into one ranked CSV. Engine
# "inc": Intel Neural Compressor's mse_v2, in its own environment (fixed-size FP32 graphs).

ENGINE = paths.files(paths.ENGINE, paths.ENGINE_FILES)
CALIB = paths.files(paths.CALIB, paths.CALIB_FILES)


rule sensitivity_prepare:
    input:
        parity=record("{variant}"),
        calib=CALIB["calib"],
        eval=CALIB["eval"],
    output:
        **ENGINE,
    log:
        paths.log("sensitivity_prepare", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_prepare", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_prepare", threads=config["threads"]),
    params:
        model=analysed_model,
        settings=quant_settings(),
        suffix_cuts=config["sensitivity"]["suffix_cuts"],
        weights_only=config["sensitivity"]["weights_only"],
        logits=lambda wc: tower(wc).logits,
        provenance=provenance("sensitivity", "sensitivity_prepare.py"),
    script:
        "../workflow/scripts/sensitivity_prepare.py"


rule sensitivity_shard:
    input:
        meta=ENGINE["meta"],
        switch=ENGINE["switch"],
        switch_data=ENGINE["switch_data"],
        float_model=ENGINE["float_model"],
        float_data=ENGINE["float_data"],
        probe=ENGINE["probe"],
        probe_data=ENGINE["probe_data"],
        reference=ENGINE["reference"],
        eval=CALIB["eval"],
    output:
        csv=f"{paths.SHARD}.csv",
        timing=f"{paths.SHARD}.json",
    log:
        paths.log("sensitivity_shard", "{variant}", "{i}-of-{n}"),
    benchmark:
        paths.benchmark("sensitivity_shard", "{variant}", "{i}-of-{n}")
    wildcard_constraints:
        i=r"\d+",
        n=r"\d+",
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_shard", threads=config["threads"]),
    params:
        provenance=provenance("sensitivity", "sensitivity_shard.py"),
    script:
        "../workflow/scripts/sensitivity_shard.py"


rule sensitivity_gather:
    input:
        meta=ENGINE["meta"],
        switch=ENGINE["switch"],
        switch_data=ENGINE["switch_data"],
        float_model=ENGINE["float_model"],
        float_data=ENGINE["float_data"],
        reference=ENGINE["reference"],
        eval=CALIB["eval"],
        shards=shard_csvs,
    output:
        csv=f"{paths.SENSITIVITY}/ort.csv",
        summary=f"{paths.SENSITIVITY}/ort.json",
    log:
        paths.log("sensitivity_gather", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_gather", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_gather", threads=config["threads"]),
    params:
        provenance=provenance("sensitivity", "sensitivity_gather.py"),
    script:
        "../workflow/scripts/sensitivity_gather.py"


# A shell rule: the script runs with INC's interpreter, not Snakemake's (vlsens.sensitivity.inc says why).
# CPU only: INC's ONNX Runtime adaptor creates its sessions with the CPU provider.
rule sensitivity_inc:
    input:
        parity=record("{variant}"),
        calib=CALIB["calib"],
        eval=CALIB["eval"],
    output:
        csv=f"{paths.SENSITIVITY}/inc.csv",
        summary=f"{paths.SENSITIVITY}/inc.json",
    log:
        paths.log("sensitivity_inc", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_inc", "{variant}")
    wildcard_constraints:
        variant="fp32",
    conda:
        "../envs/inc.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_inc", gpu=False, threads=config["threads"]),
    params:
        model=analysed_model,
        python=INC_PYTHON,
        script=INC_SCRIPT,
        settings=json.dumps(quant_settings(), sort_keys=True),
        max_ops=config["sensitivity"]["inc"]["max_ops"],
        provenance=inc_provenance(),
    shell:
        "{params.python} {params.script} --model {params.model:q} --calib {input.calib:q}"
        " --eval {input.eval:q} --csv {output.csv:q} --summary {output.summary:q} --log {log:q}"
        " --settings {params.settings:q} --max-ops {params.max_ops} --threads {resources.compute_threads}"


# INC's own fallback run to the profile's target (sensitivity.inc.tune: true).
rule sensitivity_inc_tune:
    input:
        parity=record("{variant}"),
        calib=CALIB["calib"],
        eval=CALIB["eval"],
    output:
        eval=f"{paths.INC_TUNE}/eval.json",
    log:
        paths.log("sensitivity_inc_tune", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_inc_tune", "{variant}")
    wildcard_constraints:
        variant="fp32",
    conda:
        "../envs/inc.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_inc_tune", gpu=False, threads=config["threads"]),
    params:
        model=analysed_model,
        python=INC_PYTHON,
        script=INC_SCRIPT,
        settings=json.dumps(quant_settings(), sort_keys=True),
        metric=lambda wildcards: tower(wildcards).profile_settings()["metric"],
        target=lambda wildcards: tower(wildcards).profile_settings()["target"],
        max_trials=config["sensitivity"]["inc"]["max_trials"],
        provenance=inc_provenance(),
    shell:
        "{params.python} {params.script} --tune --model {params.model:q} --calib {input.calib:q}"
        " --eval {input.eval:q} --summary {output.eval:q} --log {log:q}"
        " --settings {params.settings:q} --metric {params.metric} --target {params.target}"
        " --max-trials {params.max_trials} --threads {resources.compute_threads}"


rule sensitivity_compare:
    input:
        ort_csv=rules.sensitivity_gather.output.csv,
        ort_json=rules.sensitivity_gather.output.summary,
        inc_csv=rules.sensitivity_inc.output.csv,
        inc_json=rules.sensitivity_inc.output.summary,
    output:
        f"{paths.SENSITIVITY}/compare.json",
    log:
        paths.log("sensitivity_compare", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_compare", "{variant}")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("sensitivity_compare", gpu=False),
    params:
        top_k=config["sensitivity"]["compare"]["top_k"],
        provenance=provenance("compare", "sensitivity_compare.py"),
    script:
        "../workflow/scripts/sensitivity_compare.py"
