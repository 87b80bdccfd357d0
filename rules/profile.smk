# The mixed-precision profile of any analysed graph: searched with the engine, then built with ORT
# and measured (vlsens.precision.int8). The tower says which config section holds its target.


rule profile:
    input:
        unpack(profile_bases),
        meta=ENGINE["meta"],
        switch=ENGINE["switch"],
        float_model=ENGINE["float_model"],
        float_data=ENGINE["float_data"],
        cache=ENGINE["cache"],
        reference=ENGINE["reference"],
        ranking=rules.sensitivity_gather.output.csv,
        eval=CALIB["eval"],
    output:
        **paths.files(paths.PROFILE, paths.PROFILE_FILES),
    log:
        paths.log("profile", "{variant}"),
    benchmark:
        paths.benchmark("profile", "{variant}")
    conda:
        "../envs/onnx.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("profile", threads=config["threads"]),
    params:
        models=profile_models,
        settings=tower_settings("profile"),
        provenance=provenance("sensitivity", "profile.py"),
    script:
        "../workflow/scripts/profile.py"
