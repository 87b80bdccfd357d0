"""The report's figures and tables (rules/report.smk): one function per rule."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.report import build, verdict


def main(sm):
    w, i, o, p = sm.wildcards, sm.input, sm.output, sm.params
    rule = sm.rule
    if rule == "report_heatmap":
        site, label = build.tower_facts(sm.config, w.graph, p.preset)
        build.heatmap(i.csv, i.profile, site, label, w.graph, w.variant, o[0])
    elif rule == "report_ranked":
        site, _ = build.tower_facts(sm.config, w.graph, p.preset)
        build.ranked(i.csv, i.profile, site, w.graph, w.variant, w.engine, p.top, o[0])
    elif rule == "report_pareto":
        build.pareto(i.eval, w.graph, w.variant, o[0])
    elif rule == "report_engines":
        build.engines(i.ort, i.inc, i.compare, w.graph, w.variant, o[0])
    elif rule == "report_fp16":
        build.fp16(i.record, w.graph, o[0])
    elif rule == "report_latency":
        build.latency(p.profiles, p.records, p.analysed, p.deploy, w.model, o[0])
    elif rule == "report_tables":
        build.parity_table([*i.records, *(f"{d}/parity.json" for d in i.deploy)], p.root, o.parity)
        build.profile_table(p.profiles, o.profiles)
        verdict.build(p.variant_records, dict(sorted(p.profiles.items())), p.deploy, p.description, w.model,
                      o.verdict)
    elif rule == "report_int4":
        build.int4(i.table, i.csv, i.profile, o.pareto, o.heatmap)
    else:
        raise ValueError(f"report.py: no figure for rule {rule}")


run(snakemake, main)  # noqa: F821
