# The checkpoint. A local directory is read in place (its content manifest is the rules' input);
# a preset (tiny, 3b) is built here, a complete Hugging Face checkpoint.


rule tiny_checkpoint:
    output:
        checkpoint=directory(paths.CHECKPOINT),
    wildcard_constraints:
        model=PRESET_NAMES["tiny"],
    params:
        **tiny_text_layers(),
        **tiny_weights(),
        preset=config["model"]["checkpoint"],
        seed=config["model"]["tiny"]["seed"],
        outlier=canonical(config["model"]["tiny"]["outlier"]),
        text_outlier=canonical(config["model"]["tiny"]["text_outlier"]),
        provenance=provenance("checkpoint", "build_tiny_checkpoint.py"),
    log:
        paths.model_log("tiny_checkpoint"),
    benchmark:
        paths.model_benchmark("tiny_checkpoint")
    conda:
        "../envs/torch.yaml"
    resources:
        **cluster("tiny_checkpoint", gpu=False),
    script:
        "../workflow/scripts/build_tiny_checkpoint.py"


rule checkpoint_3b:
    output:
        checkpoint=directory(paths.CHECKPOINT),
    wildcard_constraints:
        model=PRESET_NAMES["3b"],
    params:
        seed=config["model"]["3b"]["seed"],
        text_layers=config["model"]["3b"]["text_layers"],
        provenance=provenance("checkpoint", "build_3b_checkpoint.py"),
    log:
        paths.model_log("checkpoint_3b"),
    benchmark:
        paths.model_benchmark("checkpoint_3b")
    conda:
        "../envs/torch.yaml"
    resources:
        **cluster("checkpoint_3b", gpu=False),
    script:
        "../workflow/scripts/build_3b_checkpoint.py"
