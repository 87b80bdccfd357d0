"""Early cutoff: after an upgrade, re-run the jobs whose libraries or code changed, and past a job
whose new output equals its previous one (:func:`vlsens.core.outputs.cutoff`), nothing.

Snakemake decides what runs when it builds the DAG: a job that runs makes every job downstream of
it run too, whatever it writes. So an upgrade runs in phases, each a plain Snakemake run whose
targets are the jobs that have to run now, and this module says which (it reads Snakemake's dry
runs and the outputs' times and records; it runs nothing):

* **own**: a job Snakemake would run for a reason of its own: its params (library versions and
  code hash, :func:`vlsens.core.versions.provenance`) or code changed, an output is missing, and
  so on. Jobs downstream of such a job wait for a later phase (Snakemake does not say their own
  reasons while a job upstream of them has to run).
* **stale**: a job with an input newer than its outputs whose content changed since they were
  made, or with an input written after them by anything else.
* **touch**: a job whose newer inputs all hold content the job read already: rewritten with
  content equivalent to what they held (:func:`vlsens.core.outputs.cutoff`) since before the
  job's outputs were made (their records' ``content_since``), or dated by an earlier round. Its
  outputs (and benchmark file) are dated now (:func:`touch`, what ``snakemake --touch`` does), so
  the next dry run shows whether the job has a reason of its own to run (Snakemake compares a
  job's params only when none of its inputs is newer than its outputs).

Each round touches what it can, then runs the own and stale jobs that have no such job upstream
(:meth:`State.frontier`); it ends when a dry run has nothing left, so a plain ``snakemake``
afterwards has nothing to do.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: Snakemake's reasons, by the start of their text (snakemake.jobs.Reason.__str__).
DERIVED = "Input files updated by another job"
UPDATED = "Updated input files"
PARAMS = "Params have changed since last execution"
HEADER = re.compile(r"^(?:local)?(rule|checkpoint) (\S+):$")
FIELD = re.compile(r"^\s+(input|output|jobid|benchmark|reason|wildcards): (.*)$")


@dataclass
class Job:
    """One job of a dry run."""

    rule: str
    jobid: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    benchmark: str | None = None
    reason: str = ""
    wildcards: str = ""
    checkpoint: bool = False  # a Snakemake checkpoint: the jobs downstream of it are known once it ran

    @property
    def key(self) -> str:
        """What names the job across Snakemake runs (job ids do not): its first output."""
        return min(self.outputs) if self.outputs else f"rule {self.rule}"

    @property
    def reasons(self) -> list[str]:
        return [r for r in self.reason.split("; ") if r]

    @property
    def derived(self) -> bool:
        """Does the job run only because a job upstream of it runs?"""
        return bool(self.reasons) and all(r.startswith(DERIVED) for r in self.reasons)

    @property
    def label(self) -> str:
        parts = [v.split("=", 1)[1] for v in self.wildcards.split(", ") if "=" in v and not v.startswith("model=")]
        return " ".join([self.rule, *parts])


def _files(text: str) -> list[str]:
    return [f.strip() for f in text.split(", ") if f.strip()]


def parse_dry_run(text: str) -> list[Job]:
    """The jobs of ``snakemake -n`` output (without the ``all`` rule and other jobs with no
    output)."""
    jobs, job = [], None
    for line in text.splitlines():
        m = HEADER.match(line.strip()) if not line.startswith(" ") else None
        if m:
            job = Job(m.group(2), checkpoint=m.group(1) == "checkpoint")
            jobs.append(job)
            continue
        m = FIELD.match(line)
        if m and job is not None:
            name, value = m.groups()
            if name in ("input", "output"):
                setattr(job, f"{name}s", _files(value))
            else:
                setattr(job, name, value.strip())
        elif not line.strip():
            job = None
    return [j for j in jobs if j.outputs]


def parse_summary(text: str) -> list[Job]:
    """The jobs of ``snakemake --detailed-summary`` output (one row per output file: the rows of
    a job share its rule, log files and inputs). Unlike a ``--forceall`` dry run, it holds the jobs
    downstream of a checkpoint that has run."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("output_file\t")), None)
    if start is None:
        return []
    head = lines[start].split("\t")
    col = {name: head.index(name) for name in ("output_file", "rule", "log-file(s)", "input-file(s)")}
    jobs: dict[tuple, Job] = {}
    for line in lines[start + 1:]:
        row = line.split("\t")
        if len(row) != len(head):
            continue
        logs, inputs = row[col["log-file(s)"]], row[col["input-file(s)"]]
        key = (row[col["rule"]], logs, inputs)
        job = jobs.setdefault(key, Job(row[col["rule"]], inputs=[f for f in inputs.split(",") if f and f != "-"]))
        job.outputs.append(row[col["output_file"]])
    return list(jobs.values())


