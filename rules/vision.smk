# Stage: vision tower -> ONNX per fixed size, then FP16 and simplified variants.
# Every model is parity-gated against the transformers reference of its size.


rule vision_reference:
    input:
        checkpoint=checkpoint_dir,
        images=parity_images(),
    output:
        reference="results/{model}/vision/{size}/reference.npz",
    log:
        "results/{model}/logs/vision_reference/{size}.log",
    benchmark:
        "results/{model}/benchmarks/vision_reference/{size}.tsv"
    params:
        code=code("vision_reference.py"),
        versions=stage_versions("reference"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("vision_reference"),
        runtime=runtime("vision_reference"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/vision_reference.py"


rule export_vision:
    input:
        checkpoint=checkpoint_dir,
        reference=rules.vision_reference.output.reference,
    output:
        model="results/{model}/vision/{size}/fp32/model.onnx",
        data="results/{model}/vision/{size}/fp32/model.onnx.data",
        parity="results/{model}/vision/{size}/fp32/parity.json",
    log:
        "results/{model}/logs/export_vision/{size}.log",
    benchmark:
        "results/{model}/benchmarks/export_vision/{size}.tsv"
    params:
        code=code("export_vision.py"),
        tolerance=tolerance("fp32"),
        batch_size=config["vision"]["batch_size"],
        opset=config["export"]["opset"],
        attn_implementation=config["export"]["attn_implementation"],
        versions=stage_versions("export"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("export_vision"),
        runtime=runtime("export_vision"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/export_vision.py"


rule vision_fp16:
    input:
        model=rules.export_vision.output.model,
        data=rules.export_vision.output.data,
        reference=rules.vision_reference.output.reference,
    output:
        model="results/{model}/vision/{size}/fp16/model.onnx",
        data="results/{model}/vision/{size}/fp16/model.onnx.data",
        parity="results/{model}/vision/{size}/fp16/parity.json",
    log:
        "results/{model}/logs/vision_fp16/{size}.log",
    benchmark:
        "results/{model}/benchmarks/vision_fp16/{size}.tsv"
    params:
        code=code("vision_fp16.py"),
        tolerance=tolerance("fp16"),
        max_activation=config["fp16"]["max_activation"],
        max_initializer=config["fp16"]["max_initializer"],
        versions=stage_versions("fp16"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("vision_fp16"),
        runtime=runtime("vision_fp16"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/vision_fp16.py"


rule vision_simplify:
    input:
        model="results/{model}/vision/{size}/{base}/model.onnx",
        data="results/{model}/vision/{size}/{base}/model.onnx.data",
        reference=rules.vision_reference.output.reference,
    output:
        model="results/{model}/vision/{size}/{base}-sim/model.onnx",
        data="results/{model}/vision/{size}/{base}-sim/model.onnx.data",
        parity="results/{model}/vision/{size}/{base}-sim/parity.json",
    log:
        "results/{model}/logs/vision_simplify/{size}-{base}.log",
    benchmark:
        "results/{model}/benchmarks/vision_simplify/{size}-{base}.tsv"
    params:
        code=code("vision_simplify.py"),
        tolerance=lambda wildcards: tolerance(wildcards.base),
        check_max_bytes=config["simplify"]["check_max_bytes"],
        versions=stage_versions("simplify"),
    threads: config["threads"]
    resources:
        gpu=1,
        slurm_partition=partition(gpu=True),
        mem_mb=mem_mb("vision_simplify"),
        runtime=runtime("vision_simplify"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/vision_simplify.py"
