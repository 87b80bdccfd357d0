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


# NNCF's weight compression of the decoder's fp32 graph, one folder per recipe (the nncf-* and
# optimum peers; vlsens.deploy.genai.anchors), calibrated on the decoder's calibration set and
# gated like the builder's decoders.
rule nncf_decoder:
    input:
        **weights_inputs(),
        calib=paths.files(paths.CALIB, paths.CALIB_FILES)["calib"],
    output:
        **gated(f"{paths.NNCF_DECODER}/{paths.MAIN}"),
    wildcard_constraints:
        recipe="|".join(_deploy.NNCF_RECIPES),
    params:
        **nbits_tolerances(),
        provenance=provenance("nncf", "nncf_decoder.py"),
    log:
        paths.log("nncf_decoder", "{recipe}"),
    benchmark:
        paths.benchmark("nncf_decoder", "{recipe}")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("nncf_decoder", threads=config["threads"]),
    script:
        "../workflow/scripts/nncf_decoder.py"


rule deploy:
    input:
        unpack(deploy_inputs),
    output:
        directory(DEPLOY),
    wildcard_constraints:
        precision="|".join(re.escape(f) for f in _deploy.FOLDERS),
    params:
        max_new_tokens=config["deploy"]["max_new_tokens"],
        tolerance=lambda wc: _deploy.vision_tolerance(config, wc.precision),
        target=lambda wc: (
            canonical(TOWERS[_deploy.DECODER_GRAPH].profile_settings())
            if wc.precision in ("int8-mixed", "int4-mixed")
            else None
        ),
        exact_tolerance=tolerance("fp32"),
        provider=config["deploy"]["provider"],
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


rule vision_features:
    input:
        fp32_folder=paths.fill(DEPLOY, precision="fp32"),
        checkpoint=checkpoint_dir,
        images=INPUTS["parity_images"],
    output:
        paths.DEPLOY_VISION_FEATURES,
    params:
        provenance=provenance("deploy", "vision_features.py"),
    log:
        paths.model_log("vision_features"),
    benchmark:
        paths.model_benchmark("vision_features")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("vision_features", threads=config["threads"]),
    script:
        "../workflow/scripts/vision_features.py"


# The fp32 folder's logits on the evaluation cases, teacher-forced on its own tokens: every other
# folder's evaluation reference, computed once a run (not once a folder).
rule eval_logits:
    input:
        fp32_folder=paths.fill(DEPLOY, precision="fp32"),
        images=INPUTS["parity_images"],
    output:
        paths.DEPLOY_EVAL_LOGITS,
    params:
        provenance=provenance("deploy", "eval_logits.py"),
    log:
        paths.model_log("eval_logits"),
    benchmark:
        paths.model_benchmark("eval_logits")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("eval_logits", threads=config["threads"]),
    script:
        "../workflow/scripts/eval_logits.py"


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


# The folders' end-to-end measure (vlsens.deploy.measure): stratified evaluation cases, the fp32
# folder's greedy tokens and log-probabilities on them, each folder teacher-forced on those tokens
# through onnxruntime-genai, and the folders side by side with paired intervals.
rule measure_cases:
    input:
        images=INPUTS["calibration_images"],
        questions=TASK_QUESTIONS or [],
    output:
        directory(paths.MEASURE_CASES),
    params:
        per_modality=config["deploy"]["measure"]["per_modality"],
        sizes=[list(hw) for hw in _deploy.measure_sizes(config)] if config["deploy"]["enabled"] else [],
        seed=config["deploy"]["measure"]["seed"],
        provenance=provenance("cases", "measure_cases.py"),
    log:
        paths.model_log("measure_cases"),
    benchmark:
        paths.model_benchmark("measure_cases")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("measure_cases", gpu=False),
    script:
        "../workflow/scripts/measure_cases.py"


rule measure_reference:
    input:
        folder=paths.fill(DEPLOY, precision="fp32"),
        cases=paths.MEASURE_CASES,
    output:
        paths.MEASURE_REFERENCE,
    params:
        max_new_tokens=config["deploy"]["measure"]["max_new_tokens"],
        provenance=provenance("deploy", "measure_reference.py"),
    log:
        paths.model_log("measure_reference"),
    benchmark:
        paths.model_benchmark("measure_reference")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("measure_reference", threads=config["threads"]),
    script:
        "../workflow/scripts/measure_reference.py"


rule measure:
    input:
        folder=DEPLOY,
        reference=paths.MEASURE_REFERENCE,
        cases=paths.MEASURE_CASES,
    output:
        paths.MEASURE_FOLDER,
    wildcard_constraints:
        precision="|".join(re.escape(f) for f in _deploy.FOLDERS),  # a plan's folder is measured where it is built
    params:
        provenance=provenance("deploy", "measure.py"),
    log:
        f"{paths.MODEL}/logs/measure/measure-{{precision}}.log",
    benchmark:
        f"{paths.MODEL}/benchmarks/measure/measure-{{precision}}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("measure", threads=config["threads"]),
    script:
        "../workflow/scripts/measure.py"


rule measure_compare:
    input:
        unpack(measured_folders),
    output:
        **paths.MEASURE_COMPARE,
    params:
        provenance=provenance("compare", "measure_compare.py"),
    log:
        paths.model_log("measure_compare"),
    benchmark:
        paths.model_benchmark("measure_compare")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("measure_compare", gpu=False),
    script:
        "../workflow/scripts/measure_compare.py"


# Every folder's accuracy on the task (each deploy job answers the task's questions into the
# folder's answers.json), paired with fp32's (vlsens.deploy.accuracy).
rule accuracy:
    input:
        unpack(answered_folders),
    output:
        **paths.MEASURE_ACCURACY,
    params:
        provenance=provenance("compare", "accuracy.py"),
    log:
        paths.model_log("accuracy"),
    benchmark:
        paths.model_benchmark("accuracy")
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("accuracy", gpu=False),
    script:
        "../workflow/scripts/accuracy.py"
