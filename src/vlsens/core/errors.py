"""Exceptions with messages meant for the person who runs the workflow."""


class VlsensError(Exception):
    """Base class: every message names the key or file at fault and what would be valid."""


class ConfigError(VlsensError):
    """A config value is invalid (raised while the DAG is built)."""


class CheckpointError(VlsensError):
    """A checkpoint directory cannot be used."""


class ImageError(VlsensError):
    """An input image is missing, unreadable or corrupt."""


class ParityError(VlsensError):
    """An ONNX artifact does not match the PyTorch reference within tolerance."""

    def __init__(self, message: str, record: dict | None = None):
        super().__init__(message)
        self.record = record or {}


class ArtifactError(VlsensError):
    """A published artifact no longer matches its record (changed after it was written)."""
