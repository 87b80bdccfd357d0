"""The `vlsens` command: `vlsens run CHECKPOINT` writes its config under the run's results, plans what
its goal needs, prints one line a job and ends with the folder to ship."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import REPO


def _vlsens(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "vlsens.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=900, env=env)


def _planned(out: str) -> dict[str, int]:
    """The jobs a run's line ``vlsens: N jobs would run: rule n, ...`` lists."""
    line = next(x for x in out.splitlines() if " would run: " in x or " to run: " in x)
    return {r: int(n) for r, n in (c.rsplit(" ", 1) for c in line.split(": ", 2)[2].split(", "))}


def test_run_plans_the_dag_and_a_dry_run_writes_no_config(tiny_ckpt, tmp_path):
    from vlsens.cli import parser
    from vlsens.cli.run import run_config

    argv = ["run", str(tiny_ckpt), "--sizes", "224x224", "--set", "vision.batch_size=2", "--set",
            "deploy.enabled=false", "--name", "mine", "-n", "--cores", "2"]
    r = _vlsens(*argv, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert run_config(parser().parse_args(argv)) == {
        "model": {"checkpoint": str(tiny_ckpt), "name": "mine"}, "vision": {"sizes": ["224x224"], "batch_size": 2},
        "deploy": {"enabled": False}}
    assert _planned(out)["export"] >= 1 and "deploy" not in _planned(out)
    assert "(not written: nothing runs)" in out
    # -n writes neither run.yaml nor a log under results/ (the DAG build's input manifests aside)
    assert not (tmp_path / "results" / "mine" / "run.yaml").exists()
    assert not (tmp_path / "results" / "mine" / "logs").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".snakemake", "results"]  # no vlsens-<name>.yaml here
    assert f"--snakefile {REPO / 'Snakefile'}" not in out and "Job stats" not in out  # Snakemake's own: not shown
    v = _vlsens("run", tiny_ckpt, "--name", "mine", "-n", "-v", "--set", "deploy.enabled=false", cwd=tmp_path)
    assert v.returncode == 0 and "Job stats" in v.stdout  # -v: Snakemake's own output


def test_a_refused_run_keeps_the_last_runs_config_and_a_new_one_says_what_changed(tmp_path, capsys):
    from vlsens.cli.run import _keep_config, config_text

    config = tmp_path / "results" / "mine" / "run.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(config_text([], {"model": {"checkpoint": "tiny"}, "vision": {"sizes": ["224x224"]}}))
    before = config.read_text()
    r = _vlsens("run", "tiny", "--name", "mine", "--set", "vision.sizes=230x224", "--cores", "1", cwd=tmp_path)
    assert r.returncode != 0 and "Nearest valid sizes" in r.stdout + r.stderr
    assert config.read_text() == before and not (tmp_path / "results" / "mine" / "logs").exists()
    new = {"model": {"checkpoint": "tiny"}, "vision": {"sizes": ["224x336"]}, "goal": "deploy"}
    _keep_config(config, new, config_text([], new))
    said = capsys.readouterr().out
    assert "vision.sizes: ['224x224'] -> ['224x336']" in said and "goal: (unset) -> deploy" in said
    assert yaml.safe_load(config.read_text()) == new


