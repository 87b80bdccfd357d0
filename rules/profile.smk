# Stage: the mixed-precision profile, searched with the engine, then built and measured.


rule profile:
    input:
        meta=rules.sensitivity_prepare.output.meta,
        switch=rules.sensitivity_prepare.output.switch,
        float_model=rules.sensitivity_prepare.output.float_model,
        cache=rules.sensitivity_prepare.output.cache,
        reference=rules.sensitivity_prepare.output.reference,
        ranking=rules.sensitivity_gather.output.csv,
        eval=rules.calibration.output.eval,
        fp32="results/{model}/vision/{size}/fp32/model.onnx",
        fp16="results/{model}/vision/{size}/fp16/model.onnx",
    output:
        model="results/{model}/profile/vision/{size}/{variant}/model.onnx",
        data="results/{model}/profile/vision/{size}/{variant}/model.onnx.data",
        profile="results/{model}/profile/vision/{size}/{variant}/profile.yaml",
        exclude="results/{model}/profile/vision/{size}/{variant}/nodes_to_exclude.json",
        inc="results/{model}/profile/vision/{size}/{variant}/inc_op_name_dict.json",
        eval="results/{model}/profile/vision/{size}/{variant}/eval.json",
    log:
        "results/{model}/logs/profile/{size}-{variant}.log",
    benchmark:
        "results/{model}/benchmarks/profile/{size}-{variant}.tsv"
    params:
        code=code("profile.py"),
        metric=config["profile"]["metric"],
        target=config["profile"]["target"],
        max_evals=config["profile"]["max_evals"],
        fail_if_unreachable=config["profile"]["fail_if_unreachable"],
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("profile"),
        runtime=runtime("profile"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/profile.py"
