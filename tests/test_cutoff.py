"""Early cutoff (vlsens.core.outputs.cutoff, vlsens.dag.cutoff): a job's new output is compared with
its previous version by canonical content; which jobs run in the next phase, which are touched,
read from Snakemake's dry runs and the outputs' records."""

from __future__ import annotations

import os

import numpy as np

from vlsens.core.outputs import keep_previous, record_outputs, record_path
from vlsens.dag.cutoff import Graph, Job, classify, estimate, library_changes, parse_dry_run

DRY = """\
Building DAG of jobs...
Job stats:
job        count
-------  -------
export         1
fp16           1
total          2


[Fri Nov 27 10:36:09 2026]
rule export:
    input: results/tiny/checkpoint, results/tiny/vision/224x224/reference.npz
    output: results/tiny/vision/224x224/fp32/model.onnx, results/tiny/vision/224x224/fp32/model.onnx.data
    log: results/tiny/logs/vision/224x224/export.log
    jobid: 4
    benchmark: results/tiny/benchmarks/vision/224x224/export.tsv
    reason: Params have changed since last execution: Union of exclusive params before and now across all output: \
before: {'versions': {'torch': '2.13.0', 'onnx': '1.23.2'}, 'code': 'aa'} now: {'versions': {'torch': '2.14.0', \
'onnx': '1.23.2'}, 'code': 'aa'}
    wildcards: model=tiny, graph=vision/224x224
    resources: tmpdir=/tmp, gpu=0
Shell command: None

[Fri Nov 27 10:36:09 2026]
localrule fp16:
    input: results/tiny/vision/224x224/fp32/model.onnx
    output: results/tiny/vision/224x224/fp16/model.onnx
    jobid: 5
    reason: Input files updated by another job: results/tiny/vision/224x224/fp32/model.onnx
    wildcards: model=tiny, graph=vision/224x224

[Fri Nov 27 10:36:09 2026]
localrule all:
    input: results/tiny/vision/224x224/fp16/model.onnx
    jobid: 0
    reason: Input files updated by another job: results/tiny/vision/224x224/fp16/model.onnx
"""


def test_a_dry_run_is_read_job_by_job_with_its_reasons():
    jobs = parse_dry_run(DRY)
    assert [j.rule for j in jobs] == ["export", "fp16"]  # `all` writes nothing
    export, fp16 = jobs
    assert export.outputs == ["results/tiny/vision/224x224/fp32/model.onnx",
                              "results/tiny/vision/224x224/fp32/model.onnx.data"]
    assert export.inputs[1].endswith("reference.npz") and export.benchmark.endswith("export.tsv")
    assert not export.derived and fp16.derived and export.label == "export vision/224x224"
    assert library_changes(export.reason) == {"torch": ("2.13.0", "2.14.0")}
    assert library_changes(fp16.reason) == {}


def _onnx(path, producer="2.13.0", weight=1.0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((2, 2), weight, dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, producer_name="pytorch", producer_version=producer), str(path))


def _cut(path):
    import json

    return json.loads(record_path(path).read_text()).get("cutoff")


def test_a_rerun_output_records_whether_it_is_equivalent_and_what_was_checked(tmp_path):
    import json

    model, folder = tmp_path / "fp32" / "model.onnx", tmp_path / "deploy" / "int8"
    old = {"versions": {"torch": "2.13.0", "onnx": "1.23.2"}, "code": "aa"}
    new = {"versions": {"torch": "2.14.0", "onnx": "1.23.2"}, "code": "aa"}
    _onnx(model)
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "genai_config.json").write_text('{"seconds": 1.0, "k": 1}')
    record_outputs([model, folder], "export", old)
    assert _cut(model) is None  # the first run: nothing to compare with
    before = model.stat().st_mtime
    keep_previous([([model, folder], [])])
    _onnx(model, producer="2.14.0")  # the new torch writes the same graph under its own name
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "genai_config.json").write_text('{"seconds": 2.5, "k": 1}')  # a timing: volatile
    record_outputs([model, folder], "export", new)
    cut = _cut(model)
    assert cut["equivalent"] is True and cut["differs"] == [] and cut["previous_mtime"] == before
    # the content is the one it held since the first run: a consumer made after that read it
    since = json.loads(record_path(model).read_text())["content_since"]
    assert since == before < model.stat().st_mtime
    assert cut["libraries"] == {"torch": ["2.13.0", "2.14.0"]} and cut["code_changed"] is False
    assert _cut(folder)["equivalent"] is True
    # a changed weight, a changed value: not equivalent, and the file is named
    keep_previous([([model, folder], [])])
    _onnx(model, producer="2.14.0", weight=2.0)
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "genai_config.json").write_text('{"seconds": 2.5, "k": 2}')
    record_outputs([model, folder], "export", new)
    assert _cut(model) == {**_cut(model), "equivalent": False, "differs": ["model.onnx"], "libraries": {}}
    assert json.loads(record_path(model).read_text())["content_since"] == model.stat().st_mtime  # new content
    assert _cut(folder)["differs"] == ["sub/genai_config.json"]


