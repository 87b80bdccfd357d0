"""``vlsens upgrade``: after a library upgrade, re-run what the new versions may change and stop
where a job's new output equals its old one (early cutoff, :mod:`vlsens.dag.cutoff`).

Each phase is a plain Snakemake run of the same workflow, config and profile (SLURM included)
whose targets are the jobs that have to run now; the jobs record whether each output came out
equivalent to its previous version; the jobs that read only equivalent outputs are dated as up to
date. It ends when a dry run has nothing left. ``--check`` says first what a plain ``snakemake``
would run and what changed for those jobs, runs the phases that fit ``--check-seconds`` by the
recorded benchmark times to find out which outputs actually change, and prints the plan left with
its time estimate. The run's ledger is ``results/<name>/upgrade.json``.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

from vlsens.cli.progress import Progress, clock
from vlsens.core.fsutil import write_json
from vlsens.dag.cutoff import (
    PARAMS,
    Graph,
    Job,
    State,
    classify,
    cut_record,
    estimate,
    library_changes,
    parse_dry_run,
    parse_summary,
    touch,
)


class Upgrade:
    """Snakemake in the run's folder with the run's config; what the phases did."""

    def __init__(self, args, extra: list[str], workflow: Path):
        self.run_dir = Path(args.dir or ".").resolve()
        self.base = [sys.executable, "-m", "snakemake", "--snakefile", str(workflow / "Snakefile"), "--directory",
                     str(self.run_dir), "--cores", str(args.cores), "--resources", f"gpu={args.gpus}"]
        if args.configs:
            self.base += ["--configfile", *(str(Path(c).resolve()) for c in args.configs)]
        if args.profile:
            prof = Path(args.profile)
            self.base += ["--workflow-profile", str(prof if prof.is_dir() else workflow / "profiles" / args.profile)]
        self.base += extra
        self.targets, self.verbose = list(args.targets), args.verbose
        self.env = {**os.environ, "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME")
                    or str(self.run_dir / ".snakemake" / "cache")}
        self.ledger: dict = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "phases": [], "touched": []}
        self.dated: set[str] = set()  # the jobs dated as up to date, by their first output

    def _cmd(self, *flags: str) -> list[str]:
        return [*self.base, *flags, *(["--", *self.targets] if self.targets else [])]

    def _read(self, *flags: str) -> str:
        r = subprocess.run(self._cmd(*flags), capture_output=True, text=True, cwd=self.run_dir, env=self.env)
        if r.returncode:
            raise SystemExit(f"vlsens: snakemake {' '.join(flags)} failed (exit {r.returncode}):\n"
                             + (r.stdout + r.stderr)[-3000:])
        return r.stdout + r.stderr

    def dry(self) -> list[Job]:
        """The jobs a plain run would run, with Snakemake's reasons."""
        return parse_dry_run(self._read("-n"))

    def graph(self) -> Graph:
        """The whole DAG as it stands (read anew each round: a checkpoint that ran adds jobs)."""
        return Graph(parse_summary(self._read("--detailed-summary")))

    def run(self, flags: list[str], log: Path) -> int:
        from vlsens.cli.run import _stream

        progress = None if self.verbose else Progress()
        rc = _stream([*self.base, *flags], log, progress, self.run_dir)
        if progress:
            for line in progress.closing(rc, log):
                print(line)
        return rc

    def root(self, graph: Graph) -> Path:
        """``results/<name>`` of the run (its jobs' outputs)."""
        parts = Path(min(graph.producer)).parts
        return self.run_dir.joinpath(*parts[:2])


def _by_rule(jobs: list[Job]) -> list[str]:
    """One line per rule: how many jobs, and what changed for them."""
    rows: dict[str, dict] = {}
    for j in jobs:
        row = rows.setdefault(j.rule, {"n": 0, "why": {}})
        row["n"] += 1
        for r in j.reasons:
            if r.startswith(PARAMS):
                for lib, (b, n) in library_changes(r).items():
                    row["why"][f"{lib} {b[:8]} -> {n[:8]}" if lib == "vlsens code" else f"{lib} {b} -> {n}"] = 1
            else:
                row["why"][r.split(":")[0].lower()] = 1
    return [f"  {rule:24} {row['n']:>3}  " + "; ".join(row["why"]) for rule, row in sorted(rows.items())]


def _time(jobs: list[Job]) -> str:
    s, unknown = estimate(jobs)
    return clock(s) + (f" (+{unknown} jobs never timed)" if unknown else "")


