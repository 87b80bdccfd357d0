"""Every file a job writes is recorded (size, SHA-256, stat key); its readers and the DAG build
check it: an edit with the mtime kept, a truncation, a file gone from or added to a folder are
found and named with the command that rebuilds them; a touch or a copy is not a change."""

import os

import pytest

from vlsens.core.errors import VlsensError
from vlsens.core.outputs import (
    check_output,
    check_run,
    forced_from_argv,
    record_outputs,
    record_path,
    refusal,
    verify_paths,
)


@pytest.fixture
def outputs(tmp_path):
    run = tmp_path / "results" / "tiny"
    csv = run / "sensitivity" / "ort.csv"
    folder = run / "deploy" / "int4"
    model = run / "vision" / "fp32" / "model.onnx"
    for p in (csv, folder / "genai_config.json", folder / "sub" / "vision.onnx", model):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(64) if p.suffix == ".onnx" else b"op,score\n/a,0.1\n/b,0.2\n")
    (model.with_name("model.onnx.data")).write_bytes(os.urandom(1000))
    assert record_outputs([csv], "sensitivity_gather") == 1
    assert record_outputs([folder], "deploy") == 2
    assert record_outputs([model, model.with_name("model.onnx.data")], "export") == 2
    (folder / ".snakemake_timestamp").write_text("")  # Snakemake's own, after the job: not a change
    return {"run": run, "csv": csv, "folder": folder, "model": model, "data": model.with_name("model.onnx.data")}


def _keep_mtime(path, change):
    st = path.stat()
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_records_sit_beside_the_outputs_not_in_a_shipped_folder(outputs):
    assert record_path(outputs["csv"]).is_file() and record_path(outputs["folder"]).parent.name == ".vlsens"
    assert not (outputs["folder"] / ".vlsens").exists()
    assert check_run(outputs["run"]) == {} and verify_paths([outputs["csv"], outputs["folder"]]) == 2


def test_an_edit_with_its_mtime_kept_is_found_a_touch_is_not(outputs):
    csv = outputs["csv"]
    os.utime(csv)  # a touch: another stat key, the same bytes
    assert check_output(csv, update=True) == []
    _keep_mtime(csv, lambda p: p.write_bytes(p.read_bytes().replace(b"0.1", b"0.9")))  # same size, mtime kept
    problems = check_output(csv)
    assert len(problems) == 1 and problems[0].startswith(f"{csv}: ")
    assert "as rule sensitivity_gather wrote it: edited afterwards" in problems[0]
    assert problems[0].endswith(f"snakemake --forcerun {csv}")
    with pytest.raises(VlsensError, match="edited afterwards"):
        verify_paths([csv])


def test_a_damaged_folder_is_named_file_by_file(outputs):
    folder = outputs["folder"]
    _keep_mtime(folder / "sub" / "vision.onnx", lambda p: p.write_bytes(p.read_bytes()[:10]))
    (folder / "genai_config.json").unlink()
    (folder / "extra.txt").write_text("added")
    problems = check_output(folder)
    assert any(f"{folder / 'sub' / 'vision.onnx'}: 10 bytes" in p and "truncated afterwards" in p for p in problems)
    assert any(f"{folder / 'genai_config.json'}: missing" in p for p in problems)
    assert any(f"{folder / 'extra.txt'}: not in" in p for p in problems)
    assert len(problems) == 3


def test_the_run_refuses_what_it_does_not_rebuild(outputs):
    data, model, csv = outputs["data"], outputs["model"], outputs["csv"]
    _keep_mtime(data, lambda p: p.write_bytes(p.read_bytes()[:500]))
    changed = check_run(outputs["run"])
    assert list(changed) == [data] and changed[data][0] == "export"
    msg = refusal(changed)
    assert "1 output(s) of earlier jobs changed" in msg and "truncated afterwards" in msg
    assert msg.endswith(f"snakemake --forcerun {model}")  # the model folder by its graph, as Snakemake knows it
    # forcing the job (any of its outputs, or its rule), or everything, lets the run rebuild it
    assert refusal(changed, [str(model)]) is None and refusal(changed, ["export"]) is None
    assert refusal(changed, forceall=True) is None and refusal(changed, [str(csv)]) is not None


