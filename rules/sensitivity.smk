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
        reference="results/{model}/sensitivity/vision/{size}/{variant}/engine/float_outputs.npz",
        meta="results/{model}/sensitivity/vision/{size}/{variant}/engine/engine.json",
    log:
        "results/{model}/logs/sensitivity_prepare/{size}-{variant}.log",
    benchmark:
        "results/{model}/benchmarks/sensitivity_prepare/{size}-{variant}.tsv"
    params:
        code=code("sensitivity_prepare.py"),
        settings=canonical(quant_settings()),
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("sensitivity_prepare"),
        runtime=runtime("sensitivity_prepare"),
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
        code=code("sensitivity_shard.py"),
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("sensitivity_shard"),
        runtime=runtime("sensitivity_shard"),
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
        code=code("sensitivity_gather.py"),
        versions=stage_versions("sensitivity"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("sensitivity_gather"),
        runtime=runtime("sensitivity_gather"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_gather.py"


# Engine "inc": Intel Neural Compressor 3.7.1, strategy mse_v2, in its own environment. A shell
# rule because the script runs with INC's interpreter, not Snakemake's (src/vlsens/inc.py says
# why). CPU only: INC's ONNX Runtime adaptor creates its sessions with the CPU provider.
rule sensitivity_inc:
    input:
        model="results/{model}/vision/{size}/{variant}/model.onnx",
        data="results/{model}/vision/{size}/{variant}/model.onnx.data",
        calib=rules.calibration.output.calib,
        eval=rules.calibration.output.eval,
    output:
        csv="results/{model}/sensitivity/vision/{size}/{variant}/inc.csv",
        summary="results/{model}/sensitivity/vision/{size}/{variant}/inc.json",
    log:
        "results/{model}/logs/sensitivity_inc/{size}-{variant}.log",
    benchmark:
        "results/{model}/benchmarks/sensitivity_inc/{size}-{variant}.tsv"
    wildcard_constraints:
        variant="fp32",
    params:
        code=code("sensitivity_inc.py"),
        python=INC_PYTHON,
        script=INC_SCRIPT,
        settings=inc_settings_json(),
        max_ops=config["sensitivity"]["inc"]["max_ops"],
        versions=inc_versions(),
    threads: config["threads"]
    resources:
        gpu=0,
        slurm_partition=partition(gpu=False),
        mem_mb=mem_mb("sensitivity_inc"),
        runtime=runtime("sensitivity_inc"),
    conda:
        "../envs/inc.yaml"
    shell:
        "{params.python} {params.script} --model {input.model:q} --calib {input.calib:q}"
        " --eval {input.eval:q} --csv {output.csv:q} --summary {output.summary:q} --log {log:q}"
        " --settings {params.settings:q} --max-ops {params.max_ops} --threads {threads}"


# INC's own fallback run to the profile's target (sensitivity.inc.tune: true).
rule sensitivity_inc_tune:
    input:
        model="results/{model}/vision/{size}/{variant}/model.onnx",
        data="results/{model}/vision/{size}/{variant}/model.onnx.data",
        calib=rules.calibration.output.calib,
        eval=rules.calibration.output.eval,
    output:
        eval="results/{model}/sensitivity/vision/{size}/{variant}/inc-tune/eval.json",
    log:
        "results/{model}/logs/sensitivity_inc_tune/{size}-{variant}.log",
    benchmark:
        "results/{model}/benchmarks/sensitivity_inc_tune/{size}-{variant}.tsv"
    wildcard_constraints:
        variant="fp32",
    params:
        code=code("sensitivity_inc.py"),
        python=INC_PYTHON,
        script=INC_SCRIPT,
        settings=inc_settings_json(),
        metric=config["profile"]["metric"],
        target=config["profile"]["target"],
        max_trials=config["sensitivity"]["inc"]["max_trials"],
        versions=inc_versions(),
    threads: config["threads"]
    resources:
        gpu=0,
        slurm_partition=partition(gpu=False),
        mem_mb=mem_mb("sensitivity_inc_tune"),
        runtime=runtime("sensitivity_inc_tune"),
    conda:
        "../envs/inc.yaml"
    shell:
        "{params.python} {params.script} --tune --model {input.model:q} --calib {input.calib:q}"
        " --eval {input.eval:q} --summary {output.eval:q} --log {log:q}"
        " --settings {params.settings:q} --metric {params.metric} --target {params.target}"
        " --max-trials {params.max_trials} --threads {threads}"


rule sensitivity_compare:
    input:
        ort_csv="results/{model}/sensitivity/vision/{size}/{variant}/ort.csv",
        ort_json="results/{model}/sensitivity/vision/{size}/{variant}/ort.json",
        inc_csv="results/{model}/sensitivity/vision/{size}/{variant}/inc.csv",
        inc_json="results/{model}/sensitivity/vision/{size}/{variant}/inc.json",
    output:
        "results/{model}/sensitivity/vision/{size}/{variant}/compare.json",
    log:
        "results/{model}/logs/sensitivity_compare/{size}-{variant}.log",
    benchmark:
        "results/{model}/benchmarks/sensitivity_compare/{size}-{variant}.tsv"
    params:
        code=code("sensitivity_compare.py"),
        top_k=config["sensitivity"]["compare"]["top_k"],
    resources:
        gpu=0,
        slurm_partition=partition(gpu=False),
        mem_mb=mem_mb("sensitivity_compare"),
        runtime=runtime("sensitivity_compare"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/sensitivity_compare.py"