def test_list_keys_take_a_comma_list_or_one_value_and_config_files_stack(tmp_path):
    from vlsens.cli import parser
    from vlsens.cli.run import config_text, run_config

    mine = tmp_path / "mine.yaml"
    mine.write_text("deploy:\n  max_new_tokens: 4\nmodel:\n  name: other\n")
    argv = ["run", "tiny", "--config", str(mine), "--set", "vision.sizes=224x224", "--set",
            "deploy.precisions=fp32,int4-mixed", "--precisions", "fp32", "fp16", "-n", "--dir", str(tmp_path / "run")]
    r = _vlsens(*argv, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "vlsens: other," in r.stdout  # the name the config file gives
    cfg = run_config(parser().parse_args(argv))
    assert cfg["vision"]["sizes"] == ["224x224"] and cfg["deploy"]["precisions"] == ["fp32", "int4-mixed"]
    assert f"and {mine}" in config_text([mine], cfg).splitlines()[0]


@pytest.mark.parametrize("goal, has, lacks", [
    ("npu", {"parts", "parts_calibration", "calibration_tar", "recommend"}, {"deploy", "sensitivity_nbits"}),
    ("analyse", {"sensitivity_gather", "profile", "report_tables"}, {"deploy", "parts", "recommend"}),
])
def test_a_goal_plans_only_what_it_needs(goal, has, lacks, tmp_path):
    r = _vlsens("run", "tiny", "--goal", goal, "-n", "--dir", tmp_path, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    planned = set(_planned(r.stdout))
    assert has <= planned and not lacks & planned, planned


def test_goal_deploy_int4_from_an_own_checkpoint_ends_with_the_folder_to_ship(tiny_ckpt, tmp_path):
    """A new user's first INT4 folder: a copy of a checkpoint (not a preset), run from a folder
    outside the checkout, one command: at most 20 jobs, one line each, the recommendation and its
    path at the end, and nothing written outside the run's folder (its current directory and its
    home stay empty, the checkout unchanged)."""
    ckpt = tmp_path / "Qwen2.5-VL-mine"
    shutil.copytree(tiny_ckpt, ckpt)
    (ckpt / "vlsens_preset.json").unlink()  # nothing says it was a preset: a user's own directory
    cwd, home, run = tmp_path / "cwd", tmp_path / "home", tmp_path / "run"
    cwd.mkdir(), home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env.update(HOME=str(home), VLSENS_CACHE_DIR=str(home / "vlsens-cache"))
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True,
                            text=True).stdout
    dry = _vlsens("run", ckpt, "--goal", "deploy-int4", "--dir", run, "-n", cwd=cwd, env=env)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    planned = _planned(dry.stdout)
    assert sum(planned.values()) <= 20 and planned["deploy"] == 2, planned
    r = _vlsens("run", ckpt, "--goal", "deploy-int4", "--dir", run, "--cores", "2", cwd=cwd, env=env)
    out = r.stdout
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    lines = out.splitlines()
    assert sum(1 for x in lines if x.startswith("[")) == sum(planned.values()) + 1  # one line a job (and `all`)
    rec = json.loads((run / "results" / "Qwen2.5-VL-mine" / "recommend.json").read_text())
    assert [f["folder"] for f in rec["folders"]] == ["fp32", "int4-mixed"]
    ship = rec["devices"]["cpu"]
    assert f"CPU: ship {ship['path']}" in out and (run / ship["path"]).is_dir()
    assert lines[-1].endswith("recommend.md)") and "vlsens: done in" in out
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []
    assert sorted(p.name for p in run.iterdir()) == [".snakemake", "results"]
    assert subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True,
                          text=True).stdout == status
    # --strict: a target the int4 folder cannot meet end to end is a failing exit code, said at the end
    s = _vlsens("run", ckpt, "--goal", "deploy-int4", "--dir", run, "--cores", "2", "--strict", "--set",
                "text.profile.target=1e-12", cwd=cwd, env=env)
    assert s.returncode == 3 and "target(s) missed" in s.stdout and "int4-mixed" in s.stdout, s.stdout[-3000:]


def test_bad_input_is_one_line(tmp_path):
    r = _vlsens("run", tmp_path / "nope", "-n", cwd=tmp_path)
    lines = [x for x in r.stdout.splitlines() if "model.checkpoint" in x]
    assert r.returncode != 0 and lines and lines[0].startswith("vlsens: invalid configuration: model.checkpoint")
    assert "WorkflowError" not in r.stdout and "File \"" not in r.stdout
    r = _vlsens("run", "tiny", "--set", "novalue", "-n", cwd=tmp_path)
    assert r.returncode != 0 and "expected key=value" in r.stderr
    # a path through a value, an empty key part, a value that is no YAML: one line each, no traceback
    for item, says in (("model.checkpoint.x=1", "model.checkpoint is already the value 'tiny'"),
                       ("vision..sizes=1", "has an empty part"), ("threads=[1", "the value is not YAML")):
        r = _vlsens("run", "tiny", "--set", item, "-n", cwd=tmp_path)
        assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = _vlsens("run", "tiny", "--goal", "deploy-int4", "--precisions", "fp16", "-n", cwd=tmp_path)
    assert r.returncode != 0 and "use --goal deploy --precisions" in r.stderr
    r = _vlsens("run", "tiny", "--config", tmp_path / "none.yaml", "-n", cwd=tmp_path)
    assert r.returncode != 0 and "none.yaml: no such file" in r.stderr
    r = _vlsens("records", tmp_path / "nope", cwd=tmp_path)
    assert r.returncode == 2 and "no such folder" in r.stderr
    r = _vlsens("recommend", tmp_path, cwd=tmp_path)  # a folder with no run to ship: said, not an error
    assert r.returncode == 0 and "no recommend.json" in r.stdout
    r = _vlsens("recommend", tmp_path / "nope", cwd=tmp_path)
    assert r.returncode == 2 and "no such folder" in r.stderr


