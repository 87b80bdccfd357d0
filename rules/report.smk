# The report: figures and tables drawn from the records of the run (vlsens.report), marked for
# `snakemake --report` (make report). One rule per figure family; a figure is redrawn only when
# the records it reads change (or matplotlib / its code does).


REPORT_CODE = provenance("report", "report.py")
# Report categories (vlsens.report.CATEGORIES), numbered over the ones this run draws
CATEGORY = numbered_categories(get_final_output())
TABLES = CATEGORY["Parity and profiles"]
INT4 = CATEGORY["INT4 decoders"]


rule report_heatmap:
    input:
        unpack(preset_input),
        csv=f"{paths.SENSITIVITY}/ort.csv",
        profile=f"{paths.PROFILE}/{paths.PROFILE_FILES['profile']}",
    output:
        report_figure("heatmap", "heatmap.rst", CATEGORY["Sensitivity heatmaps"], engine="ort"),
    params:
        preset=preset_json,
        provenance=REPORT_CODE,
    log:
        paths.log("report_heatmap", "{variant}"),
    benchmark:
        paths.benchmark("report_heatmap", "{variant}")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_heatmap", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule report_ranked:
    input:
        unpack(preset_input),
        csv=f"{paths.SENSITIVITY}/{{engine}}.csv",
        profile=f"{paths.PROFILE}/{paths.PROFILE_FILES['profile']}",
    output:
        report_figure("ranked", "ranked.rst", CATEGORY["Most sensitive ops"], engine="{engine}"),
    params:
        preset=preset_json,
        top=config["report"]["top_ops"],
        provenance=REPORT_CODE,
    log:
        paths.log("report_ranked", "{variant}", "{engine}"),
    benchmark:
        paths.benchmark("report_ranked", "{variant}", "{engine}")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_ranked", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule report_pareto:
    input:
        eval=f"{paths.PROFILE}/{paths.PROFILE_FILES['eval']}",
    output:
        report_figure("pareto", "pareto.rst", CATEGORY["Profiles: INT8 coverage vs accuracy"]),
    params:
        provenance=REPORT_CODE,
    log:
        paths.log("report_pareto", "{variant}"),
    benchmark:
        paths.benchmark("report_pareto", "{variant}")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_pareto", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule report_engines:
    input:
        ort=f"{paths.SENSITIVITY}/ort.csv",
        inc=f"{paths.SENSITIVITY}/inc.csv",
        compare=f"{paths.SENSITIVITY}/compare.json",
    output:
        report_figure("engines", "engines.rst", CATEGORY["Engine agreement"]),
    params:
        provenance=REPORT_CODE,
    log:
        paths.log("report_engines", "{variant}"),
    benchmark:
        paths.benchmark("report_engines", "{variant}")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_engines", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule report_fp16:
    input:
        record=paths.fill(record("fp16")),
    output:
        report_item(paths.REPORT_FP16, "fp16.rst", CATEGORY["FP16 fallback"], "{graph}", graph="{graph}"),
    params:
        provenance=REPORT_CODE,
    log:
        paths.log("report_fp16"),
    benchmark:
        paths.benchmark("report_fp16")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_fp16", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule report_latency:
    input:
        report_latency_inputs,
    output:
        report_file("latency", "latency.rst", CATEGORY["Latency and size"], "all graphs", figure="latency and size"),
    params:
        profiles=report_profiles,
        records=report_base_records,
        deploy=report_deploy,
        analysed=lambda wc: {g: t.analysed for g, t in TOWERS.items()},
        provenance=REPORT_CODE,
    log:
        paths.model_log("report_latency"),
    benchmark:
        paths.model_benchmark("report_latency")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_latency", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule report_tables:
    input:
        unpack(lambda wc: {"recommend": recommend_target()[0]} if recommend_target() else {}),
        profiles=lambda wc: list(report_profiles(wc).values()),
        records=report_records,
        deploy=lambda wc: list(report_deploy(wc).values()),
    output:
        parity=report_file("parity", "parity.rst", TABLES, "tables", table="parity of every artifact"),
        profiles=report_file("profiles", "profiles.rst", TABLES, "tables", table="mixed-precision profiles"),
        # the report's landing page (the Snakefile's report: directive, when it exists)
        verdict=f"{paths.REPORT}/{paths.REPORT_FILES['verdict']}",
    params:
        profiles=report_profiles,
        deploy=report_deploy,
        variant_records=report_records,
        description=str(VLSENS_ROOT / "report" / "workflow.rst"),
        root=lambda wc: paths.fill(paths.MODEL, model=wc.model),
        provenance=REPORT_CODE,
    log:
        paths.model_log("report_tables"),
    benchmark:
        paths.model_benchmark("report_tables")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_tables", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule report_int4:
    input:
        table=paths.DEPLOY_INT4["json"],
        csv=paths.fill(f"{paths.SENSITIVITY}/{paths.NBITS_FILES['csv']}", graph=_deploy.DECODER_GRAPH, variant="fp32"),
        profile=paths.fill(f"{paths.NBITS_PROFILE}/{paths.RECORD}", graph=_deploy.DECODER_GRAPH, variant="fp32"),
    output:
        pareto=report_file("int4_pareto", "int4.rst", INT4, "deploy folders", figure="size vs KL"),
        heatmap=report_file(
            "nbits_heatmap", "nbits.rst", INT4, "deploy folders", figure="weight-only sensitivity and bits"
        ),
    params:
        provenance=REPORT_CODE,
    log:
        paths.model_log("report_int4"),
    benchmark:
        paths.model_benchmark("report_int4")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("report_int4", gpu=False),
    script:
        "../workflow/scripts/report.py"


rule recommend:
    input:
        unpack(recommend_inputs),
    output:
        json=paths.RECOMMEND["json"],
        md=paths.RECOMMEND["md"],
    params:
        sources=recommend_params,
        kl_budget=float(config["text"]["profile"]["target"]),
        provenance=provenance("recommend", "recommend.py"),
    log:
        paths.model_log("recommend"),
    benchmark:
        paths.model_benchmark("recommend")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("recommend", gpu=False),
    script:
        "../workflow/scripts/recommend.py"
