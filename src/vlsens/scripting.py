"""Support for the thin ``workflow/scripts/*.py`` entry points (no Snakemake import here).

:func:`run` sends logging, warnings and stray output of the job to the rule's ``log:`` file,
bounds CPU threads to the rule's ``threads:``, and turns a :class:`VlsensError` into one clear
log line and a non-zero exit, so Snakemake fails the job and removes its outputs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, Callable

from vlsens.errors import ParityError, VlsensError


def run(snakemake: Any, main: Callable[[Any], Any]) -> None:
    log_path = snakemake.log[0] if len(snakemake.log) else None
    stream = open(log_path, "w", buffering=1) if log_path else sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    log = logging.getLogger("vlsens.job")
    log.info("rule %s, wildcards %s, threads %s", snakemake.rule, dict(snakemake.wildcards), snakemake.threads)
    from vlsens.device import set_threads

    set_threads(snakemake.threads)
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            main(snakemake)
    except VlsensError as e:
        log.error("%s", e)
        if isinstance(e, ParityError) and e.record:
            import json

            log.error("parity record:\n%s", json.dumps(e.record, indent=2, sort_keys=True, default=str))
        print(f"vlsens: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception:
        log.exception("job failed")
        raise
    finally:
        log.info("done in %.2f s", time.perf_counter() - t0)
        handler.flush()
