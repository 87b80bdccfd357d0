"""Support for the thin ``workflow/scripts/*.py`` entry points (no Snakemake import here).

:func:`run` wraps every job:

- logging, warnings and stray output go to the rule's ``log:`` file; vlsens' own warnings and
  errors are also printed on the console (Snakemake's output), so a job that finishes with a
  caveat (an unreachable profile, a skipped image) says so where the person running it looks;
- CPU threads are bounded to the rule's ``threads:``;
- leftovers of an earlier, killed run of the same job (temporary files and staging folders named
  after its outputs) are removed before it starts;
- every declared ONNX input is checked against the record it was published with (size and
  SHA-256); graph files a stage reads beside a declared one (the text tower's ``embeds.onnx``)
  are checked by the stage when it opens them (:func:`vlsens.core.artifacts.verify`);
- every output ends with the mode of an ordinary file under the umask, whichever library wrote it;
- a :class:`VlsensError` becomes one clear line and a non-zero exit, so Snakemake fails the job
  and removes its outputs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlsens.core.errors import ParityError, VlsensError

#: ``extra=LOG_ONLY`` keeps a record out of the console (long dumps, tracebacks).
LOG_ONLY = {"log_only": True}


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.startswith("vlsens") and not getattr(record, "log_only", False)


#: Warnings every job of a kind gives, that say nothing about this run (counted, not logged):
#: ONNX Runtime's quantizer asks for its pre-processing on every call (vlsens passes the graph
#: through as exported, on purpose: node names are the sensitivity CSV's keys), and tracing the
#: stock vision encoder warns on every Python-side index computation (the fixed-size graphs bake
#: them for their size; the parity gate checks the result).
KNOWN_NOISE = (
    ("onnxruntime quantizer: 'consider pre-processing'", ("Please consider pre-processing before quantization",
                                                          "Please consider to run pre-processing before quantization")),
    ("torch TracerWarning (tracing bakes index computations)", ("TracerWarning",)),
)


class _NoiseFilter(logging.Filter):
    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        msg = record.getMessage()
        for label, needles in KNOWN_NOISE:
            if any(n in msg for n in needles):
                self.counts[label] = self.counts.get(label, 0) + 1
                return False
        return True


def threads(snakemake: Any) -> int:
    """The threads the job computes with: its rule's ``compute_threads`` resource (the config's
    ``threads``, not the cores Snakemake reserved for it, so the numbers do not depend on
    ``--cores``); the reserved cores for a rule that declares none."""
    return int(getattr(getattr(snakemake, "resources", None), "compute_threads", None) or snakemake.threads)


def _profiled(main: Callable[[Any], Any], snakemake: Any, rule: str) -> None:
    """``main(snakemake)``; with ``VLSENS_PROFILE=<dir>`` in the environment, under cProfile, its
    statistics written to ``<dir>/<rule>-<wildcards>.prof`` (read with ``python -m pstats``)."""
    import os

    where = os.environ.get("VLSENS_PROFILE")
    if not where:
        main(snakemake)
        return
    import cProfile

    name = "-".join([rule, *(str(v) for v in dict(snakemake.wildcards).values())]).replace("/", "_")
    Path(where).mkdir(parents=True, exist_ok=True)
    with cProfile.Profile() as prof:
        try:
            main(snakemake)
        finally:
            prof.dump_stats(str(Path(where) / f"{name}.prof"))


def _checked_inputs(snakemake: Any, log: logging.Logger) -> None:
    """Before the job: its own leftovers removed, and the records of its outputs' earlier versions
    (the job writes them anew); its ONNX inputs against their records, every input another job
    recorded against that record (:mod:`vlsens.core.outputs`)."""
    from vlsens.core.artifacts import verify_inputs
    from vlsens.core.fsutil import remove_stale
    from vlsens.core.outputs import forget, verify_paths

    remove_stale(list(getattr(snakemake, "output", [])))
    forget(list(getattr(snakemake, "output", [])))
    checked = verify_inputs(list(getattr(snakemake, "input", [])))
    if checked:
        log.info("%d ONNX input(s) match their records", checked)
    recorded = verify_paths(list(getattr(snakemake, "input", [])))
    if recorded:
        log.info("%d input(s) match what their jobs recorded", recorded)


def _recorded_outputs(snakemake: Any, rule: str) -> None:
    """After the job: its outputs with an ordinary file's mode (whatever wrote them: ORT, onnx,
    tempfile), then recorded with their sizes and hashes."""
    from vlsens.core.fsutil import normal_mode
    from vlsens.core.outputs import drop_previous, record_outputs

    for out in getattr(snakemake, "output", []):
        if Path(out).exists():
            normal_mode(out)
    provenance = getattr(getattr(snakemake, "params", None), "provenance", None)
    record_outputs(list(getattr(snakemake, "output", [])), rule, provenance if isinstance(provenance, dict) else None)
    drop_previous(list(getattr(snakemake, "output", [])))


def run(snakemake: Any, main: Callable[[Any], Any]) -> None:
    from vlsens.core import job

    rule = str(snakemake.rule)
    log_path = snakemake.log[0] if len(snakemake.log) else None
    stream = open(log_path, "w", buffering=1) if log_path else sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    noise = _NoiseFilter()
    handler.addFilter(noise)
    console = logging.StreamHandler(sys.stderr)  # bound now: the job's own stderr goes to the log below
    console.setLevel(logging.WARNING)
    console.addFilter(_ConsoleFilter())
    console.setFormatter(logging.Formatter(f"vlsens %(levelname)s [{rule}]: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler, console]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    log = logging.getLogger("vlsens.core.job")
    log.info("rule %s, wildcards %s, threads %s (cores reserved: %s)", rule, dict(snakemake.wildcards),
             threads(snakemake), snakemake.threads)
    job.set_rule(rule)
    from vlsens.core.device import set_threads

    set_threads(threads(snakemake))
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            _checked_inputs(snakemake, log)
            _profiled(main, snakemake, rule)
            _recorded_outputs(snakemake, rule)
    except VlsensError as e:
        log.error("%s", e)
        if isinstance(e, ParityError) and e.record:
            import json

            log.error("parity record:\n%s", json.dumps(e.record, indent=2, sort_keys=True, default=str),
                      extra=LOG_ONLY)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C reaches the job too: one line, not a traceback from deep inside
        log.error("interrupted (Ctrl-C)")
        sys.exit(130)
    except Exception:
        log.exception("job failed", extra=LOG_ONLY)
        raise
    finally:
        if noise.counts:
            log.info("known-noise warnings not logged: %s",
                     ", ".join(f"{n} x {label}" for label, n in sorted(noise.counts.items())))
        log.info("done in %.2f s", time.perf_counter() - t0)
        handler.flush()
