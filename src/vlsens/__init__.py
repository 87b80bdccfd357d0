"""vlsens: verified ONNX export, quantization sensitivity and mixed-precision profiles for
Qwen2.5-VL checkpoints. All logic lives here; the Snakemake workflow only declares."""

__version__ = "0.1.0"
