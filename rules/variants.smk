# Variants of a verified model folder, for every graph: FP16 (I/O FP32, range-based FP32 fallback),
# BF16 (vision graphs; I/O FP32) and onnxsim. Every graph file the reference cases name is transformed and the folder is gated on
# every case (vlsens.variants).


rule fp16:
    input:
        model=rules.export.output.model,
        parity=rules.export.output.parity,
        reference=rules.reference.output.reference,
    output:
        model=paths.in_variant("fp16"),
        data=paths.data(paths.in_variant("fp16")),
        parity=record("fp16"),
    log:
        paths.log("fp16"),
    benchmark:
        paths.benchmark("fp16")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("fp16", threads=config["threads"]),
    params:
        tolerance=tolerance("fp16"),
        max_activation=config["fp16"]["max_activation"],
        max_initializer=config["fp16"]["max_initializer"],
        provenance=provenance("fp16", "fp16.py"),
    script:
        "../workflow/scripts/fp16.py"


rule bf16:
    input:
        model=rules.export.output.model,
        parity=rules.export.output.parity,
        reference=rules.reference.output.reference,
    output:
        model=paths.in_variant("bf16"),
        data=paths.data(paths.in_variant("bf16")),
        parity=record("bf16"),
    log:
        paths.log("bf16"),
    benchmark:
        paths.benchmark("bf16")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("bf16", threads=config["threads"]),
    params:
        tolerance=tolerance("bf16"),
        provenance=provenance("bf16", "bf16.py"),
    script:
        "../workflow/scripts/bf16.py"


rule simplify:
    input:
        model=paths.in_variant("{base}"),
        parity=record("{base}"),
        reference=rules.reference.output.reference,
    output:
        model=paths.in_variant("{base}-sim"),
        data=paths.data(paths.in_variant("{base}-sim")),
        parity=record("{base}-sim"),
    log:
        paths.log("simplify", "{base}"),
    benchmark:
        paths.benchmark("simplify", "{base}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("simplify", threads=config["threads"]),
    params:
        tolerance=lambda wildcards: tolerance(wildcards.base),
        check_max_bytes=config["simplify"]["check_max_bytes"],
        provenance=provenance("simplify", "simplify.py"),
    script:
        "../workflow/scripts/simplify.py"
