"""The report's figures and tables (rules/report.smk): one entry per rule in ``FIGURES``."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.report import build, verdict


def _tables(w, i, o, p, config):
    build.parity_table([*i.records, *(f"{d}/parity.json" for d in i.deploy)], p.root, o.parity)
    build.profile_table(p.profiles, o.profiles)
    verdict.build(p.variant_records, dict(sorted(p.profiles.items())), p.deploy, p.description, w.model, o.verdict,
                  i.get("recommend"))


#: rule -> what it draws, from the job's wildcards, input, output, params and config.
FIGURES = {
    "report_heatmap": lambda w, i, o, p, config: build.heatmap(
        i.csv, i.profile, *build.tower_facts(config, w.graph, p.preset), w.graph, w.variant, o[0]),
    "report_ranked": lambda w, i, o, p, config: build.ranked(
        i.csv, i.profile, build.tower_facts(config, w.graph, p.preset)[0], w.graph, w.variant, w.engine, p.top, o[0]),
    "report_pareto": lambda w, i, o, p, config: build.pareto(i.eval, w.graph, w.variant, o[0]),
    "report_engines": lambda w, i, o, p, config: build.engines(i.ort, i.inc, i.compare, w.graph, w.variant, o[0]),
    "report_fp16": lambda w, i, o, p, config: build.fp16(i.record, w.graph, o[0]),
    "report_latency": lambda w, i, o, p, config: build.latency(p.profiles, p.records, p.analysed, p.deploy, w.model, o[0]),
    "report_tables": _tables,
    "report_int4": lambda w, i, o, p, config: build.int4(i.table, i.csv, i.profile, o.pareto, o.heatmap),
}


def main(sm):
    if sm.rule not in FIGURES:
        raise ValueError(f"report.py: no figure for rule {sm.rule}")
    FIGURES[sm.rule](sm.wildcards, sm.input, sm.output, sm.params, sm.config)


run(snakemake, main)  # noqa: F821
