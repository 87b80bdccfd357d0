"""Snakemake's output, one line per finished job: ``vlsens run`` reads Snakemake's log as it is
written and says what a person needs: how many jobs, each job as it finishes with the time left
(the mean time per job so far, times the jobs left), the jobs' own ``vlsens WARNING`` / ``ERROR``
lines, and a failure as one line naming the rule and its log, or the configuration error itself
(without Snakemake's ``WorkflowError in file ...`` wrapping and traceback line)."""

from __future__ import annotations

import re
import time

RULE = re.compile(r"^(?:local)?rule (\S+):$")
FIELD = re.compile(r"^\s+(wildcards|jobid|log): (.*)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\S+)\)$")
STEPS = re.compile(r"^(\d+) of (\d+) steps \(\d+%\) done$")
TOTAL = re.compile(r"^total\s+(\d+)$")
STATS_ROW = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s+(\d+)$")
OWN = re.compile(r"^vlsens( WARNING| ERROR|:)")
ERROR_IN_RULE = re.compile(r"^Error in rule (\S+):$")
EXCEPTION = re.compile(r"^(\w+(?:Error|Exception))(?: in rule \S+)? in file .*, line \d+:$")


def clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def _label(rule: str, wildcards: str) -> str:
    """``rule graph variant`` from Snakemake's ``wildcards: model=tiny, graph=..., ...`` (the model
    is the run's own)."""
    parts = [v.split("=", 1)[1] for v in wildcards.split(", ") if "=" in v and not v.startswith("model=")]
    return " ".join([rule, *parts])


class Progress:
    """Feed it Snakemake's lines; each call returns the lines to print."""

    def __init__(self, dry_run: bool = False):
        self.dry_run, self.start = dry_run, time.monotonic()
        self.total, self.stats, self.in_stats = None, [], False
        self.block: dict = {}
        self.finished: dict | None = None  # the job whose "Finished" line came, until its step count
        self.jobs: dict[str, dict] = {}
        self.errors: list[str] = []
        self.exception: list[str] | None = None
        self.nothing = False

    def _stats(self, line: str) -> list[str]:
        m = TOTAL.match(line)
        if m:
            self.in_stats = False
            if self.total is None:
                self.total = int(m.group(1))
                rows = ", ".join(f"{r} {n}" for r, n in self.stats if r != "all")
                jobs = "job" if self.total == 1 else "jobs"
                return [f"vlsens: {self.total} {jobs} {'would run' if self.dry_run else 'to run'}: {rows}"]
            return []
        m = STATS_ROW.match(line)
        if m and self.total is None:
            self.stats.append((m.group(1), int(m.group(2))))
        return []

    def _exception(self, line: str) -> list[str]:
        if line.startswith("  File ") or not line.strip():
            msg, self.exception = " ".join(s.strip() for s in self.exception if s.strip()), None
            self.errors.append(msg)
            return [f"vlsens: {msg}"]
        self.exception.append(line)
        return []

    def feed(self, line: str) -> list[str]:
        if "Directory cannot be locked" in line:  # Snakemake's LockException, whether in a block or not
            self.exception = None
            self.errors.append("locked")
            return ["vlsens: the run's folder is locked: a run is going on in it, or one was killed and left its "
                    "lock; if none is going on, the same command with --unlock removes the lock"]
        if self.exception is not None:
            return self._exception(line)
        if self.in_stats:
            return self._stats(line)
        if line.startswith("Job stats:"):
            self.in_stats = True
            return []
        if OWN.match(line):
            return [line]
        if line.startswith("Nothing to be done"):
            self.nothing = True
            return ["vlsens: nothing to do: every output is up to date"]
        m = EXCEPTION.match(line)
        if m:
            self.exception = []
            return []
        return self._jobs(line)

    def _jobs(self, line: str) -> list[str]:
        m = RULE.match(line)
        if m:
            self.block = {"rule": m.group(1), "wildcards": ""}
            return []
        m = FIELD.match(line)
        if m and self.block:
            self.block[m.group(1)] = m.group(2)
            if m.group(1) == "jobid" and not self.block.get("failed"):  # the same dict: wildcards come later
                self.block["start"] = time.monotonic()
                self.jobs[m.group(2)] = self.block
            return self._failed()
        m = ERROR_IN_RULE.match(line)
        if m:
            self.block = {"rule": m.group(1), "wildcards": "", "failed": True}
            self.errors.append(m.group(1))
            return []
        m = FINISHED.match(line)
        if m:
            self.block = {}
            self.finished = self.jobs.get(m.group(1), {"rule": m.group(2), "wildcards": "", "start": time.monotonic()})
            return []
        m = STEPS.match(line)
        if m and self.finished:
            return [self._line(int(m.group(1)), int(m.group(2)))]
        return []

    def _failed(self) -> list[str]:
        """The end of an ``Error in rule`` block (its log line read): one line naming it."""
        if self.block.get("failed") and "log" in self.block:
            b, self.block = self.block, {}
            return [f"vlsens: job {_label(b['rule'], b['wildcards'])} failed; its log: {b['log'].split(' (')[0]}"]
        return []

    def _line(self, done: int, total: int) -> str:
        j, self.finished = self.finished, None
        now = time.monotonic()
        elapsed = now - self.start
        left = elapsed / done * (total - done)
        eta = f", about {clock(left)} left" if done < total else ""
        return (f"[{done:>{len(str(total))}}/{total}] {_label(j['rule'], j['wildcards'])} "
                f"({clock(now - j['start'])}); {clock(elapsed)} so far{eta}")

    def closing(self, rc: int, log_file) -> list[str]:
        """What to print when Snakemake has ended: for a failure without a line of its own yet,
        where to read why."""
        if rc and not self.errors:
            return [f"vlsens: the run failed (exit {rc}); Snakemake's output: {log_file}"]
        if rc:
            return [f"vlsens: the run failed; Snakemake's output: {log_file}"]
        return []