def test_forcerun_and_forceall_are_read_from_the_command_line():
    assert forced_from_argv(["--cores", "2", "--forcerun", "a/model.onnx", "export", "-n"]) == (
        ["a/model.onnx", "export"], False)
    assert forced_from_argv(["-R", "x", "--quiet", "rules"]) == (["x"], False)
    assert forced_from_argv(["--forcerun=x", "y", "-F"]) == (["x", "y"], True)


def test_vlsens_records_checks_the_files_jobs_wrote(outputs):
    """``vlsens records`` checks every recorded output as well as the JSON records."""
    import subprocess
    import sys

    from conftest import REPO

    def cli():
        return subprocess.run([sys.executable, "-m", "vlsens.core.records", str(outputs["run"])], capture_output=True,
                              text=True, cwd=REPO)

    (outputs["run"] / "vision" / "fp32" / "parity.json").write_text("{}")  # a record, so the folder is a run
    r = cli()
    assert "4 recorded outputs" in r.stdout and "vision/fp32/parity.json: <record>" in r.stdout  # the empty record
    assert "afterwards" not in r.stdout
    _keep_mtime(outputs["csv"], lambda p: p.write_bytes(p.read_bytes()[:5]))
    r = cli()
    assert r.returncode == 1 and f"{outputs['csv']}: 5 bytes" in r.stdout and "truncated afterwards" in r.stdout


def test_a_job_forgets_the_records_of_what_it_writes_anew(outputs):
    """A job re-running writes its outputs anew: their earlier records go first, so that what it
    reads back while it runs (a folder it measures) is not checked against its old version."""
    from vlsens.core.outputs import forget

    folder = outputs["folder"]
    (folder / "genai_config.json").write_text('{"new": true}')
    assert check_output(folder)  # the old record would call the new folder edited
    forget([folder])
    assert not record_path(folder).exists() and check_output(folder) == []


def test_a_failed_job_leaves_the_previous_output_in_place_dated_so_it_runs_again(outputs):
    from vlsens.core.outputs import drop_previous, keep_previous, previous_path, restore_previous

    run, folder, csv = outputs["run"], outputs["folder"], outputs["csv"]
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    inp = run / "calib" / "input.npz"
    inp.parent.mkdir(parents=True)
    inp.write_bytes(b"x")
    os.utime(inp, (1_700_000_000, 1_700_000_000))
    # the run starts: both jobs' outputs (a folder, a file) move aside with their records, no copy
    moved = keep_previous([([folder], [inp]), ([csv], [inp]), ([run / "absent.csv"], [inp])])
    assert moved == [folder, csv]
    assert not folder.exists() and not record_path(folder).exists() and previous_path(folder).is_dir()
    # the csv's job completes: its previous version goes; the folder's job fails (nothing written)
    csv.write_text("op,score\n/a,0.3\n")
    drop_previous([csv])
    assert not previous_path(csv).exists()
    assert restore_previous(run) == [folder]
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert record_path(folder).is_file()
    assert not previous_path(folder).parent.exists()  # nothing left aside, not even the folder
    # dated just before its job's oldest input: Snakemake's mtime trigger runs the job again
    assert folder.stat().st_mtime < inp.stat().st_mtime
    assert all(p.stat().st_mtime < inp.stat().st_mtime for p in folder.rglob("*"))
    # the content is what its record says (re-hashed once, as the stat keys changed)
    assert check_output(folder) == [] and check_output(csv) == []
    assert restore_previous(run) == []  # nothing left to restore


def test_a_previous_version_whose_output_was_rebuilt_is_dropped_not_restored(outputs):
    from vlsens.core.outputs import keep_previous, previous_path, restore_previous

    csv = outputs["csv"]
    keep_previous([([csv], [])])
    csv.write_text("new\n")  # written, but the job was killed before it dropped the old one
    assert restore_previous(outputs["run"]) == []
    assert csv.read_text() == "new\n" and not previous_path(csv).exists()


@pytest.mark.parametrize("damage", [b"{\"rule\": \"deploy\", \"fi", b"[]", b"\xff\xfe", b'{"files": {"a": 1}}'])
def test_a_damaged_record_is_a_problem_not_a_pass(outputs, damage):
    csv = outputs["csv"]
    record_path(csv).write_bytes(damage)
    problems = check_output(csv)
    assert len(problems) == 1 and "is damaged" in problems[0] and "--forcerun" in problems[0], problems
    assert refusal(check_run(outputs["run"])) is not None
    with pytest.raises(VlsensError, match="damaged"):
        verify_paths([csv])
