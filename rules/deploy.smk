# Deploy folders: an onnxruntime-genai model folder per precision, made of gated graphs (the
# decoder tower, the dynamic vision graph, or their profiles) and proven end to end by
# onnxruntime-genai itself (vlsens.deploy).


rule deploy:
    input:
        unpack(deploy_inputs),
    output:
        directory(DEPLOY),
    log:
        paths.DEPLOY_LOG,
    benchmark:
        paths.DEPLOY_BENCHMARK
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("deploy", threads=config["threads"]),
    params:
        max_new_tokens=config["deploy"]["max_new_tokens"],
        tolerance=lambda wc: _deploy.vision_tolerance(config, wc.precision),
        target=lambda wc: (
            canonical(TOWERS[_deploy.DECODER_GRAPH].profile_settings())
            if wc.precision in ("int8-mixed", "int4-mixed")
            else None
        ),
        exact_tolerance=tolerance("fp32"),
        provenance=provenance("deploy", "deploy.py"),
    script:
        "../workflow/scripts/deploy.py"


rule deploy_int4:
    input:
        unpack(int4_folders),
    output:
        **paths.DEPLOY_INT4,
    log:
        paths.model_log("deploy_int4"),
    benchmark:
        f"{paths.MODEL}/benchmarks/deploy/deploy_int4.tsv"
    conda:
        "../envs/onnx.yaml"
    threads: 1
    resources:
        **cluster("deploy_int4", gpu=False),
    params:
        provenance=provenance("deploy", "deploy_int4.py"),
    script:
        "../workflow/scripts/deploy_int4.py"