def _made(path, t, since=None):
    """An output written at time ``t``, recorded, holding its content since ``since`` (default:
    ``t``, new content)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(path.name)
    record_outputs([path], "r")
    rec = json.loads(record_path(path).read_text())
    rec["content_since"] = float(t if since is None else since)
    record_path(path).write_text(json.dumps(rec))
    os.utime(path, (t, t))


def _graph(tmp_path):
    """a -> A -> b -> B -> c -> C, and A -> d -> D (d made before A's previous version)."""
    f = {k: str(tmp_path / k) for k in "ABCD"}
    jobs = [Job("a", outputs=[f["A"]]), Job("b", inputs=[f["A"]], outputs=[f["B"]]),
            Job("c", inputs=[f["B"]], outputs=[f["C"]]), Job("d", inputs=[f["A"]], outputs=[f["D"]])]
    return Graph(jobs), f


def test_downstream_of_an_equivalent_output_is_touched_of_a_changed_one_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graph, f = _graph(tmp_path)
    assert graph.order.index(f["A"]) < graph.order.index(f["B"]) < graph.order.index(f["C"])
    _made(tmp_path / "D", 50)  # older than A's previous version: stale before the upgrade
    _made(tmp_path / "B", 200)
    _made(tmp_path / "C", 300)
    _made(tmp_path / "A", 400, since=100)  # rewritten at 400 with the content it held since 100
    state = classify(graph, [])
    assert set(state.touch) == {f["B"], f["C"]} and set(state.stale) == {f["D"]}
    assert state.frontier(graph) == [f["D"]]
    _made(tmp_path / "A", 400)  # new content
    state = classify(graph, [])
    assert set(state.stale) == {f["B"], f["C"], f["D"]} and not state.touch
    assert state.frontier(graph) == sorted([f["B"], f["D"]])  # c waits for b's output
    # a job with reasons of its own (a library it runs changed) runs; what is downstream waits
    own = [Job("b", inputs=[f["A"]], outputs=[f["B"]], reason="Params have changed since last execution"),
           Job("c", inputs=[f["B"]], outputs=[f["C"]], reason=f"Input files updated by another job: {f['B']}")]
    _made(tmp_path / "A", 400, since=100)
    state = classify(graph, own)
    assert state.own == {f["B"]} and state.pending == {f["C"]} and state.frontier(graph) == sorted([f["B"], f["D"]])


def test_the_estimate_reads_the_benchmark_files(tmp_path):
    tsv = tmp_path / "export.tsv"
    tsv.write_text("s\th:m:s\tmax_rss\n12.5\t0:00:12\t300\n")
    jobs = [Job("export", outputs=["x"], benchmark=str(tsv)), Job("fp16", outputs=["y"]),
            Job("simplify", outputs=["z"], benchmark=str(tmp_path / "absent.tsv"))]
    assert estimate(jobs) == (12.5, 2)


def test_touch_dates_outputs_and_benchmark_and_notes_it_without_hashing(tmp_path, monkeypatch):
    import json

    import pytest

    from vlsens.core.errors import VlsensError
    from vlsens.core.outputs import check_output
    from vlsens.dag.cutoff import State, touch

    monkeypatch.chdir(tmp_path)
    graph, f = _graph(tmp_path)
    bench = tmp_path / "b.tsv"
    bench.write_text("s\n1.0\n")
    graph.jobs[f["B"]].benchmark = str(bench)
    for k, t in (("B", 200), ("C", 300)):
        _made(tmp_path / k, t)
    os.utime(bench, (200, 200))
    state = State(touch={f["B"]: [f["A"]], f["C"]: [f["B"]]})
    assert touch(graph, state) == [f["B"], f["C"]]
    assert all(os.stat(p).st_mtime > 1_000_000 for p in (f["B"], f["C"], bench))
    rec = json.loads(record_path(f["B"]).read_text())
    assert rec["touched"]["equivalent_inputs"] == [f["A"]]
    st = os.stat(f["B"])
    assert rec["files"]["B"]["stat"] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]  # no re-hash needed
    assert check_output(f["B"]) == []
    # an output edited since its job wrote it is not dated as up to date: it is named
    (tmp_path / "C").write_text("edited")
    with pytest.raises(VlsensError, match="edited afterwards|truncated afterwards"):
        touch(graph, state)


