"""Imported first by every script: makes ``src/vlsens`` importable where the package is not
installed (e.g. a conda env built from envs/*.yaml), and sets the job's thread environment.
Snakemake puts this folder on sys.path.

Snakemake starts a script job with ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``
(...) set to the cores the job reserved (``threads:``, see ``job_cores`` in the config). A job
computes with its rule's ``compute_threads`` instead, so its numbers do not depend on ``--cores``:
the variables are set to that here, before numpy or torch are loaded (they read them once). A job
that reserved fewer cores than that lets its idle threads sleep (``VLSENS_PASSIVE``)."""
import os
import sys
from pathlib import Path

_SRC = str(Path(__file__).resolve().parents[2] / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

_THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
_job = getattr(sys.modules.get("__main__"), "snakemake", None)
_compute = getattr(getattr(_job, "resources", None), "compute_threads", None)
if _compute:
    if "numpy" in sys.modules or "torch" in sys.modules:
        raise RuntimeError("_vlsens must be imported before numpy and torch (it sets their thread counts)")
    for _var in _THREAD_VARS:
        os.environ[_var] = str(int(_compute))
    # A job that reserved fewer cores than it computes with shares them with other jobs (a tiny
    # preset: one core reserved, two threads): its idle threads sleep instead of spinning
    # (OpenMP's wait policy for torch; ONNX Runtime's and onnxruntime-genai's sessions read
    # VLSENS_PASSIVE, vlsens.core.device.passive). Scheduling only: the numbers are the same.
    if int(_compute) > int(getattr(_job, "threads", 0) or 0):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ["VLSENS_PASSIVE"] = "1"
