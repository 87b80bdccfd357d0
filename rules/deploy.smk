# Deploy folders: an onnxruntime-genai model folder per precision, made of gated graphs (the
# decoder tower, the dynamic vision graph, or their profiles) and proven end to end by
# onnxruntime-genai itself (vlsens.deploy).


# The peers the int4 folders are compared with: onnxruntime-genai's builder at -p int4, one decoder
# per algo_config (vlsens.deploy.genai.anchors), each a decoder variant folder gated twice
# (nbits_tolerances) like the int4-mixed profile.
rule builder_int4:
    input:
        **weights_inputs(),
    output:
        **gated(f"{paths.BUILDER_INT4}/{paths.MAIN}"),
    wildcard_constraints:
        algo="|".join(_deploy.BUILDER_ALGOS),
    params:
        **nbits_tolerances(),
        settings=builder_settings(),
        provenance=provenance("export", "builder_int4.py"),
    log:
        paths.log("builder_int4", "{algo}"),
    benchmark:
        paths.benchmark("builder_int4", "{algo}")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("builder_int4", threads=config["threads"]),
    script:
        "../workflow/scripts/builder_int4.py"


rule deploy:
    input:
        unpack(deploy_inputs),
    output:
        directory(DEPLOY),
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
    log:
        paths.DEPLOY_LOG,
    benchmark:
        paths.DEPLOY_BENCHMARK
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("deploy", threads=config["threads"]),
    script:
        "../workflow/scripts/deploy.py"


rule deploy_int4:
    input:
        unpack(int4_folders),
    output:
        **paths.DEPLOY_INT4,
    params:
        provenance=provenance("deploy", "deploy_int4.py"),
    log:
        paths.model_log("deploy_int4"),
    benchmark:
        f"{paths.MODEL}/benchmarks/deploy/deploy_int4.tsv"
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("deploy_int4", gpu=False),
    script:
        "../workflow/scripts/deploy_int4.py"
