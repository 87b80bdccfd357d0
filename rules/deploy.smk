# Deploy folders: an onnxruntime-genai model folder per precision, made of gated graphs (the
# decoder tower, the dynamic vision graph, or their profiles) and proven end to end by
# onnxruntime-genai itself (vlsens.deploy).


def deploy_inputs(wildcards):
    src = {k: paths.fill(v, model=wildcards.model) for k, v in DEPLOY_SOURCES[wildcards.precision].items()}
    src["checkpoint"] = checkpoint_dir(wildcards)
    src["images"] = INPUTS["parity_images"]
    if wildcards.precision != "fp32":
        src["fp32_folder"] = paths.fill(DEPLOY, model=wildcards.model, precision="fp32")
    return src


rule deploy:
    input:
        unpack(deploy_inputs),
    output:
        directory(DEPLOY),
    log:
        paths.fill(paths.LOGS, graph="deploy") + "/deploy-{precision}.log",
    benchmark:
        paths.fill(paths.BENCHMARKS, graph="deploy") + "/deploy-{precision}.tsv"
    params:
        max_new_tokens=config["deploy"]["max_new_tokens"],
        tolerance=lambda wc: tolerance(wc.precision) if wc.precision in ("fp32", "fp16") else None,
        target=lambda wc: canonical(config["text"]["profile"]) if wc.precision == "int8-mixed" else None,
        provenance=provenance("deploy", "deploy.py"),
    threads: config["threads"]
    resources:
        **cluster("deploy"),
    conda:
        "../envs/onnx.yaml"
    script:
        "../workflow/scripts/deploy.py"
