# The whole-VLM plan (vlsens.budget): every weight of a folder given a format, chosen on the
# folders' measure. The decoder's evaluation set is the measure's cases run through the fp32
# folder's own graphs (an ONNX Runtime chain proven equal to onnxruntime-genai's teacher forcing);
# engine nbits measures every MatMul there; each vision and embedding format is measured end to end
# in the fp32 folder (the part chain, proven equal to onnxruntime-genai's measure); the search
# builds the front from these, and every picked plan is built into a deploy folder
# (deploy/plan-p<i>/) and measured like every folder.


# The measure's cases as the decoder's evaluation set (through the fp32 folder's own graphs), and
# engine nbits on it: every decoder MatMul's INT4 / INT8 error where the folders are judged.
rule budget_nbits:
    input:
        unpack(plan_calibration),
        checkpoint=checkpoint_dir,
        folder=paths.fill(DEPLOY, precision="fp32"),
        reference=paths.MEASURE_REFERENCE,
        cases=paths.MEASURE_CASES,
        model=BUDGET_DECODER["model"],
        parity=BUDGET_DECODER["parity"],
    output:
        **paths.BUDGET_NBITS,
        **gptq_store(),
        feeds=paths.BUDGET_FEEDS,
        engine=directory(paths.BUDGET_ENGINE),
    params:
        **decoder_measured(),
        settings=nbits_settings(),
        algorithms=config["plan"]["algorithms"],
        suffix_cuts=config["sensitivity"]["suffix_cuts"],
        provenance=provenance("deploy", "budget_nbits.py"),
    log:
        paths.model_log("budget_nbits"),
    benchmark:
        paths.model_benchmark("budget_nbits")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("budget_nbits", threads=config["threads"]),
    script:
        "../workflow/scripts/budget_nbits.py"


# Each vision Linear alone at INT4 in the fp32 folder, measured end to end: the mixed vision
# graph's curve (plan.vision: mixed).
rule budget_vision:
    input:
        **{"vision_int8-wo": _deploy.vision_source("int8-wo")},
        checkpoint=checkpoint_dir,
        reference=paths.MEASURE_REFERENCE,
        cases=paths.MEASURE_CASES,
        fp32_folder=paths.fill(DEPLOY, precision="fp32"),
        decoder_model=BUDGET_DECODER["model"],
        vision_fp32=_deploy.vision_source("fp32"),
        vision_int4=_deploy.vision_source("int4"),
    output:
        **paths.BUDGET_VISION,
    params:
        settings=nbits_settings(),
        measured=config["plan"]["vision_measured"],
        provenance=provenance("deploy", "budget_vision.py"),
    log:
        paths.model_log("budget_vision"),
    benchmark:
        paths.model_benchmark("budget_vision")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("budget_vision", threads=config["threads"]),
    script:
        "../workflow/scripts/budget_vision.py"


# Each vision and table format measured end to end in the fp32 folder.
rule budget_components:
    input:
        unpack(budget_formats),
        checkpoint=checkpoint_dir,
        reference=paths.MEASURE_REFERENCE,
        cases=paths.MEASURE_CASES,
        fp32_folder=paths.fill(DEPLOY, precision="fp32"),
    output:
        components=paths.BUDGET_COMPONENTS,
    params:
        provenance=provenance("deploy", "budget_components.py"),
    log:
        paths.model_log("budget_components"),
    benchmark:
        paths.model_benchmark("budget_components")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("budget_components", threads=config["threads"]),
    script:
        "../workflow/scripts/budget_components.py"


