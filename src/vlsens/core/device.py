"""Device choice for torch: CUDA when present (and allowed), CPU otherwise."""

from __future__ import annotations


def torch_device(device: str = "auto") -> str:
    import torch

    if device == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise RuntimeError("device: cuda was requested but torch sees no CUDA device.")
    return "cpu"


def gpu_present() -> bool:
    """Whether this host has a GPU device node (NVIDIA's driver or ROCm's), without importing
    torch: read when the DAG is built, to decide whether jobs queue for a ``gpu`` token."""
    import os
    from pathlib import Path

    nvidia = Path("/proc/driver/nvidia/gpus")
    return (nvidia.is_dir() and any(nvidia.iterdir())) or os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")


def cuda_visible() -> list[str]:
    """What sees a CUDA device here: ``torch`` and/or ``onnxruntime`` (empty: none)."""
    import importlib.util

    seen = []
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            seen.append("torch")
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            seen.append("onnxruntime")
    return seen


#: ONNX Runtime's session entries that make idle pool threads sleep instead of spin
NO_SPIN = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}


def passive() -> bool:
    """Whether this job shares its cores (it reserved fewer than it computes with; set by the
    scripts' ``_vlsens``): its ONNX Runtime and onnxruntime-genai sessions then take
    :data:`NO_SPIN`, as OpenMP takes ``OMP_WAIT_POLICY=PASSIVE`` (spinning threads of two jobs on
    two cores took a fifth of a tiny run's wall time; the results are the same)."""
    import os

    return os.environ.get("VLSENS_PASSIVE") == "1"


def set_threads(threads: int) -> None:
    """Bound torch's CPU threads to what the Snakemake rule declared, without importing torch:
    ``torch.set_num_threads`` runs now if torch is loaded, else right after the job imports it.
    An ONNX-only job then never pays torch's import (1.5 s, most of a small job's time); ONNX
    Runtime sessions get their thread count explicitly."""
    import sys

    if not threads or threads <= 0:
        return
    if "torch" in sys.modules:  # loaded (or marked unavailable: None)
        if sys.modules["torch"] is not None:
            sys.modules["torch"].set_num_threads(int(threads))
        return
    sys.meta_path.insert(0, _SetTorchThreads(int(threads)))


class _SetTorchThreads:
    """Import hook: when ``torch`` is imported, call ``torch.set_num_threads(n)`` after it loads."""

    def __init__(self, threads: int):
        self.threads = threads

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util
        import sys

        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from finding this hook
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run, threads = spec.loader.exec_module, self.threads

        def exec_module(module):
            run(module)
            module.set_num_threads(threads)

        spec.loader.exec_module = exec_module
        return spec
