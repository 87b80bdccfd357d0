# Which precision each op gets, built and measured (vlsens.precision): the INT8 mixed-precision
# profile of any analysed graph (searched with the ort engine, built with ORT; the tower says which
# config section holds its target), the int4-mixed decoder (fewest bytes meeting the text
# profile's KL target, from engine nbits) and the int4 folders' INT4 embedding and vision graphs.
# Each INT4 graph is gated twice (nbits_tolerances): against transformers run on its own
# dequantized weights with float activations, and as shipped.


rule profile:
    input:
        unpack(profile_bases),
        **engine_files("meta", "switch", "float_model", "float_data", "cache", "reference"),
        ranking=rules.sensitivity_gather.output.csv,
        eval=CALIB["eval"],
    output:
        **paths.files(paths.PROFILE, paths.PROFILE_FILES),
    params:
        models=profile_models,
        settings=tower_settings("profile"),
        provenance=provenance("sensitivity", "profile.py"),
    log:
        paths.log("profile", "{variant}"),
    benchmark:
        paths.benchmark("profile", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("profile", threads=config["threads"]),
    script:
        "../workflow/scripts/profile.py"


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
        **gated(f"{paths.NBITS_PROFILE}/{paths.MAIN}"),
    params:
        **nbits_tolerances(),
        settings=tower_settings("profile"),
        tied=config["deploy"]["nbits"]["embedding"] == "tied",
        provenance=provenance("sensitivity", "profile_nbits.py"),
    log:
        paths.log("profile_nbits", "{variant}"),
    benchmark:
        paths.benchmark("profile_nbits", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("profile_nbits", threads=config["threads"]),
    script:
        "../workflow/scripts/profile_nbits.py"


# The weight-only embedding tables (GatherBlockQuantized: INT4 at deploy.nbits' block size, the
# int4 folders' and Olive's; INT8 per row, optimum-intel's) and the dynamic vision graph with
# weight-only Linears (int4: deploy.nbits; int4-rtn128: Olive's; int8-wo: optimum-intel's), each
# gated against its own weights (vlsens.precision.weight_only).


rule embedding_nbits:
    input:
        **weights_inputs(_deploy.DECODER_GRAPH),
    output:
        **gated(f"{_deploy.EMBEDDING_NBITS}/embedding.onnx"),
    wildcard_constraints:
        bits="4|8",
    params:
        block_size=lambda wc: PER_CHANNEL if wc.bits == "8" else config["deploy"]["nbits"]["block_size"],
        symmetric=lambda wc: False if wc.bits == "8" else config["deploy"]["nbits"]["symmetric"],
        exact_tolerance=tolerance("fp32"),
        provenance=provenance("sensitivity", "embedding_nbits.py"),
    log:
        paths.fill(paths.log("embedding_nbits", "int{bits}"), graph=_deploy.DECODER_GRAPH),
    benchmark:
        paths.fill(paths.benchmark("embedding_nbits", "int{bits}"), graph=_deploy.DECODER_GRAPH)
    conda:
        "../envs/onnx.yaml"
    resources:
        **cluster("embedding_nbits", gpu=False),
    script:
        "../workflow/scripts/embedding_nbits.py"


rule vision_nbits:
    input:
        **weights_inputs(_deploy.VISION_GRAPH),
    output:
        **gated(paths.fill(paths.in_variant("{wo}"), graph=_deploy.VISION_GRAPH)),
    wildcard_constraints:
        wo="|".join(re.escape(f) for f in _deploy.VISION_WO),
    params:
        **nbits_tolerances(),
        settings=nbits_settings(),
        provenance=provenance("sensitivity", "vision_nbits.py"),
    log:
        paths.fill(paths.log("vision_nbits", "{wo}"), graph=_deploy.VISION_GRAPH),
    benchmark:
        paths.fill(paths.benchmark("vision_nbits", "{wo}"), graph=_deploy.VISION_GRAPH)
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("vision_nbits", threads=config["threads"]),
    script:
        "../workflow/scripts/vision_nbits.py"
