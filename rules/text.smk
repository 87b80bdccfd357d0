# Stage: the text LM (language_model + lm_head) -> two ONNX graphs per variant (model.onnx from
# token ids, embeds.onnx from merged embeddings + 3-D positions), FP16 and simplified variants,
# calibration sequences, sensitivity (engine ort on embeds.onnx) and the profile. Every model is
# parity-gated against transformers' logits.


rule text_reference:
    input:
        checkpoint=checkpoint_dir,
        images=parity_images(),
    output:
        reference="results/{model}/text/reference.npz",
    log:
        "results/{model}/logs/text_reference/reference.log",
    benchmark:
        "results/{model}/benchmarks/text_reference/reference.tsv"
    params:
        code=code("text_reference.py"),
        repeats=config["text"]["parity"]["repeats"],
        image_size=config["text"]["parity"]["image_size"],
        versions=stage_versions("reference"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_reference"),
        runtime=runtime("text_reference"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/text_reference.py"


rule export_text:
    input:
        checkpoint=checkpoint_dir,
        reference=rules.text_reference.output.reference,
    output:
        model="results/{model}/text/fp32/model.onnx",
        data="results/{model}/text/fp32/model.onnx.data",
        embeds="results/{model}/text/fp32/embeds.onnx",
        embeds_data="results/{model}/text/fp32/embeds.onnx.data",
        parity="results/{model}/text/fp32/parity.json",
    log:
        "results/{model}/logs/export_text/fp32.log",
    benchmark:
        "results/{model}/benchmarks/export_text/fp32.tsv"
    params:
        code=code("export_text.py"),
        tolerance=tolerance("fp32"),
        exporter=config["text"]["exporter"],
        fallback=config["text"]["fallback"],
        opset=config["export"]["opset"],
        versions=stage_versions("export"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("export_text"),
        runtime=runtime("export_text"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/export_text.py"


rule text_fp16:
    input:
        model=rules.export_text.output.model,
        embeds=rules.export_text.output.embeds,
        data=rules.export_text.output.data,
        embeds_data=rules.export_text.output.embeds_data,
        reference=rules.text_reference.output.reference,
    output:
        model="results/{model}/text/fp16/model.onnx",
        data="results/{model}/text/fp16/model.onnx.data",
        embeds="results/{model}/text/fp16/embeds.onnx",
        embeds_data="results/{model}/text/fp16/embeds.onnx.data",
        parity="results/{model}/text/fp16/parity.json",
    log:
        "results/{model}/logs/text_fp16/fp16.log",
    benchmark:
        "results/{model}/benchmarks/text_fp16/fp16.tsv"
    params:
        code=code("text_fp16.py"),
        tolerance=tolerance("fp16"),
        max_activation=config["fp16"]["max_activation"],
        max_initializer=config["fp16"]["max_initializer"],
        versions=stage_versions("fp16"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_fp16"),
        runtime=runtime("text_fp16"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/text_fp16.py"


rule text_simplify:
    input:
        model="results/{model}/text/{base}/model.onnx",
        embeds="results/{model}/text/{base}/embeds.onnx",
        data="results/{model}/text/{base}/model.onnx.data",
        embeds_data="results/{model}/text/{base}/embeds.onnx.data",
        reference=rules.text_reference.output.reference,
    output:
        model="results/{model}/text/{base}-sim/model.onnx",
        data="results/{model}/text/{base}-sim/model.onnx.data",
        embeds="results/{model}/text/{base}-sim/embeds.onnx",
        embeds_data="results/{model}/text/{base}-sim/embeds.onnx.data",
        parity="results/{model}/text/{base}-sim/parity.json",
    log:
        "results/{model}/logs/text_simplify/{base}.log",
    benchmark:
        "results/{model}/benchmarks/text_simplify/{base}.tsv"
    params:
        code=code("text_simplify.py"),
        tolerance=lambda wildcards: tolerance(wildcards.base),
        check_max_bytes=config["simplify"]["check_max_bytes"],
        versions=stage_versions("simplify"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_simplify"),
        runtime=runtime("text_simplify"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/text_simplify.py"


rule text_calibration:
    input:
        checkpoint=checkpoint_dir,
        images=calibration_images(),
        prompts=text_prompt_files(),
    output:
        calib="results/{model}/calib/text/calib.npz",
        eval="results/{model}/calib/text/eval.npz",
        manifest="results/{model}/calib/text/manifest.json",
    log:
        "results/{model}/logs/text_calibration/text.log",
    benchmark:
        "results/{model}/benchmarks/text_calibration/text.tsv"
    params:
        code=code("text_calibration.py"),
        prompts=config["text"]["calibration"]["prompts"],
        image_size=config["text"]["calibration"]["image_size"],
        num_calib=config["text"]["calibration"]["num_calib"],
        num_eval=config["text"]["calibration"]["num_eval"],
        seed=config["text"]["calibration"]["seed"],
        versions=stage_versions("text_calibration"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_calibration"),
        runtime=runtime("text_calibration"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/text_calibration.py"


rule text_sensitivity_prepare:
    input:
        model="results/{model}/text/{variant}/embeds.onnx",
        data="results/{model}/text/{variant}/embeds.onnx.data",
        calib=rules.text_calibration.output.calib,
        eval=rules.text_calibration.output.eval,
    output:
        float_model="results/{model}/sensitivity/text/{variant}/engine/float.onnx",
        float_data="results/{model}/sensitivity/text/{variant}/engine/float.onnx.data",
        switch="results/{model}/sensitivity/text/{variant}/engine/switch.onnx",
        switch_data="results/{model}/sensitivity/text/{variant}/engine/switch.onnx.data",
        cache="results/{model}/sensitivity/text/{variant}/engine/calibration.json",
        reference="results/{model}/sensitivity/text/{variant}/engine/float_outputs.npz",
        meta="results/{model}/sensitivity/text/{variant}/engine/engine.json",
    log:
        "results/{model}/logs/text_sensitivity_prepare/{variant}.log",
    benchmark:
        "results/{model}/benchmarks/text_sensitivity_prepare/{variant}.tsv"
    params:
        code=code("sensitivity_prepare.py"),
        settings=canonical(quant_settings()),
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_sensitivity_prepare"),
        runtime=runtime("text_sensitivity_prepare"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_prepare.py"


rule text_sensitivity_shard:
    input:
        meta=rules.text_sensitivity_prepare.output.meta,
        switch=rules.text_sensitivity_prepare.output.switch,
        switch_data=rules.text_sensitivity_prepare.output.switch_data,
        reference=rules.text_sensitivity_prepare.output.reference,
        eval=rules.text_calibration.output.eval,
    output:
        csv="results/{model}/sensitivity/text/{variant}/shards/ort.{i}-of-{n}.csv",
        timing="results/{model}/sensitivity/text/{variant}/shards/ort.{i}-of-{n}.json",
    log:
        "results/{model}/logs/text_sensitivity_shard/{variant}-{i}-of-{n}.log",
    benchmark:
        "results/{model}/benchmarks/text_sensitivity_shard/{variant}-{i}-of-{n}.tsv"
    wildcard_constraints:
        i=r"\d+",
        n=r"\d+",
    params:
        code=code("sensitivity_shard.py"),
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_sensitivity_shard"),
        runtime=runtime("text_sensitivity_shard"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_shard.py"


rule text_sensitivity_gather:
    input:
        meta=rules.text_sensitivity_prepare.output.meta,
        switch=rules.text_sensitivity_prepare.output.switch,
        reference=rules.text_sensitivity_prepare.output.reference,
        eval=rules.text_calibration.output.eval,
        shards=text_shard_csvs,
    output:
        csv="results/{model}/sensitivity/text/{variant}/ort.csv",
        summary="results/{model}/sensitivity/text/{variant}/ort.json",
    log:
        "results/{model}/logs/text_sensitivity_gather/{variant}.log",
    benchmark:
        "results/{model}/benchmarks/text_sensitivity_gather/{variant}.tsv"
    params:
        code=code("sensitivity_gather.py"),
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_sensitivity_gather"),
        runtime=runtime("text_sensitivity_gather"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_gather.py"


rule text_profile:
    input:
        meta=rules.text_sensitivity_prepare.output.meta,
        switch=rules.text_sensitivity_prepare.output.switch,
        float_model=rules.text_sensitivity_prepare.output.float_model,
        cache=rules.text_sensitivity_prepare.output.cache,
        reference=rules.text_sensitivity_prepare.output.reference,
        ranking=rules.text_sensitivity_gather.output.csv,
        eval=rules.text_calibration.output.eval,
        fp32="results/{model}/text/fp32/embeds.onnx",
        fp16="results/{model}/text/fp16/embeds.onnx",
    output:
        model="results/{model}/profile/text/{variant}/model.onnx",
        data="results/{model}/profile/text/{variant}/model.onnx.data",
        profile="results/{model}/profile/text/{variant}/profile.yaml",
        exclude="results/{model}/profile/text/{variant}/nodes_to_exclude.json",
        inc="results/{model}/profile/text/{variant}/inc_op_name_dict.json",
        eval="results/{model}/profile/text/{variant}/eval.json",
    log:
        "results/{model}/logs/text_profile/{variant}.log",
    benchmark:
        "results/{model}/benchmarks/text_profile/{variant}.tsv"
    params:
        code=code("profile.py"),
        metric=config["text"]["profile"]["metric"],
        target=config["text"]["profile"]["target"],
        max_evals=config["text"]["profile"]["max_evals"],
        fail_if_unreachable=config["text"]["profile"]["fail_if_unreachable"],
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("text_profile"),
        runtime=runtime("text_profile"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/profile.py"
