# Stage: the checkpoint. A local directory is read in place; a preset is built here.


rule tiny_checkpoint:
    output:
        checkpoint=directory("results/{preset}/checkpoint"),
    log:
        "results/{preset}/logs/tiny_checkpoint.log",
    benchmark:
        "results/{preset}/benchmarks/tiny_checkpoint.tsv"
    wildcard_constraints:
        preset="tiny",
    params:
        code=code("build_tiny_checkpoint.py"),
        seed=config["model"]["tiny"]["seed"],
        outlier=canonical(config["model"]["tiny"]["outlier"]),
        text_outlier=canonical(config["model"]["tiny"]["text_outlier"]),
        versions=stage_versions("checkpoint"),
    threads: 1
    resources:
        gpu=0,
        slurm_partition=partition(gpu=False),
        mem_mb=mem_mb("tiny_checkpoint"),
        runtime=runtime("tiny_checkpoint"),
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow/scripts/build_tiny_checkpoint.py"
