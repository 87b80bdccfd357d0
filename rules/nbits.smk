# Weight-only INT4/INT8 of the decoder's MatMuls (vlsens.quantize.nbits): engine "nbits" (one switch
# session, a CSV beside ort.csv), the int4-mixed profile (fewest bytes meeting the text profile's
# KL target) and onnxruntime-genai's builder at -p int4 (the anchors it is compared with). Each
# int4 decoder is a decoder variant folder gated against transformers run on the graph's own
# dequantized weights: with float activations at FP32's tolerance, as shipped at deploy.nbits.tolerance.

NBITS = paths.files(paths.SENSITIVITY, paths.NBITS_FILES)


rule sensitivity_nbits:
    input:
        parity=record("{variant}"),
        eval=CALIB["eval"],
    output:
        **NBITS,
        engine=directory(paths.NBITS_ENGINE),
    log:
        paths.log("sensitivity_nbits", "{variant}"),
    benchmark:
        paths.benchmark("sensitivity_nbits", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("sensitivity_nbits", threads=config["threads"]),
    params:
        model=analysed_model,
        settings=nbits_settings(),
        logits=lambda wc: tower(wc).logits,
        suffix_cuts=config["sensitivity"]["suffix_cuts"],
        provenance=provenance("sensitivity", "sensitivity_nbits.py"),
    script:
        "../workflow/scripts/sensitivity_nbits.py"


rule profile_nbits:
    input:
        unpack(heuristic_input),
        checkpoint=checkpoint_dir,
        engine=rules.sensitivity_nbits.output.engine,
        csv=rules.sensitivity_nbits.output.csv,
        eval=CALIB["eval"],
        parity=record("{variant}"),
        reference=rules.reference.output.reference,
    output:
        model=f"{paths.NBITS_PROFILE}/{paths.MAIN}",
        data=paths.data(f"{paths.NBITS_PROFILE}/{paths.MAIN}"),
        parity=f"{paths.NBITS_PROFILE}/{paths.RECORD}",
    log:
        paths.log("profile_nbits", "{variant}"),
    benchmark:
        paths.benchmark("profile_nbits", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("profile_nbits", threads=config["threads"]),
    params:
        settings=tower_settings("profile"),
        tolerance=canonical(config["deploy"]["nbits"]["tolerance"]),
        exact_tolerance=tolerance("fp32"),
        tied=config["deploy"]["nbits"]["embedding"] == "tied",
        provenance=provenance("sensitivity", "profile_nbits.py"),
    script:
        "../workflow/scripts/profile_nbits.py"


rule builder_int4:
    input:
        checkpoint=checkpoint_dir,
        parity=record("fp32"),
        reference=rules.reference.output.reference,
    output:
        model=f"{paths.BUILDER_INT4}/{paths.MAIN}",
        data=paths.data(f"{paths.BUILDER_INT4}/{paths.MAIN}"),
        parity=f"{paths.BUILDER_INT4}/{paths.RECORD}",
    log:
        paths.log("builder_int4", "{algo}"),
    benchmark:
        paths.benchmark("builder_int4", "{algo}")
    wildcard_constraints:
        algo="|".join(_deploy.BUILDER_ALGOS),
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("builder_int4", threads=config["threads"]),
    params:
        settings=builder_settings(),
        tolerance=canonical(config["deploy"]["nbits"]["tolerance"]),
        exact_tolerance=tolerance("fp32"),
        provenance=provenance("export", "builder_int4.py"),
    script:
        "../workflow/scripts/builder_int4.py"


# The int4 folders' embedding graph with an INT4 table (GatherBlockQuantized) and the dynamic
# vision graph with INT4 Linears (MatMulNBits), each gated against its own weights
# (vlsens.precision.weight_only; deploy.nbits.embedding / deploy.nbits.vision: int4).


rule embedding_nbits:
    input:
        checkpoint=checkpoint_dir,
        parity=paths.fill(record("fp32"), graph=_deploy.DECODER_GRAPH),
        reference=paths.fill(paths.REFERENCE, graph=_deploy.DECODER_GRAPH),
    output:
        model=f"{_deploy.EMBEDDING_INT4}/embedding.onnx",
        data=f"{_deploy.EMBEDDING_INT4}/embedding.onnx.data",
        parity=f"{_deploy.EMBEDDING_INT4}/{paths.RECORD}",
    log:
        paths.model_log("embedding_nbits"),
    benchmark:
        paths.fill(paths.benchmark("embedding_nbits"), graph=_deploy.DECODER_GRAPH)
    conda:
        "../envs/onnx.yaml"
    threads: 1
    resources:
        **cluster("embedding_nbits", gpu=False),
    params:
        block_size=config["deploy"]["nbits"]["block_size"],
        symmetric=config["deploy"]["nbits"]["symmetric"],
        exact_tolerance=tolerance("fp32"),
        provenance=provenance("sensitivity", "embedding_nbits.py"),
    script:
        "../workflow/scripts/embedding_nbits.py"


rule vision_nbits:
    input:
        checkpoint=checkpoint_dir,
        parity=paths.fill(record("fp32"), graph=_deploy.VISION_GRAPH),
        reference=paths.fill(paths.REFERENCE, graph=_deploy.VISION_GRAPH),
    output:
        model=paths.fill(paths.in_variant("int4"), graph=_deploy.VISION_GRAPH),
        data=paths.data(paths.fill(paths.in_variant("int4"), graph=_deploy.VISION_GRAPH)),
        parity=paths.fill(record("int4"), graph=_deploy.VISION_GRAPH),
    log:
        paths.fill(paths.log("vision_nbits"), graph=_deploy.VISION_GRAPH),
    benchmark:
        paths.fill(paths.benchmark("vision_nbits"), graph=_deploy.VISION_GRAPH)
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("vision_nbits", threads=config["threads"]),
    params:
        settings=nbits_settings(),
        tolerance=canonical(config["deploy"]["nbits"]["tolerance"]),
        exact_tolerance=tolerance("fp32"),
        provenance=provenance("sensitivity", "vision_nbits.py"),
    script:
        "../workflow/scripts/vision_nbits.py"
