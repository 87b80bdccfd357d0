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


def test_a_job_that_shares_its_cores_lets_idle_threads_sleep(tmp_path):
    """``_vlsens`` (imported first by every script) marks a job that reserved fewer cores than it
    computes with; its sessions then take allow_spinning 0 and OpenMP waits passively. A job with
    its own cores keeps ONNX Runtime's default (spinning: lower latency)."""
    code = """
import os, sys, types
sys.modules["__main__"].snakemake = types.SimpleNamespace(threads=RESERVED,
                                                          resources=types.SimpleNamespace(compute_threads=2))
sys.path.insert(0, "SCRIPTS")
import _vlsens
from vlsens.core.device import passive
from vlsens.core.onnxutil import make_session
s = make_session("MODEL", threads=2, providers=["CPUExecutionProvider"]).get_session_options()
try:
    spin = s.get_session_config_entry("session.intra_op.allow_spinning")
except RuntimeError:  # not set: ONNX Runtime's default
    spin = "default"
print(passive(), os.environ.get("OMP_WAIT_POLICY"), spin)
"""
    import onnx
    from onnx import TensorProto, helper

    model = tmp_path / "relu.onnx"
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(model))
    out = {}
    for reserved in (1, 2):
        src = (code.replace("RESERVED", str(reserved)).replace("SCRIPTS", str(REPO / "workflow" / "scripts"))
               .replace("MODEL", str(model)))
        r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120,
                           env={"PYTHONPATH": str(REPO / "src")})
        assert r.returncode == 0, r.stderr[-2000:]
        out[reserved] = r.stdout.split()
    assert out[1] == ["True", "PASSIVE", "0"]
    assert out[2] == ["False", "None", "default"]
