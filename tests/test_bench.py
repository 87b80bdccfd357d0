"""The benchmark scripts' output: a user's run writes its tables under results/, only --publish
writes into the repository's docs/benchmarks/; every script that publishes takes --publish."""

import ast
import importlib.util
import sys

from conftest import REPO

BENCH = REPO / "bench"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def test_tables_go_under_results_unless_published(tmp_path):
    pub = _module("_publish")
    assert pub.destination(argv=[]) == REPO / "results" / "bench"
    assert pub.destination(tmp_path / "results" / "mine", argv=["--results", "x"]) == tmp_path / "results" / "mine" / "bench"
    assert pub.destination(tmp_path, argv=["--publish"]) == REPO / "docs" / "benchmarks"
    for script in sorted(BENCH.glob("*.py")):
        if "published(" not in script.read_text() or script.name == "_publish.py":
            continue
        flags = {n.args[0].value for n in ast.walk(ast.parse(script.read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument" and n.args
                 and isinstance(n.args[0], ast.Constant)}
        assert "--publish" in flags, f"{script.name} publishes but takes no --publish"


def test_the_deploy_table_has_the_median_its_spread_and_a_whole_error_line(capsys):
    import argparse

    dep = _module("bench_deploy")
    rows = [("a", {"prompt_tokens": 10, "new_tokens": 11, "prefill_s": [0.1, 0.2, 0.1, 0.1, 0.3],
                   "decode_s": [1.0, 1.0, 2.0, 1.0, 1.0], "peak_gb": 1.0}),
            ("b", {"error": "Traceback...\nValueError: a Hugging Face Qwen2.5-VL directory is needed here"})]
    dep.table(rows, argparse.Namespace(image=False, tokens=11, threads=2, runs=5))
    out = capsys.readouterr().out
    assert "| a | 10 | 0.100 | 100 | 10.0 [5.0, 10.0] | 2.00x | 1.00 |" in out
    assert "failed: ValueError: a Hugging Face Qwen2.5-VL directory is needed here |" in out


def test_the_npu_weight_rounding_bench_rounds_on_the_qdq_grid_and_gptq_only_helps_where_inputs_correlate():
    """``bench_npu_weights``: round to nearest puts every weight on the QDQ models' per-channel grid
    (``2 max|w| / 255``, codes -128..127); GPTQ on that grid equals it where the inputs do not
    correlate (a diagonal Hessian) and costs less output error where they do."""
    import numpy as np

    b = _module("bench_npu_weights")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 24))
    s = np.abs(w).max(0) * 2 / 255
    r = b.rtn(w)
    codes = r / s
    assert np.allclose(codes, np.round(codes)) and np.round(codes).min() >= -128 and np.round(codes).max() <= 127
    assert np.allclose(b.gptq(w, np.diag(rng.uniform(0.5, 2.0, 64)), damp=0.0), r)
    x = rng.standard_normal((400, 8)) @ rng.standard_normal((8, 64)) + 0.05 * rng.standard_normal((400, 64))
    h = x.T @ x
    g = b.gptq(w, h)
    assert np.allclose(g / s, np.round(g / s))  # on the grid too
    assert b.output_error(g - w, h) < 0.7 * b.output_error(r - w, h)
    assert np.isclose(b.output_error(r - w, h), np.sum((x @ (r - w)) ** 2))


def test_the_npu_table_names_the_weight_rounding_and_a_toolchain_folder_older_than_its_profile(tmp_path):
    """``npu_table``: each profile's row says how its weights were rounded, and a toolchain folder
    whose W8A16 count is not its profile's is marked stale (its ``smooth`` comparison not printed)."""
    import json

    b = _module("npu_table")
    prof = tmp_path / "profile" / "vision" / "448x448" / "fp32-smooth"
    tool = tmp_path / "toolchain" / "vision" / "448x448" / "fp32-smooth"
    prof.mkdir(parents=True)
    tool.mkdir(parents=True)
    ev = {"settings": {"target": "npu", "weight_rounding": "gptq"}, "quantizable_ops": 10, "int8_ops": 10,
          "a8_ops": 8, "a16_ops": 2, "float_ops": 0, "int8_weight_share": 1.0, "target": {"metric": "cosine",
          "value": 0.999}, "measured": {"cosine": 0.9991}, "estimate": {"cosine": 0.9991}, "status": "met",
          "eval_images": 2}
    (prof / "eval.json").write_text(json.dumps(ev))
    (tool / "toolchain.json").write_text(json.dumps({"ops": {"int8": 5, "int8-a16": 5, "float": 0}, "smooth": {}}))
    (row,) = b.rows(tmp_path)
    assert row["rounding"] == "gptq" and row["stale"]
    (tool / "toolchain.json").write_text(json.dumps({"ops": {"int8": 8, "int8-a16": 2, "float": 0}}))
    (row,) = b.rows(tmp_path)
    assert not row["stale"]
    del ev["settings"]["weight_rounding"]
    (prof / "eval.json").write_text(json.dumps(ev))
    assert b.rows(tmp_path)[0]["rounding"] == "rtn"
