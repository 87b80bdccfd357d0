"""What a benchmark script prints is also written to ``docs/benchmarks/<name>.md`` (with
``--publish``; else under ``results/``), under the command that produced it, the date, the
machine and the library versions: the documentation's numbers are the script's own output, never
copies.

    with published("profile-held-out", "Profiles of held-out checkpoints"):
        main()
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
LIBRARIES = ("torch", "transformers", "onnx", "onnxruntime", "onnxruntime-genai", "numpy")


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}"


def versions() -> str:
    from importlib import metadata

    out = []
    for name in LIBRARIES:
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def named(base: str, option: str = "--towers", argv: list[str] | None = None) -> str:
    """``base``, or ``base-<values>`` when the command line gives ``option`` (e.g. ``--towers 3b``
    publishes ``sensitivity-3b``), so a run on other towers does not overwrite the default table."""
    argv = sys.argv[1:] if argv is None else argv
    if option not in argv:
        return base
    values = []
    for a in argv[argv.index(option) + 1:]:
        if a.startswith("-"):
            break
        values.append(a)
    return "-".join([base, *values])


def destination(results: str | Path | None = None, argv: list[str] | None = None) -> Path:
    """Where a table goes: ``docs/benchmarks/`` with ``--publish`` on the command line, else under
    the results (``<results>/bench/`` for a script about one run, ``results/bench/`` otherwise), so a
    user's run never writes into the repository."""
    argv = sys.argv[1:] if argv is None else argv
    if "--publish" in argv:
        return DOCS
    return Path(results) / "bench" if results else DOCS.parents[1] / "results" / "bench"


@contextlib.contextmanager
def published(name: str, title: str, folder: Path | None = None, results: str | Path | None = None):
    """Print as usual and, when the block finishes without an error, write what was printed to
    ``folder/<name>.md`` (default :func:`destination`; a failed run leaves the previous file alone)."""
    folder = destination(results) if folder is None else folder
    buf = io.StringIO()
    old = sys.stdout
    sys.stdout = _Tee(old, buf)
    try:
        yield
    finally:
        sys.stdout = old
    folder.mkdir(parents=True, exist_ok=True)
    cmd = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    text = (f"# {title}\n\n"
            f"Written by `{cmd}` on {datetime.date.today().isoformat()}.\n"
            f"Machine: {machine()}. Libraries: {versions()}.\n\n"
            f"{buf.getvalue().strip()}\n")
    tmp = folder / f".{name}.md.tmp"
    tmp.write_text(text)
    tmp.replace(folder / f"{name}.md")
    print(f"(written to {os.path.relpath(folder / f'{name}.md')})", file=sys.stderr)
