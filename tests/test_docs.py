"""Every `make` command the README, the docs and the config files document does what it says: the
target exists, and the Snakemake run it starts reads the config the text names (make -n)."""

import re
import subprocess

from conftest import REPO

DOCUMENTED = re.compile(r"(?<![a-z])make ([a-z][a-z0-9-]*)((?: [A-Z_]+=[^\s`)\"]+)*)")
#: The config each target reads when the command names none.
DEFAULT_CONFIG = {"run": "config/config.yaml", "report": "config/config.yaml", "scale": "config/scale.yaml",
                  "scale-int4": "config/scale-int4.yaml"}


def documented() -> set[tuple[str, str]]:
    files = [REPO / "README.md", REPO / "config" / "README.md", *(REPO / "docs").glob("*.md"),
             *(REPO / "config").glob("*.yaml")]
    found = set()
    for f in files:
        for target, variables in DOCUMENTED.findall(f.read_text()):
            found.add((target, variables.strip()))
    return found


def test_every_documented_make_command_uses_the_config_it_names():
    cmds = documented()
    assert ("run", "CONFIG=config/tiny-qwen3vl.yaml") in cmds and ("scale", "") in cmds
    for target, variables in sorted(cmds):
        args = variables.split() if variables else []
        if "CONFIG=..." in args or any(a.startswith("CONFIG=my") for a in args):
            args = [a for a in args if not a.startswith("CONFIG=")] + ["CONFIG=config/tiny-qwen2vl.yaml"]
        r = subprocess.run(["make", "-n", target, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"make -n {target} {variables}: {r.stderr[-500:]}"
        want = next((a.split("=", 1)[1] for a in args if a.startswith("CONFIG=")), DEFAULT_CONFIG.get(target))
        runs = [line for line in r.stdout.splitlines() if "bin/snakemake" in line]
        if target in DEFAULT_CONFIG:
            assert runs and all(f"--configfile {want}" in line for line in runs), (target, variables, runs)
            assert (REPO / want).is_file()


def test_readme_tables_are_the_bench_scripts_output():
    """Every table the README quotes from docs/benchmarks/ (what a bench script wrote) is that
    file's table, character for character (bench/readme_tables.py copies them), and a changed
    number is caught."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_tables", REPO / "bench" / "readme_tables.py")
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)
    readme = (REPO / "README.md").read_text()
    found = rt.quoted(readme)
    assert found, "README.md quotes no benchmark table"
    for file, n, body, table in found:
        assert table, f"{file} has no table {n}"
        assert body == table, f"README.md's copy of {file} table {n} is stale: python bench/readme_tables.py"
    file, n, body, table = found[0]
    changed = readme.replace(body, body.replace("|", "| 9", 1), 1)
    assert any(b != t for _, _, b, t in rt.quoted(changed))
