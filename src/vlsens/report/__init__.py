"""The workflow's report: figures (:mod:`vlsens.report.figures`) and HTML tables
(:mod:`vlsens.report.tables`) made from the records the other stages write, marked for
``snakemake --report`` by ``rules/report.smk``.

Every function here reads plain data (rows of a sensitivity CSV, the JSON/YAML records) and
writes one static file, so each can be rendered from a small fixed input in a unit test.
"""