# The search. A checkpoint: which plans the front holds is known once it is searched (the spread
# along the front, and per anchor the plan within its bytes where no spread plan is that plan).
checkpoint budget_front:
    input:
        unpack(anchor_folders),
        unpack(mixed_vision_ops),
        **paths.BUDGET_NBITS,
        components=paths.BUDGET_COMPONENTS,
        engine=paths.BUDGET_ENGINE,
        eval=paths.BUDGET_FEEDS,
        fp32_folder=paths.fill(DEPLOY, precision="fp32"),
    output:
        front=paths.BUDGET_FRONT,
        plans=directory(paths.BUDGET_PLANS),
    params:
        search={k: config["plan"][k] for k in ("points", "max_evals", "budgets", "decode_context")},
        provenance=provenance("deploy", "budget_front.py"),
    log:
        paths.model_log("budget_front"),
    benchmark:
        paths.model_benchmark("budget_front")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("budget_front", threads=config["threads"]),
    script:
        "../workflow/scripts/budget_front.py"


rule plan_folder:
    input:
        unpack(budget_formats),
        unpack(mixed_vision_reference),
        unpack(plan_data),
        unpack(task_questions),
        plan=f"{paths.BUDGET_PLANS}/{{plan}}.yaml",
        engine=paths.BUDGET_ENGINE,
        checkpoint=checkpoint_dir,
        decoder_reference=paths.fill(paths.REFERENCE, graph=_deploy.DECODER_GRAPH),
        images=INPUTS["parity_images"],
        fp32_folder=paths.fill(DEPLOY, precision="fp32"),
        vision_features=paths.DEPLOY_VISION_FEATURES,
        fp32_logits=paths.DEPLOY_EVAL_LOGITS,
        reference=paths.MEASURE_REFERENCE,
        cases=paths.MEASURE_CASES,
    output:
        folder=directory(paths.fill(DEPLOY, precision="plan-{plan}")),
        measure=paths.fill(paths.MEASURE_FOLDER, precision="plan-{plan}"),
    wildcard_constraints:
        plan=PLAN_NAME,
    params:
        **nbits_tolerances(),
        max_new_tokens=config["deploy"]["max_new_tokens"],
        provider=config["deploy"]["provider"],
        provenance=provenance("deploy", "plan_folder.py"),
    log:
        f"{paths.MODEL}/logs/deploy/deploy-plan-{{plan}}.log",
    benchmark:
        f"{paths.MODEL}/benchmarks/deploy/deploy-plan-{{plan}}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("plan_folder", threads=config["threads"]),
    script:
        "../workflow/scripts/plan_folder.py"


# Every plan folder's decode step beside the uniform decoders', timed in one job (the estimate's check).
rule budget_latency:
    input:
        unpack(plan_folders),
        engine=paths.BUDGET_ENGINE,
        front=paths.BUDGET_FRONT,
    output:
        latency=paths.BUDGET_LATENCY,
    params:
        context=config["plan"]["decode_context"],
        provenance=provenance("deploy", "budget_latency.py"),
    log:
        paths.model_log("budget_latency"),
    benchmark:
        paths.model_benchmark("budget_latency")
    conda:
        "../envs/torch.yaml"
    threads: cores(config["threads"])
    resources:
        **cluster("budget_latency", threads=config["threads"]),
    script:
        "../workflow/scripts/budget_latency.py"


rule budget_measured:
    input:
        unpack(budget_measures),
        front=paths.BUDGET_FRONT,
        latency=paths.BUDGET_LATENCY,
    output:
        json=paths.BUDGET_MEASURED["json"],
        md=paths.BUDGET_MEASURED["md"],
        png=report_item(
            paths.BUDGET_MEASURED["png"], "budget.rst", CATEGORY["Whole-VLM plan"], "deploy folders", figure="front"
        ),
    params:
        kl_budget=float(config["text"]["profile"]["target"]),
        provenance=provenance("report", "budget_measured.py"),
    log:
        paths.model_log("budget_measured"),
    benchmark:
        paths.model_benchmark("budget_measured")
    conda:
        "../envs/report.yaml"
    resources:
        **cluster("budget_measured", gpu=False),
    script:
        "../workflow/scripts/budget_measured.py"
