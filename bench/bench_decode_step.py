#!/usr/bin/env python
"""The decode-step estimate (vlsens.budget.latency) against measured steps, on a decoder graph of
a finished run: the three uniform decoders (all float, all INT8, all INT4 at the run's nbits
settings) and mixed assignments a plan could take, quantized by the same code the plan folders
use, timed in the same rounds (one session at a time); each mixed one's estimate is the
float-byte-weighted mean of the uniform steps. Prints a table.

    python bench/bench_decode_step.py --results results/3b          # make scale: real widths, 2 layers
    python bench/bench_decode_step.py --results results/tiny --context 128

The mixed assignments: the builder's INT4 with lm_head INT8, attention INT8 / MLP INT4, MLP float /
the rest INT4, and two seeded random draws over {float, INT8, INT4} per MatMul.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def assignments(ops: list[str], lm_head: str, seed: int = 0) -> dict[str, dict[str, int]]:
    """Named decoder assignments (op -> 0 / 4 / 8) to time beside the uniform decoders."""
    import numpy as np

    mlp = [o for o in ops if "mlp" in o.lower()]
    out = {"int4 + lm_head int8": {**dict.fromkeys(ops, 4), lm_head: 8},
           "attention int8, mlp int4": {o: 4 if o in mlp else 8 for o in ops},
           "mlp float, rest int4": {o: 0 if o in mlp else 4 for o in ops}}
    rng = np.random.default_rng(seed)
    for k in range(2):
        out[f"random {k + 1}"] = {o: int(rng.choice([0, 4, 8])) for o in ops}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/3b", help="results/<model> of a run that exported the decoder")
    ap.add_argument("--context", type=int, default=512, help="cached tokens before the timed step")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: its choice)")
    ap.add_argument("--publish", action="store_true",
                     help="write the table to docs/benchmarks/ (default: results/bench/)")
    a = ap.parse_args()

    import onnx

    from vlsens.budget.latency import estimate_ms, time_steps
    from vlsens.core.onnxutil import model_bytes
    from vlsens.quantize.nbits import NBitsSettings, float_bytes, lm_head, quantize, weight_matmuls

    root = Path(a.results)
    decoder = root / "decoder" / "fp32" / "model.onnx"
    cfg = json.loads((root / "checkpoint" / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    heads = int(text["num_attention_heads"])
    config = {"num_key_value_heads": int(text["num_key_value_heads"]), "head_size": int(text["hidden_size"]) // heads,
              "hidden_size": int(text["hidden_size"])}
    ops = weight_matmuls(decoder)
    rows = [{"op": o["name"], "bytes_float": b} for o, b in zip(ops, float_bytes(ops).values())]
    names = [o["name"] for o in ops]
    # RTN: the same MatMulNBits format and bytes as the deploy default k_quant (blocks of 32, accuracy
    # level 4), quicker to build; a step reads the same bytes whatever their values
    settings = NBitsSettings(algorithm="rtn")
    head, _ = lm_head(onnx.load(str(decoder), load_external_data=False))
    mixed = assignments(names, head.name)
    with tempfile.TemporaryDirectory(prefix="vlsens-decode-") as work:
        graphs = {"float": decoder}
        uniform = {"float": {}, "int8": dict.fromkeys(names, 8), "int4": dict.fromkeys(names, 4)}
        for name, bits in [*((k, v) for k, v in uniform.items() if k != "float"), *mixed.items()]:
            out = Path(work) / name.replace(" ", "_").replace(",", "").replace("+", "p") / "model.onnx"
            out.parent.mkdir()
            graphs[name] = quantize(decoder, out, {o: b for o, b in bits.items() if b}, settings)
            print(f"built {name}: {model_bytes(graphs[name]) / 1e6:.3g} MB", flush=True)
        timed = time_steps(graphs, config, a.context, a.steps, a.threads)
        widths = {0: timed["float"]["ms"], 8: timed["int8"]["ms"], 4: timed["int4"]["ms"]}
        print(f"\n{len(names)} weight MatMuls; one decode step after {a.context} cached tokens, the median of the "
              f"quietest of 3 rounds [the quartiles of all {a.steps} steps], threads {a.threads or 'auto'}\n")
        print("| decoder | MB | estimated ms | measured ms [q1, q3] | estimate error |")
        print("| --- | ---: | ---: | ---: | ---: |")
        errors = []
        for name, bits in {**uniform, **mixed}.items():
            t = timed[name]
            est = estimate_ms(bits, rows, widths)
            err = (est - t["ms"]) / t["ms"]
            if name in mixed:
                errors.append(abs(err))
            print(f"| {name} | {model_bytes(graphs[name]) / 1e6:.3g} | {est:.3g} | {t['ms']:.3g} "
                  f"[{t['q1']:.3g}, {t['q3']:.3g}] | {'(measured)' if name in uniform else f'{err:+.1%}'} |")
        print(f"\nmixed assignments: {sum(e <= 0.10 for e in errors)} of {len(errors)} estimates within 10 % "
              f"of the measured step (largest error {max(errors):.1%})")


if __name__ == "__main__":
    from _publish import published

    name = Path(sys.argv[sys.argv.index("--results") + 1]).name if "--results" in sys.argv else "3b"
    with published(f"decode-step-{name}", "The decode-step estimate against measured steps"):
        main()
