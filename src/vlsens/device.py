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


def set_threads(threads: int) -> None:
    """Bound torch's CPU threads to what the Snakemake rule declared.

    ONNX-only stages run in environments without torch: then there is nothing to bound (ONNX
    Runtime sessions get their thread count explicitly).
    """
    import importlib.util

    if threads and threads > 0 and importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(int(threads))
