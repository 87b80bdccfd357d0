"""Fault injection for the reliability tests: kill a job at a named point, as the OOM killer would.

``VLSENS_FAULT=<rule>:<point>`` in a job's environment makes :func:`point` send SIGKILL to the
job's own process when the job of ``<rule>`` reaches ``<point>``. Unset (always, outside the
tests), :func:`point` does nothing. Points: ``publish`` (the first file of a job's outputs has
been moved into place, the others not yet); ``write`` (half of an ONNX model's external data is
on disk, its graph file not yet: a job killed during a large write).
"""

from __future__ import annotations

import os
import signal

from vlsens.core import job


def point(name: str) -> None:
    spec = os.environ.get("VLSENS_FAULT")
    if spec and job.rule and spec == f"{job.rule}:{name}":
        os.kill(os.getpid(), signal.SIGKILL)
