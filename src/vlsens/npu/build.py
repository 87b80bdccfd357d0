"""The parts job: a gated graph cut into single-file parts (:mod:`vlsens.npu.cut`), gated and
published.

The gate (:func:`build_parts`): the parts chained in ONNX Runtime equal transformers' features within the
variant's tolerance; every part goes through onnxsim's Python API and the simplified parts,
chained, meet the same tolerance. The record (``parts.json``) lists each part's inputs, outputs,
blocks, nodes, bytes and SHA-256.
"""

from __future__ import annotations

from pathlib import Path

from vlsens.core.errors import ParityError
from vlsens.npu.chain import measure_chain
from vlsens.npu.cut import write_parts

RECORD = "parts.json"


def simplify_part(src: Path, dst: Path) -> dict:
    """onnxsim's Python API on one part, in memory (a part is one protobuf)."""
    import onnx
    import onnxsim

    model = onnx.load(str(src))
    before = len(model.graph.node)
    simplified, ok = onnxsim.simplify(model, check_n=0)
    if not ok:
        raise ParityError(f"onnxsim.simplify failed on {src.name}")
    after = len(simplified.graph.node)
    onnx.save_model(simplified, str(dst))
    return {"nodes_before": before, "nodes_after": after}


def build_parts(src_dir: str | Path, reference: str | Path, out_dir: str | Path, tolerance: dict, variant: str,
                count: int | str, max_bytes: int, threads: int = 0, device: str = "auto") -> dict:
    """``out_dir``: the variant's ``model.onnx`` cut into gated single-file parts (module doc);
    returns the record (``parts.json``). Nothing is written when a gate fails."""
    import time

    from vlsens.core import job, paths
    from vlsens.core.artifacts import file_entries, verify
    from vlsens.core.fsutil import atomic_dir, write_json
    from vlsens.data.cases import Cases
    from vlsens.export import parity

    src = verify(Path(src_dir) / paths.MAIN)
    cases = Cases.load(reference)
    t0 = time.perf_counter()
    with atomic_dir(out_dir) as tmp:
        entries = write_parts(src, tmp, count, max_bytes)
        files = [tmp / e["file"] for e in entries]
        per_input, providers = measure_chain(files, cases, paths.MAIN, threads, device, variant)
        extra: dict = {"source": str(src), "count": len(entries), "requested": count, "max_bytes": int(max_bytes)}
        extra["onnxsim"], simplified = _onnxsim_check(entries, files, tmp / ".simplified", cases, tolerance,
                                                      threads, device, variant)
        sim_ok = extra["onnxsim"]["passed"]
        _add_sizes(entries, files)
        boundary = {o["name"]: o["bytes"] for e in entries[:-1] for o in e["outputs"]}
        extra["boundary_bytes"] = boundary
        extra["seconds"] = round(time.perf_counter() - t0, 1)
        extra["peak_rss_bytes"] = _peak_rss()
        record = parity.make_record(out_dir, variant, per_input, tolerance, cases.source, providers, extra)
        record["parts"] = entries
        record["rule"] = job.rule
        # what vlsens.core.artifacts.verify checks when a job reads a part (a part is a graph)
        record["files"] = file_entries(files, single_file=True)
        if record["passed"] and not sim_ok:
            record["passed"] = False
            raise ParityError(f"{out_dir}: the parts pass the parity gate, but onnxsim's Python API "
                              f"{'failed on a part above 2 GiB' if simplified < len(files) else 'changed them'}: "
                              f"{extra['onnxsim']}. No parts were written.", record)
        parity.gate(record)
        write_json(tmp / RECORD, record)
    return record


def _onnxsim_check(entries: list[dict], files: list[Path], sim_dir: Path, cases, tolerance: dict, threads: int,
                   device: str, variant: str) -> tuple[dict, int]:
    """Every part through onnxsim's Python API (into ``sim_dir``, removed after; each entry gets its
    ``onnxsim`` node counts) and the simplified parts chained against the same reference. Returns
    the record's ``onnxsim`` and how many parts were simplified (those above 2 GiB cannot be)."""
    from vlsens.core import paths
    from vlsens.export import parity

    sim_dir.mkdir()
    sims = []
    for e, f in zip(entries, files):
        if e["single_file"]:
            e["onnxsim"] = simplify_part(f, sim_dir / f.name)
            sims.append(sim_dir / f.name)
    if len(sims) == len(files):
        sim_input, _ = measure_chain(sims, cases, paths.MAIN, threads, device, variant)
        sm = parity.summary(sim_input)["metrics"]
        sim_ok = (sm["min_cosine"] >= float(tolerance["min_cosine"])
                  and sm["max_rel_error"] <= float(tolerance["max_rel_error"]))
        record = {"note": "every part through onnxsim.simplify (Python API, check_n=0), the simplified "
                  "parts chained against the same reference", "passed": sim_ok, "metrics": sm}
    else:
        record = {"note": "a part above 2 GiB cannot go through onnxsim's Python API", "passed": False}
    for p in sims:
        p.unlink()
    sim_dir.rmdir()
    return record, len(sims)


def _add_sizes(entries: list[dict], files: list[Path]) -> None:
    """Each part's ``bytes`` (with its data file), ``sha256`` and ``data_sha256`` (in place)."""
    from vlsens.core.fsutil import file_sha256

    for e, f in zip(entries, files):
        e["bytes"] = sum(p.stat().st_size for p in (f, f.with_name(f.name + ".data")) if p.exists())
        e["sha256"] = file_sha256(f)
        data = f.with_name(f.name + ".data")
        if data.exists():
            e["data_sha256"] = file_sha256(data)


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_record(folder: str | Path) -> dict:
    import json

    return json.loads((Path(folder) / RECORD).read_text())


def verify_parts(folder: str | Path) -> list[Path]:
    """The part files of a published folder, each checked against its record's size and SHA-256."""
    from vlsens.core.errors import ArtifactError
    from vlsens.core.fsutil import file_sha256

    folder = Path(folder)
    rec = load_record(folder)
    out = []
    for e in rec["parts"]:
        f = folder / e["file"]
        size = sum(p.stat().st_size for p in (f, f.with_name(f.name + ".data")) if p.exists()) if f.exists() else -1
        if size != e["bytes"] or file_sha256(f) != e["sha256"]:
            raise ArtifactError(f"{f}: not the part {folder / RECORD} records ({e['bytes']} bytes, sha256 "
                                f"{e['sha256'][:12]}…). Re-create it: delete {folder}/ and run again.")
        out.append(f)
    return out
