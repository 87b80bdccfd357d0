# Stages that run a tower's own code (vlsens.export; the towers: vlsens.export.towers): the
# reference, the FP32 export, the calibration set (and its NPU layout). One rule each over the
# {graph} wildcard; the tower of a graph supplies its settings (params), its calibration inputs,
# its code hash and its libraries.


rule reference:
    input:
        checkpoint=checkpoint_dir,
        images=INPUTS["parity_images"],
    output:
        reference=paths.REFERENCE,
    params:
        settings=tower_settings("reference"),
        provenance=tower_provenance("reference", "reference.py"),
    log:
        paths.log("reference"),
    benchmark:
        paths.benchmark("reference")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("reference", threads=config["threads"]),
    script:
        "../workflow/scripts/reference.py"


# Writes every graph file of the tower (model.onnx, published last; the text tower's embeds.onnx)
# and parity.json, which lists them all with their hashes.
rule export:
    input:
        checkpoint=checkpoint_dir,
        reference=rules.reference.output.reference,
    output:
        **gated(paths.in_variant("fp32")),
    params:
        settings=tower_settings("export"),
        tolerance=tolerance("fp32"),
        provenance=tower_provenance("export", "export.py"),
    log:
        paths.log("export"),
    benchmark:
        paths.benchmark("export")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("export", threads=config["threads"]),
    script:
        "../workflow/scripts/export.py"


rule calibration:
    input:
        unpack(calibration_inputs),
    output:
        **paths.files(paths.CALIB, paths.CALIB_FILES),
    params:
        settings=tower_settings("calibration"),
        provenance=tower_provenance("calibration", "calibration.py"),
    log:
        paths.log("calibration"),
    benchmark:
        paths.benchmark("calibration")
    conda:
        "../envs/torch.yaml"
    threads: cores(calibration_threads)
    resources:
        **cluster(
            "calibration",
            gpu=lambda wildcards: int(tower(wildcards).calibration_runs_model),
            threads=calibration_threads,
        ),
    script:
        "../workflow/scripts/calibration.py"


# The calibration set in the layout NPU toolchains (AXERA Pulsar2) take: one .npy per sample.
rule calibration_tar:
    input:
        **CALIB_SETS,
    output:
        **paths.files(paths.CALIB, paths.NPU_FILES),
    params:
        provenance=provenance("npu_archive", "calibration_tar.py"),
    log:
        paths.log("calibration_tar"),
    benchmark:
        paths.benchmark("calibration_tar")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("calibration_tar", gpu=False),
    script:
        "../workflow/scripts/calibration_tar.py"
