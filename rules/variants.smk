# Variants of a verified model folder, for every graph: FP16 (I/O FP32, range-based FP32 fallback),
# BF16 (vision graphs; I/O FP32), onnxsim and fp32-smooth (fixed-size vision graphs: outlier
# channels migrated into the weights, SmoothQuant-style, strength per site measured on the
# calibration set). Every graph file the reference cases name is transformed and the folder is gated on
# every case (vlsens.variants).


rule fp16:
    input:
        **variant_inputs("fp32"),
    output:
        **gated(paths.in_variant("fp16")),
    params:
        tolerance=tolerance("fp16"),
        max_activation=config["fp16"]["max_activation"],
        max_initializer=config["fp16"]["max_initializer"],
        provenance=provenance("fp16", "fp16.py"),
    log:
        paths.log("fp16"),
    benchmark:
        paths.benchmark("fp16")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("fp16", threads=config["threads"]),
    script:
        "../workflow/scripts/fp16.py"


rule bf16:
    input:
        **variant_inputs("fp32"),
    output:
        **gated(paths.in_variant("bf16")),
    params:
        tolerance=tolerance("bf16"),
        provenance=provenance("bf16", "bf16.py"),
    log:
        paths.log("bf16"),
    benchmark:
        paths.benchmark("bf16")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("bf16", threads=config["threads"]),
    script:
        "../workflow/scripts/bf16.py"


rule smooth:
    input:
        **variant_inputs("fp32"),
        calib=CALIB["calib"],
    output:
        **gated(paths.in_variant("fp32-smooth")),
    params:
        tolerance=tolerance("fp32"),
        settings=quant_settings("weight_rounding"),  # the migration is chosen with round to nearest
        provenance=provenance("smooth", "smooth.py"),
    log:
        paths.log("smooth"),
    benchmark:
        paths.benchmark("smooth")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("smooth", threads=config["threads"]),
    script:
        "../workflow/scripts/smooth.py"


rule simplify:
    input:
        **variant_inputs("{base}"),
    output:
        **gated(paths.in_variant("{base}-sim")),
    params:
        tolerance=lambda wildcards: tolerance(wildcards.base),
        check_max_bytes=config["simplify"]["check_max_bytes"],
        provenance=provenance("simplify", "simplify.py"),
    log:
        paths.log("simplify", "{base}"),
    benchmark:
        paths.benchmark("simplify", "{base}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("simplify", threads=config["threads"]),
    script:
        "../workflow/scripts/simplify.py"
