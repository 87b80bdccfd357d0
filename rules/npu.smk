# NPU toolchains: a fixed-size vision graph's variant cut at block boundaries into single-file
# parts (vlsens.npu), gated chained against transformers and through onnxsim's Python API, and
# each part's calibration archives (its own inputs, from the earlier parts on the calibration set);
# the token embedding table as raw binaries (vlsens.npu.embeddings); on an NPU quant.target, each
# fixed-size graph's profile as the toolchains take it (vlsens.npu.toolchain).


rule parts:
    input:
        **variant_inputs(),
    output:
        parts=directory(paths.PARTS),
    params:
        tolerance=lambda wildcards: tolerance(wildcards.variant),
        parts=config["vision"]["parts"]["count"],
        max_bytes=config["vision"]["parts"]["max_bytes"],
        provenance=provenance("parts", "parts.py"),
    log:
        paths.log("parts", "{variant}"),
    benchmark:
        paths.benchmark("parts", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("parts", threads=config["threads"]),
    script:
        "../workflow/scripts/parts.py"


rule parts_calibration:
    input:
        parts=rules.parts.output.parts,
        calib=CALIB["calib"],
        eval=CALIB["eval"],
    output:
        archives=directory(paths.PARTS_CALIB),
    params:
        provenance=provenance("parts", "parts_calibration.py"),
    log:
        paths.log("parts_calibration", "{variant}"),
    benchmark:
        paths.benchmark("parts_calibration", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("parts_calibration", threads=config["threads"]),
    script:
        "../workflow/scripts/parts_calibration.py"


rule toolchain:
    input:
        unpack(toolchain_inputs),
    output:
        toolchain=directory(paths.TOOLCHAIN),
    params:
        root=lambda wildcards: paths.fill(paths.MODEL, model=wildcards.model),
        provenance=provenance("toolchain", "toolchain.py"),
    log:
        paths.log("toolchain", "{variant}"),
    benchmark:
        paths.benchmark("toolchain", "{variant}")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("toolchain", gpu=False),
    script:
        "../workflow/scripts/toolchain.py"


rule embeddings:
    input:
        checkpoint=checkpoint_dir,
    output:
        embeddings=directory(paths.EMBEDDINGS),
    params:
        dtypes=config["embeddings"]["dtypes"],
        checkpoint=lambda wildcards: PLAN.checkpoint,
        provenance=provenance("embeddings", "embeddings.py"),
    log:
        paths.model_log("embeddings"),
    benchmark:
        paths.model_benchmark("embeddings")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("embeddings", gpu=False),
    script:
        "../workflow/scripts/embeddings.py"
