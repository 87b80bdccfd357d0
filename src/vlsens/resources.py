"""What a job asks a cluster for (the config's ``cluster:`` section), read when the DAG is built
(``rules/common.smk``, ``cluster()``); no job imports it."""

from __future__ import annotations


def cluster_value(table: dict, rule: str, job: str | None = None) -> int:
    """A ``cluster.mem_mb`` / ``cluster.runtime`` value: the rule's entry (or ``default``); an
    entry may map graphs (or a deploy precision, ``job``) to values, with its own ``default``."""
    v = table.get(rule, table["default"])
    if isinstance(v, dict):
        return int(v.get(job, v["default"]) if job is not None else v["default"])
    return int(v)