def _phase(up: Upgrade, graph: Graph, keys: list[str], n: int, root: Path) -> bool:
    """Run the jobs ``keys`` (and whatever Snakemake runs with them: its log says which), then
    read each output's verdict. Returns whether a checkpoint ran (the DAG is then read anew)."""
    jobs = [graph.jobs[k] for k in keys]
    outs = sorted({o for j in jobs for o in j.outputs})
    print(f"vlsens: phase {n}: {len(jobs)} job(s), about {_time(jobs)} by their last runs", flush=True)
    start, log = time.monotonic(), root / "logs" / f"upgrade-{n}.log"
    if up.run(["--forcerun", *outs, "--", *outs], log):
        raise SystemExit(f"vlsens: phase {n} failed; its outputs' previous versions are back in place")
    ran = parse_dry_run(log.read_text(errors="replace")) or jobs
    written = sorted({o for j in ran for o in j.outputs})
    same = [o for o in written if (cut_record(o) or {}).get("equivalent") is True]
    changed = [o for o in written if o not in same]
    up.ledger["phases"].append({"jobs": [j.label for j in ran], "seconds": round(time.monotonic() - start, 1),
                                "equivalent": same, "changed": changed})
    print(f"vlsens: phase {n}: {len(same)} output(s) equivalent to their previous version, {len(changed)} changed",
          flush=True)
    return any(j.checkpoint for j in ran)


def _plan_left(graph: Graph, state: State) -> None:
    todo = state.own | set(state.stale)
    surely = [graph.jobs[k] for k in sorted(todo)]
    maybe = [graph.jobs[k] for k in sorted(graph.descendants(todo) - todo)]
    print(f"vlsens: left to run: {len(surely)} job(s), about {_time(surely)}; then, as far as their outputs change, "
          f"up to {len(maybe)} more, about {_time(maybe)}")
    for line in _by_rule(surely):
        print(line)


def _round(up: Upgrade, graph: Graph | None = None, run: list[Job] | None = None) -> tuple[Graph, State]:
    """The DAG (``graph``, else read anew) and a dry run (``run``, else made), read: what runs for
    its own reasons, and the jobs downstream of equivalent outputs only, dated (then read again:
    their own reasons show once their inputs are older than their outputs)."""
    graph = graph or up.graph()
    run = up.dry() if run is None else run
    graph.learn(run)
    state = classify(graph, run)
    if state.touch:
        done = touch(graph, state)
        up.dated |= set(state.touch)
        up.ledger["touched"] = sorted(graph.jobs[k].label if graph.jobs[k].wildcards else k for k in up.dated
                                      if k in graph.jobs)
        print(f"vlsens: {len(state.touch)} job(s) read only outputs that came out equivalent: their {len(done)} "
              "output(s) are dated now (up to date)", flush=True)
        run = up.dry()
        graph.learn(run)
        state = classify(graph, run)
    return graph, state


def cmd_upgrade(args, extra: list[str], workflow: Path) -> int:
    from vlsens.core.errors import VlsensError

    up = Upgrade(args, extra, workflow)
    os.chdir(up.run_dir)  # Snakemake's paths are relative to the run's folder; so are the records read here
    graph = up.graph()
    if not graph.jobs:
        print("vlsens: no jobs in this workflow's DAG")
        return 0
    if not any(Path(o).exists() for o in graph.producer):
        raise SystemExit(f"vlsens: {up.run_dir} holds no run of this config (none of its {len(graph.jobs)} jobs' "
                         "outputs is here): upgrade re-runs what a library upgrade changed in a finished run; "
                         "start one with `vlsens run` (or give the run's folder with --dir and its config with "
                         "--config)")
    plain = up.dry()
    graph.learn(plain)
    root = up.root(graph)
    print(f"vlsens: a plain snakemake would run {len(plain)} job(s), about {_time(plain)} by their last runs")
    own = [j for j in plain if j.key in classify(graph, plain).own]
    print(f"vlsens: {len(own)} of them run for reasons of their own (and no such job upstream):")
    for line in _by_rule(own):
        print(line)
    up.ledger.update(plain_jobs=len(plain), libraries=sorted({lib for j in own for r in j.reasons
                                                              for lib in library_changes(r)}))
    n, start = 0, time.monotonic()
    try:
        graph, state = _round(up, graph, plain)
        while keys := state.frontier(graph):
            if args.check and estimate(graph.jobs[k] for k in keys)[0] > args.check_seconds:
                break
            n += 1
            checkpoint = _phase(up, graph, keys, n, root)
            graph, state = _round(up, None if checkpoint else graph)  # a checkpoint that ran adds jobs
    except VlsensError as e:
        raise SystemExit(f"vlsens: {e}") from None
    ran = sum(len(p["jobs"]) for p in up.ledger["phases"])
    up.ledger.update(ran_jobs=ran, seconds=round(time.monotonic() - start, 1), check=bool(args.check))
    write_json(root / "upgrade.json", up.ledger)
    if args.check:
        _plan_left(graph, state)
        print(f"vlsens: --check ran {ran} job(s) in {n} phase(s), {clock(time.monotonic() - start)}; `vlsens upgrade` "
              "goes on from there")
        return 0
    left = up.dry()
    if left:
        raise SystemExit(f"vlsens: {len(left)} job(s) are left that no phase accounts for: "
                         + ", ".join(j.label for j in left[:8]) + "; run snakemake to build them")
    print(f"vlsens: upgrade done in {clock(time.monotonic() - start)}: {ran} job(s) ran in {n} phase(s) (a plain run: "
          f"{len(plain)}), {len(up.ledger['touched'])} dated as up to date; ledger {root / 'upgrade.json'}")
    return 0