def test_a_file_read_inside_a_folder_output_is_judged_by_the_folder_record(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    folder, out = tmp_path / "deploy" / "fp32", tmp_path / "measure.json"
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text("{}")
    record_outputs([folder], "deploy")
    rec = json.loads(record_path(folder).read_text())
    rec["content_since"] = 100.0
    record_path(folder).write_text(json.dumps(rec))
    _made(out, 200)
    os.utime(folder / "eval.json", (400, 400))  # rewritten by the deploy job, same content
    jobs = [Job("deploy", outputs=[str(folder)]), Job("measure", inputs=[str(folder / "eval.json")], outputs=[str(out)])]
    graph = Graph(jobs)
    assert graph.parents(str(out)) == [str(folder)]
    assert classify(graph, []).touch == {str(out): [str(folder / "eval.json")]}
    rec["content_since"] = 400.0  # its content changed at 400
    record_path(folder).write_text(json.dumps(rec))
    assert classify(graph, []).stale == {str(out): [str(folder / "eval.json")]}


def test_the_detailed_summary_is_read_job_by_job():
    from vlsens.dag.cutoff import parse_summary

    text = ("Building DAG of jobs...\n"
            "output_file\tdate\trule\tlog-file(s)\tinput-file(s)\tshellcmd\tstatus\tplan\n"
            "r/fp32/model.onnx\tFri\texport\tr/logs/export.log\tr/checkpoint,r/reference.npz\t-\tok\tno update\n"
            "r/fp32/parity.json\tFri\texport\tr/logs/export.log\tr/checkpoint,r/reference.npz\t-\tok\tno update\n"
            "r/checkpoint\tFri\ttiny_checkpoint\tr/logs/ckpt.log\t-\t-\tok\tno update\n")
    jobs = parse_summary(text)
    assert [(j.rule, j.outputs, j.inputs) for j in jobs] == [
        ("export", ["r/fp32/model.onnx", "r/fp32/parity.json"], ["r/checkpoint", "r/reference.npz"]),
        ("tiny_checkpoint", ["r/checkpoint"], [])]
    graph = Graph(jobs)
    assert graph.parents("r/fp32/model.onnx") == ["r/checkpoint"] and graph.order == ["r/checkpoint",
                                                                                       "r/fp32/model.onnx"]
    assert parse_dry_run(DRY)[0].checkpoint is False
    assert parse_dry_run(DRY.replace("rule export:", "checkpoint export:"))[0].checkpoint is True


def test_a_damaged_previous_version_makes_the_output_new_not_the_job_fail(tmp_path):
    import json

    arr = tmp_path / "calib.npz"
    np.savez(arr, x=np.arange(4.0))
    record_outputs([arr], "calibration")
    arr.write_bytes(b"PK\x03\x04 cut short")  # damaged after its job wrote it
    keep_previous([([arr], [])])
    np.savez(arr, x=np.arange(4.0))  # the job writes it anew
    record_outputs([arr], "calibration")
    rec = json.loads(record_path(arr).read_text())
    assert rec["cutoff"]["equivalent"] is False and "could not be read" in rec["cutoff"]["differs"][0]
    assert rec["content_since"] == arr.stat().st_mtime
