# Stage: per-op INT8 sensitivity, engine "ort" (one switch model, sharded over jobs).


rule sensitivity_prepare:
    input:
        model="results/{model}/vision/{size}/{variant}/model.onnx",
        data="results/{model}/vision/{size}/{variant}/model.onnx.data",
        calib=rules.calibration.output.calib,
        eval=rules.calibration.output.eval,
    output:
        float_model="results/{model}/sensitivity/vision/{size}/{variant}/engine/float.onnx",
        float_data="results/{model}/sensitivity/vision/{size}/{variant}/engine/float.onnx.data",
        switch="results/{model}/sensitivity/vision/{size}/{variant}/engine/switch.onnx",
        switch_data="results/{model}/sensitivity/vision/{size}/{variant}/engine/switch.onnx.data",
        cache="results/{model}/sensitivity/vision/{size}/{variant}/engine/calibration.json",
        reference="results/{model}/sensitivity/vision/{size}/{variant}/engine/float_outputs.npy",
        meta="results/{model}/sensitivity/vision/{size}/{variant}/engine/engine.json",
    log:
        "results/{model}/logs/sensitivity_prepare/{size}-{variant}.log",
    benchmark:
        "results/{model}/benchmarks/sensitivity_prepare/{size}-{variant}.tsv"
    params:
        settings=canonical(quant_settings()),
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_prepare.py"


rule sensitivity_shard:
    input:
        meta=rules.sensitivity_prepare.output.meta,
        switch=rules.sensitivity_prepare.output.switch,
        switch_data=rules.sensitivity_prepare.output.switch_data,
        reference=rules.sensitivity_prepare.output.reference,
        eval=rules.calibration.output.eval,
    output:
        csv="results/{model}/sensitivity/vision/{size}/{variant}/shards/ort.{i}-of-{n}.csv",
        timing="results/{model}/sensitivity/vision/{size}/{variant}/shards/ort.{i}-of-{n}.json",
    log:
        "results/{model}/logs/sensitivity_shard/{size}-{variant}-{i}-of-{n}.log",
    benchmark:
        "results/{model}/benchmarks/sensitivity_shard/{size}-{variant}-{i}-of-{n}.tsv"
    wildcard_constraints:
        i=r"\d+",
        n=r"\d+",
    params:
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_shard.py"


rule sensitivity_gather:
    input:
        meta=rules.sensitivity_prepare.output.meta,
        switch=rules.sensitivity_prepare.output.switch,
        reference=rules.sensitivity_prepare.output.reference,
        eval=rules.calibration.output.eval,
        shards=shard_csvs,
    output:
        csv="results/{model}/sensitivity/vision/{size}/{variant}/ort.csv",
        summary="results/{model}/sensitivity/vision/{size}/{variant}/ort.json",
    log:
        "results/{model}/logs/sensitivity_gather/{size}-{variant}.log",
    benchmark:
        "results/{model}/benchmarks/sensitivity_gather/{size}-{variant}.tsv"
    params:
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_gather.py"
