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


def set_threads(threads: int) -> None:
    """Bound torch's CPU threads to what the Snakemake rule declared."""
    import torch

    if threads and threads > 0:
        torch.set_num_threads(int(threads))
