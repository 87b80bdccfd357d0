"""What a job asks a cluster for (the config's ``cluster:`` section), read when the DAG is built
(``rules/common.smk``, ``cluster()``); no job imports it."""

from __future__ import annotations

from vlsens.model.presets import TINY_PRESETS


def cluster_value(table: dict, rule: str, job: str | None = None) -> int:
    """A ``cluster.mem_mb`` / ``cluster.runtime`` value: the rule's entry (or ``default``); an
    entry may map graphs (or a deploy precision, ``job``) to values, with its own ``default``."""
    v = table.get(rule, table["default"])
    if isinstance(v, dict):
        return int(v.get(job, v["default"]) if job is not None else v["default"])
    return int(v)


#: CPU threads a job computes with where ``threads: auto`` and the model is not a tiny preset
THREADS = 2


def compute_threads(setting: str | int, preset: str | None) -> int:
    """The threads every job computes with (config ``threads``): ``auto`` is 1 on a tiny preset
    (its jobs' compute is milliseconds; two side by side on two cores, each with one thread, ran
    the default DAG in 240 s where two threads each took 295 s, with the same results) and
    :data:`THREADS` otherwise; a number is itself."""
    if setting == "auto":
        return 1 if preset in TINY_PRESETS else THREADS
    return int(setting)


def job_cores(setting: str | int, compute: int, preset: str | None) -> int:
    """Cores a job reserves from Snakemake's ``--cores`` (config ``job_cores``) when it computes
    with ``compute`` threads: ``auto`` reserves one on a tiny preset, whose jobs spend their time
    starting the interpreter and importing torch and transformers (single-threaded; their compute
    is milliseconds), so two run side by side on two cores, and ``compute`` otherwise; a number
    caps it. The job computes with ``compute`` threads whatever it reserves."""
    compute = int(compute)
    if setting == "auto":
        return 1 if preset in TINY_PRESETS else compute
    return max(1, min(compute, int(setting)))
