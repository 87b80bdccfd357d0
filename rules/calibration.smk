# Stage: calibration and evaluation tensors per image size (the checkpoint's own processor).


rule calibration:
    input:
        checkpoint=checkpoint_dir,
        images=calibration_images(),
    output:
        calib="results/{model}/calib/vision/{size}/calib.npz",
        eval="results/{model}/calib/vision/{size}/eval.npz",
        calib_tar="results/{model}/calib/vision/{size}/calib.tar",
        eval_tar="results/{model}/calib/vision/{size}/eval.tar",
        manifest="results/{model}/calib/vision/{size}/manifest.json",
    log:
        "results/{model}/logs/calibration/{size}.log",
    benchmark:
        "results/{model}/benchmarks/calibration/{size}.tsv"
    params:
        code=code("calibration.py"),
        num_calib=config["calibration"]["num_calib"],
        num_eval=config["calibration"]["num_eval"],
        seed=config["calibration"]["seed"],
        skip_unreadable=config["calibration"]["skip_unreadable"],
        versions=stage_versions("calibration"),
    threads: 1
    resources:
        gpu=0,
        slurm_partition=partition(gpu=False),
        mem_mb=mem_mb("calibration"),
        runtime=runtime("calibration"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/calibration.py"
