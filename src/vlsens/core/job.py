"""The workflow job this process runs (set by :func:`vlsens.core.scripting.run`; None outside jobs)."""

from __future__ import annotations

rule: str | None = None


def set_rule(name: str | None) -> None:
    global rule
    rule = name


class Progress:
    """Progress lines for a long loop, for ``tail -f`` on a job's log: ``<what>: 12/163 ops
    (7 %), 2.50 s/op, ETA 6 min 20 s``, at most every ``every`` seconds, and always for the last
    item. ``clock`` is for tests."""

    def __init__(self, what: str, total: int, unit: str = "ops", every: float = 15.0, log=None, clock=None):
        import logging
        import time

        self.what, self.total, self.unit, self.every = what, int(total), unit, float(every)
        self.log = log or logging.getLogger("vlsens.progress")
        self.clock = clock or time.perf_counter
        self.t0 = self.last = self.clock()
        self.done = 0

    def step(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if self.done >= self.total or now - self.last >= self.every:
            self.last = now
            self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        spent = now - self.t0
        rate = spent / self.done if self.done else float("nan")
        left = max(self.total - self.done, 0) * rate if self.done else float("nan")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"{self.what}: {self.done}/{self.total} {self.unit} ({pct:.0f} %), "
                f"{rate:.2f} s/{self.unit.rstrip('s') or 'item'}, ETA {_duration(left)}")


def _duration(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s"
    h, m = divmod(m, 60)
    return f"{h} h {m} min"
