"""The parts of a cut graph run one after another in ONNX Runtime (:class:`Chain`), measured by
the parity gate's own code."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class Chain:
    """The parts run one after another in ONNX Runtime, each reading what earlier parts made. It
    answers like an ``InferenceSession`` (``get_inputs``, ``get_outputs``, ``get_providers``,
    ``run``), so the parity gate and :func:`vlsens.data.samples.run_fitted` take it as they are."""

    def __init__(self, files: list[Path], threads: int = 0, device: str = "auto", variant: str = "fp32"):
        from vlsens.core.onnxutil import make_session

        if variant.startswith("bf16"):  # ONNX Runtime's CPU provider has no bfloat16 kernels
            from vlsens.variants.bfloat16 import session_opener

            self.sessions = [session_opener(threads, device)(f) for f in files]
        else:
            self.sessions = [make_session(f, threads=threads, device=device) for f in files]

    def get_inputs(self):
        return self.sessions[0].get_inputs()

    def get_outputs(self):
        return self.sessions[-1].get_outputs()

    def get_providers(self):
        return self.sessions[0].get_providers()

    def forward(self, feeds: dict[str, np.ndarray]) -> tuple[dict, list[dict]]:
        """Every tensor the parts made (with ``feeds``), and each part's inputs."""
        env = dict(feeds)
        inputs = []
        for s in self.sessions:
            ins = {i.name: env[i.name] for i in s.get_inputs()}
            inputs.append(ins)
            env.update({o.name: v for o, v in zip(s.get_outputs(), s.run(None, ins))})
        return env, inputs

    def run(self, names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        env, _ = self.forward(feeds)
        return [env[n] for n in (names or [o.name for o in self.get_outputs()])]


def measure_chain(files: list[Path], cases, graph_file: str, threads: int = 0, device: str = "auto",
                  variant: str = "fp32"):
    """``(per_input, providers)`` of the chained parts on every case of ``graph_file``: the parity
    gate's own measurement, with the chain as the graph's session."""
    from vlsens.export import parity

    per_input, providers, _ = parity.measure({graph_file: files}, cases, threads, device,
                                             open_session=lambda f: Chain(f, threads, device, variant))
    return per_input, providers
