# Stage: one vision graph for every image size (index tensors as inputs, src/vlsens/dynamic.py),
# its FP16 and simplified variants, per-size calibration, sensitivity and profile. Every model is
# parity-gated at several sizes (partial windows included) and on a 2-image call.


rule dynamic_reference:
    input:
        checkpoint=checkpoint_dir,
        images=parity_images(),
    output:
        reference="results/{model}/vision/dynamic/reference.npz",
    log:
        "results/{model}/logs/dynamic_reference/reference.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_reference/reference.tsv"
    params:
        code=code("dynamic_reference.py"),
        cases=config["vision"]["dynamic"]["parity_cases"],
        versions=stage_versions("reference"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("dynamic_reference"),
        runtime=runtime("dynamic_reference"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/dynamic_reference.py"


rule export_dynamic:
    input:
        checkpoint=checkpoint_dir,
        reference=rules.dynamic_reference.output.reference,
    output:
        model="results/{model}/vision/dynamic/fp32/model.onnx",
        data="results/{model}/vision/dynamic/fp32/model.onnx.data",
        parity="results/{model}/vision/dynamic/fp32/parity.json",
    log:
        "results/{model}/logs/export_dynamic/fp32.log",
    benchmark:
        "results/{model}/benchmarks/export_dynamic/fp32.tsv"
    params:
        code=code("export_dynamic.py"),
        tolerance=tolerance("fp32"),
        opset=config["export"]["opset"],
        versions=stage_versions("export"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("export_dynamic"),
        runtime=runtime("export_dynamic"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/export_dynamic.py"


rule dynamic_fp16:
    input:
        model=rules.export_dynamic.output.model,
        data=rules.export_dynamic.output.data,
        reference=rules.dynamic_reference.output.reference,
    output:
        model="results/{model}/vision/dynamic/fp16/model.onnx",
        data="results/{model}/vision/dynamic/fp16/model.onnx.data",
        parity="results/{model}/vision/dynamic/fp16/parity.json",
    log:
        "results/{model}/logs/dynamic_fp16/fp16.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_fp16/fp16.tsv"
    params:
        code=code("dynamic_variant.py"),
        tolerance=tolerance("fp16"),
        max_activation=config["fp16"]["max_activation"],
        max_initializer=config["fp16"]["max_initializer"],
        versions=stage_versions("fp16"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("dynamic_fp16"),
        runtime=runtime("dynamic_fp16"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/dynamic_variant.py"


rule dynamic_simplify:
    input:
        model="results/{model}/vision/dynamic/{base}/model.onnx",
        data="results/{model}/vision/dynamic/{base}/model.onnx.data",
        reference=rules.dynamic_reference.output.reference,
    output:
        model="results/{model}/vision/dynamic/{base}-sim/model.onnx",
        data="results/{model}/vision/dynamic/{base}-sim/model.onnx.data",
        parity="results/{model}/vision/dynamic/{base}-sim/parity.json",
    log:
        "results/{model}/logs/dynamic_simplify/{base}.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_simplify/{base}.tsv"
    params:
        code=code("dynamic_variant.py"),
        tolerance=lambda wildcards: tolerance(wildcards.base),
        check_max_bytes=config["simplify"]["check_max_bytes"],
        versions=stage_versions("simplify"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("dynamic_simplify"),
        runtime=runtime("dynamic_simplify"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/dynamic_variant.py"


rule dynamic_calibration:
    input:
        checkpoint=checkpoint_dir,
        calib=expand("results/{{model}}/calib/vision/{size}/calib.npz", size=PLAN.sizes),
        eval=expand("results/{{model}}/calib/vision/{size}/eval.npz", size=PLAN.sizes),
    output:
        calib="results/{model}/calib/vision/dynamic/calib.npz",
        eval="results/{model}/calib/vision/dynamic/eval.npz",
    log:
        "results/{model}/logs/dynamic_calibration/dynamic.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_calibration/dynamic.tsv"
    params:
        code=code("dynamic_calibration.py"),
        sizes=PLAN.sizes,
        versions=stage_versions("calibration"),
    threads: 1
    resources:
        gpu=0,
        slurm_partition=partition(gpu=False),
        mem_mb=mem_mb("dynamic_calibration"),
        runtime=runtime("dynamic_calibration"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/dynamic_calibration.py"


use rule text_sensitivity_prepare as dynamic_sensitivity_prepare with:
    input:
        model="results/{model}/vision/dynamic/{variant}/model.onnx",
        data="results/{model}/vision/dynamic/{variant}/model.onnx.data",
        calib=rules.dynamic_calibration.output.calib,
        eval=rules.dynamic_calibration.output.eval,
    output:
        float_model="results/{model}/sensitivity/vision/dynamic/{variant}/engine/float.onnx",
        float_data="results/{model}/sensitivity/vision/dynamic/{variant}/engine/float.onnx.data",
        switch="results/{model}/sensitivity/vision/dynamic/{variant}/engine/switch.onnx",
        switch_data="results/{model}/sensitivity/vision/dynamic/{variant}/engine/switch.onnx.data",
        cache="results/{model}/sensitivity/vision/dynamic/{variant}/engine/calibration.json",
        reference="results/{model}/sensitivity/vision/dynamic/{variant}/engine/float_outputs.npz",
        meta="results/{model}/sensitivity/vision/dynamic/{variant}/engine/engine.json",
    log:
        "results/{model}/logs/dynamic_sensitivity_prepare/{variant}.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_sensitivity_prepare/{variant}.tsv"
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("dynamic_sensitivity_prepare"),
        runtime=runtime("dynamic_sensitivity_prepare"),


use rule text_sensitivity_shard as dynamic_sensitivity_shard with:
    input:
        meta=rules.dynamic_sensitivity_prepare.output.meta,
        switch=rules.dynamic_sensitivity_prepare.output.switch,
        switch_data=rules.dynamic_sensitivity_prepare.output.switch_data,
        reference=rules.dynamic_sensitivity_prepare.output.reference,
        eval=rules.dynamic_calibration.output.eval,
    output:
        csv="results/{model}/sensitivity/vision/dynamic/{variant}/shards/ort.{i}-of-{n}.csv",
        timing="results/{model}/sensitivity/vision/dynamic/{variant}/shards/ort.{i}-of-{n}.json",
    log:
        "results/{model}/logs/dynamic_sensitivity_shard/{variant}-{i}-of-{n}.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_sensitivity_shard/{variant}-{i}-of-{n}.tsv"
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("dynamic_sensitivity_shard"),
        runtime=runtime("dynamic_sensitivity_shard"),


use rule text_sensitivity_gather as dynamic_sensitivity_gather with:
    input:
        meta=rules.dynamic_sensitivity_prepare.output.meta,
        switch=rules.dynamic_sensitivity_prepare.output.switch,
        reference=rules.dynamic_sensitivity_prepare.output.reference,
        eval=rules.dynamic_calibration.output.eval,
        shards=dynamic_shard_csvs,
    output:
        csv="results/{model}/sensitivity/vision/dynamic/{variant}/ort.csv",
        summary="results/{model}/sensitivity/vision/dynamic/{variant}/ort.json",
    log:
        "results/{model}/logs/dynamic_sensitivity_gather/{variant}.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_sensitivity_gather/{variant}.tsv"
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("dynamic_sensitivity_gather"),
        runtime=runtime("dynamic_sensitivity_gather"),


use rule text_profile as dynamic_profile with:
    input:
        meta=rules.dynamic_sensitivity_prepare.output.meta,
        switch=rules.dynamic_sensitivity_prepare.output.switch,
        float_model=rules.dynamic_sensitivity_prepare.output.float_model,
        cache=rules.dynamic_sensitivity_prepare.output.cache,
        reference=rules.dynamic_sensitivity_prepare.output.reference,
        ranking=rules.dynamic_sensitivity_gather.output.csv,
        eval=rules.dynamic_calibration.output.eval,
        fp32="results/{model}/vision/dynamic/fp32/model.onnx",
        fp16="results/{model}/vision/dynamic/fp16/model.onnx",
    output:
        model="results/{model}/profile/vision/dynamic/{variant}/model.onnx",
        data="results/{model}/profile/vision/dynamic/{variant}/model.onnx.data",
        profile="results/{model}/profile/vision/dynamic/{variant}/profile.yaml",
        exclude="results/{model}/profile/vision/dynamic/{variant}/nodes_to_exclude.json",
        inc="results/{model}/profile/vision/dynamic/{variant}/inc_op_name_dict.json",
        eval="results/{model}/profile/vision/dynamic/{variant}/eval.json",
    log:
        "results/{model}/logs/dynamic_profile/{variant}.log",
    benchmark:
        "results/{model}/benchmarks/dynamic_profile/{variant}.tsv"
    params:
        code=code("profile.py"),
        metric=config["profile"]["metric"],
        target=config["profile"]["target"],
        max_evals=config["profile"]["max_evals"],
        fail_if_unreachable=config["profile"]["fail_if_unreachable"],
        versions=stage_versions("sensitivity"),
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("dynamic_profile"),
        runtime=runtime("dynamic_profile"),