def test_version_and_every_flag_has_help(tmp_path):
    from vlsens import __version__
    from vlsens.cli import parser

    r = _vlsens("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"vlsens {__version__}"
    ap = parser()
    subs = next(a for a in ap._actions if a.dest == "command").choices
    for name, sub in subs.items():
        for a in sub._actions:
            assert a.help, f"vlsens {name} {a.option_strings or a.dest}: no help"


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_check_seconds_takes_a_finite_number(value, capsys):
    from vlsens.cli import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["upgrade", "--check-seconds", value])
    assert f"{value} is not a number of seconds" in capsys.readouterr().err
    assert parser().parse_args(["upgrade", "--check-seconds", "12.5"]).check_seconds == 12.5


def test_upgrade_in_a_folder_holding_no_run_says_so_and_builds_nothing(tmp_path):
    r = _vlsens("upgrade", "--check", "--cores", "1", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "holds no run of this config" in r.stderr and "vlsens run" in r.stderr
    # no job ran (the DAG build's own input manifests are another matter)
    assert not list(tmp_path.glob("results/*/checkpoint")) and not list(tmp_path.rglob("*.onnx"))


def test_a_stale_lock_is_named_with_the_way_out(tmp_path):
    from vlsens.cli import parser
    from vlsens.cli.progress import Progress
    from vlsens.cli.run import snakemake_command

    p = Progress()
    out = [o for line in ("LockException:", "Error: Directory cannot be locked. Please make sure that no other "
                          "Snakemake process is trying to create the same files in the following directory:",
                          str(tmp_path), "If you are sure that no other instances of snakemake are running on this "
                          "directory, the remaining lock was likely caused by a kill signal or a power loss. It can "
                          "be removed with the --unlock argument.") for o in p.feed(line)]
    assert out == [o for o in out if "--unlock" in o] and len(out) == 1 and "locked" in out[0]
    assert p.closing(1, tmp_path / "log") == [f"vlsens: the run failed; Snakemake's output: {tmp_path / 'log'}"]
    args = parser().parse_args(["run", "tiny", "--unlock"])
    assert snakemake_command(args, REPO, tmp_path, [], [])[-1] == "--unlock"


def test_progress_reads_snakemake_lines():
    from vlsens.cli.progress import Progress

    p = Progress()
    lines = ["Job stats:", "job      count", "-----  -------", "export       2", "all          1", "total        3", "",
             "[Fri Nov 27 04:11:06 2026]", "rule export:", "    output: results/x/vision/224x224/fp32", "    jobid: 4",
             "    wildcards: model=x, graph=vision/224x224, variant=fp32", "vlsens WARNING [export]: something",
             "Finished jobid: 4 (Rule: export)", "1 of 3 steps (33%) done",
             "Error in rule export:", "    message: None", "    jobid: 5",
             "    log: results/x/logs/vision/224x336/export-fp32.log (check log file(s) for error details)",
             'WorkflowError in file "/w/rules/common.smk", line 99:', "invalid configuration: threads: 0 is bad",
             '  File "/w/rules/common.smk", line 99, in <module>']
    out = [o for line in lines for o in p.feed(line)]
    assert out[0] == "vlsens: 3 jobs to run: export 2"
    assert out[1] == "vlsens WARNING [export]: something"
    assert out[2].startswith("[1/3] export vision/224x224 fp32 (") and "left" in out[2]
    assert out[3] == "vlsens: job export failed; its log: results/x/logs/vision/224x336/export-fp32.log"
    assert out[4] == "vlsens: invalid configuration: threads: 0 is bad" and len(out) == 5