def library_changes(reason: str) -> dict[str, tuple[str, str]]:
    """``{library: (before, now)}`` from a job's params-changed reason (its ``provenance`` param's
    versions before and now); ``{"vlsens code": ...}`` where the code hash changed."""
    m = re.search(r"before: (\{.*\}) now: (\{.*\})", reason)
    if not m:
        return {}
    try:
        before, now = ast.literal_eval(m.group(1)), ast.literal_eval(m.group(2))
    except (ValueError, SyntaxError):
        return {}
    from vlsens.core.outputs import changed_versions

    b, n = before.get("provenance", before), now.get("provenance", now)
    out = {k: tuple(v) for k, v in changed_versions(b, n).items()}
    if b.get("code") != n.get("code"):
        out["vlsens code"] = (str(b.get("code")), str(n.get("code")))
    return out


class Graph:
    """The whole DAG (:func:`parse_summary`): who writes and who reads each file."""

    def __init__(self, jobs: Iterable[Job]):
        self.jobs = {j.key: j for j in jobs}
        self.producer = {o: j.key for j in self.jobs.values() for o in j.outputs}
        self.order = self._toposort()

    def learn(self, jobs: Iterable[Job]) -> None:
        """What a dry run says of jobs the graph holds: benchmark file, wildcards, reasons."""
        for j in jobs:
            if j.key in self.jobs:
                self.jobs[j.key] = j

    def _toposort(self) -> list[str]:
        order, seen = [], set()

        def visit(key: str) -> None:
            stack = [(key, False)]
            while stack:
                k, done = stack.pop()
                if done:
                    order.append(k)
                    continue
                if k in seen:
                    continue
                seen.add(k)
                stack.append((k, True))
                stack.extend((p, False) for p in self.parents(k) if p not in seen)

        for k in sorted(self.jobs):
            visit(k)
        return order

    def output_of(self, path: str) -> str | None:
        """The output that holds ``path``: itself, or the folder output it lies in."""
        if path in self.producer:
            return path
        return next((str(p) for p in Path(path).parents if str(p) in self.producer), None)

    def parents(self, key: str) -> list[str]:
        outs = (self.output_of(f) for f in self.jobs[key].inputs)
        return sorted({self.producer[o] for o in outs if o is not None} - {key})

    def ancestors(self, key: str) -> set[str]:
        out, todo = set(), self.parents(key)
        while todo:
            k = todo.pop()
            if k not in out:
                out.add(k)
                todo.extend(self.parents(k))
        return out

    def descendants(self, keys: Iterable[str]) -> set[str]:
        keys = set(keys)
        out = set()
        for k in self.order:
            if k not in keys and any(p in keys or p in out for p in self.parents(k)):
                out.add(k)
        return out


def _mtime(path: str) -> float | None:
    from vlsens.core.outputs import output_mtime

    try:
        return output_mtime(path)
    except OSError:
        return None


