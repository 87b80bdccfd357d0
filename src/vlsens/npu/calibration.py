"""Each part's own calibration archives: the earlier parts run on the graph's calibration set."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlsens.npu.build import load_record, verify_parts
from vlsens.npu.chain import Chain


def part_calibration(parts_dir: str | Path, calib_npz: str | Path, eval_npz: str | Path, out_dir: str | Path,
                     threads: int = 0, device: str = "auto") -> dict:
    """Per part, ``part<j>/calib.tar`` and ``eval.tar`` in the layout of the graph's own
    (``<input>_<index>.npy`` per sample), and ``calib.npz`` / ``eval.npz`` in the stacked layout
    the sensitivity engines and the profile read: the part's inputs as it takes them, produced by running
    the earlier parts on the calibration images (one call per ``vision.batch_size`` images: the
    vision tower's hidden states are (tokens of the call, hidden), no batch axis to split)."""
    from vlsens.core.fsutil import atomic_dir, write_json
    from vlsens.core.onnxutil import input_batch
    from vlsens.data.calibration import write_npy_tar
    from vlsens.data.samples import fit_batch, load_stacked, save_stacked

    files = verify_parts(parts_dir)
    chain = Chain(files, threads, device, load_record(parts_dir)["variant"])
    counts = {}
    with atomic_dir(out_dir) as tmp:
        for split, npz in (("calib", calib_npz), ("eval", eval_npz)):
            arrays = load_stacked(npz)
            _, batch = input_batch(chain.sessions[0])
            calls = fit_batch([arrays], batch or 1)
            n = len(calls)
            per_part: list[dict[str, list]] = [dict() for _ in files]
            for call in calls:
                _, got = chain.forward(call)
                for j, ins in enumerate(got):
                    for name, value in ins.items():
                        per_part[j].setdefault(name, []).append(value)
            for j, by_input in enumerate(per_part):
                (tmp / f"part{j}").mkdir(exist_ok=True)
                # the stacked layout of calib/<graph>/<split>.npz: a part is a graph for the engines
                # and the profile (one row per call)
                save_stacked(tmp / f"part{j}" / f"{split}.npz", {k: np.concatenate(v) for k, v in by_input.items()},
                             [f"call{k:04d}" for k in range(n)])
                write_npy_tar(tmp / f"part{j}" / f"{split}.tar", by_input)
            counts[split] = n
        manifest = {"parts": str(parts_dir), "counts": counts,
                    "inputs": [[s.name for s in sess.get_inputs()] for sess in chain.sessions]}
        write_json(tmp / "manifest.json", manifest)
    return manifest
