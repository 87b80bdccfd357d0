"""A job's thread bound reaches torch without importing it (ONNX-only jobs never pay torch's import)."""

import subprocess
import sys

from conftest import REPO


def test_set_threads_defers_to_the_import_of_torch():
    code = """
import sys
from vlsens.core.device import set_threads
set_threads(1)
assert "torch" not in sys.modules, "set_threads imported torch"
import torch
assert torch.get_num_threads() == 1, torch.get_num_threads()
set_threads(3)  # torch loaded: applied at once
assert torch.get_num_threads() == 3, torch.get_num_threads()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "2"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