def _record(path: str) -> dict:
    from vlsens.core.outputs import record_path

    try:
        rec = json.loads(record_path(path).read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def content_since(path: str) -> float | None:
    """Since when the output ``path`` has held its content (its record's ``content_since``: kept
    when a job rewrote it with equivalent content, or dated it); None without a record."""
    since = _record(path).get("content_since")
    return float(since) if isinstance(since, int | float) else None


def cut_record(path: str) -> dict | None:
    """The cutoff verdict in ``path``'s output record (None without one)."""
    cut = _record(path).get("cutoff")
    return cut if isinstance(cut, dict) else None


@dataclass
class State:
    """Where every job stands (:func:`classify`)."""

    own: set[str] = field(default_factory=set)  # jobs Snakemake runs for a reason of their own
    pending: set[str] = field(default_factory=set)  # downstream of those: judged in a later phase
    stale: dict[str, list[str]] = field(default_factory=dict)  # job -> inputs changed since its outputs
    touch: dict[str, list[str]] = field(default_factory=dict)  # job -> cut inputs (equivalent content)

    def frontier(self, graph: Graph) -> list[str]:
        """The jobs to run now: own and stale ones without such a job upstream."""
        todo = self.own | set(self.stale)
        return sorted(k for k in todo if not (graph.ancestors(k) & todo))


def classify(graph: Graph, run: Iterable[Job]) -> State:
    """Each job of ``graph`` against the dry run ``run`` and the files' times and records (module
    doc). A job Snakemake would run only for inputs newer than its outputs is judged by those
    inputs here (Snakemake checks a job's params only when no input is newer)."""
    state = State()
    for j in run:
        if j.key in graph.jobs and not j.derived and any(not r.startswith(UPDATED) for r in j.reasons):
            state.own.add(j.key)
    state.pending = graph.descendants(state.own) - state.own
    for key in graph.order:
        if key in state.own or key in state.pending:
            continue
        job = graph.jobs[key]
        times = [t for t in map(_mtime, job.outputs) if t is not None]
        if len(times) < len(job.outputs):
            continue  # a missing output is Snakemake's own reason (the dry run has it)
        made = min(times + ([t] if job.benchmark and (t := _mtime(job.benchmark)) is not None else []))
        cut, changed = [], []
        for f in job.inputs:
            t = _mtime(f)
            out = graph.output_of(f)  # a file inside a folder output: the folder's record speaks for it
            upstream = graph.producer.get(out) if out else None
            if upstream in state.stale:
                changed.append(f)
            elif upstream in state.touch:
                cut.append(f)
            elif t is not None and t > made:
                since = content_since(out or f)
                (cut if since is not None and since <= made else changed).append(f)
        if changed:
            state.stale[key] = changed
        elif cut:
            state.touch[key] = cut
    return state


def touch(graph: Graph, state: State) -> list[str]:
    """Date the outputs of the jobs that read equivalent content only (``state.touch``) to now, as
    ``snakemake --touch`` would, and note it in their records (:func:`vlsens.core.outputs.note_touched`).
    Each output is checked against its record first: one edited since its job wrote it is a
    VlsensError naming it (it is rebuilt, not touched). Returns the outputs touched."""
    import os
    import time

    from vlsens.core.errors import VlsensError
    from vlsens.core.outputs import check_output, note_touched

    outs = [(key, o) for key in graph.order if key in state.touch for o in graph.jobs[key].outputs]
    problems = [p for _, o in outs for p in check_output(o)]
    if problems:
        raise VlsensError(problems[0])
    now = time.time()
    for key, out in outs:
        p = Path(out)
        stamp = p / ".snakemake_timestamp"
        os.utime(stamp if p.is_dir() and stamp.is_file() else p, (now, now))
        note_touched(out, state.touch[key])
    for key in state.touch:  # Snakemake dates a job by its oldest output or benchmark file
        bench = graph.jobs[key].benchmark
        if bench and Path(bench).is_file():
            os.utime(bench, (now, now))
    return [o for _, o in outs]


def seconds(job: Job) -> float | None:
    """The job's last run time from its benchmark file (Snakemake's ``s`` column), None without."""
    if not job.benchmark:
        return None
    try:
        lines = Path(job.benchmark).read_text().splitlines()
        head, row = lines[0].split("\t"), lines[1].split("\t")
        return float(row[head.index("s")])
    except (OSError, IndexError, ValueError):
        return None


def estimate(jobs: Iterable[Job]) -> tuple[float, int]:
    """Seconds the jobs took last time, and how many have no benchmark file to tell."""
    total, unknown = 0.0, 0
    for j in jobs:
        s = seconds(j)
        if s is None:
            unknown += 1
        else:
            total += s
    return total, unknown
