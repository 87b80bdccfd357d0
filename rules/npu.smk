# NPU toolchains: a fixed-size vision graph's variant cut at block boundaries into single-file
# parts (vlsens.npu), gated chained against transformers and through onnxsim's Python API, and
# each part's calibration archives (its own inputs, from the earlier parts on the calibration set);
# the token embedding table as raw binaries (vlsens.npu.embeddings).


rule parts:
    input:
        model=paths.in_variant(),
        parity=record("{variant}"),
        reference=rules.reference.output.reference,
    output:
        parts=directory(paths.PARTS),
    log:
        paths.log("parts", "{variant}"),
    benchmark:
        paths.benchmark("parts", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("parts", threads=config["threads"]),
    params:
        tolerance=lambda wildcards: tolerance(wildcards.variant),
        parts=config["vision"]["parts"]["count"],
        max_bytes=config["vision"]["parts"]["max_bytes"],
        provenance=provenance("parts", "parts.py"),
    script:
        "../workflow/scripts/parts.py"


rule parts_calibration:
    input:
        parts=rules.parts.output.parts,
        calib=f"{paths.CALIB}/{paths.CALIB_FILES['calib']}",
        eval=f"{paths.CALIB}/{paths.CALIB_FILES['eval']}",
    output:
        archives=directory(paths.PARTS_CALIB),
    log:
        paths.log("parts_calibration", "{variant}"),
    benchmark:
        paths.benchmark("parts_calibration", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("parts_calibration", threads=config["threads"]),
    params:
        provenance=provenance("parts", "parts_calibration.py"),
    script:
        "../workflow/scripts/parts_calibration.py"


rule embeddings:
    input:
        checkpoint=checkpoint_dir,
    output:
        embeddings=directory(paths.EMBEDDINGS),
    log:
        paths.model_log("embeddings"),
    benchmark:
        f"{paths.MODEL}/benchmarks/embeddings.tsv"
    conda:
        "../envs/onnx.yaml"
    threads: 1
    resources:
        **cluster("embeddings", gpu=False),
    params:
        dtypes=config["embeddings"]["dtypes"],
        checkpoint=lambda wildcards: PLAN.checkpoint,
        provenance=provenance("embeddings", "embeddings.py"),
    script:
        "../workflow/scripts/embeddings.py"
