"""The jobs' wrapper (vlsens.core.scripting.run): known noise is counted, not logged; other warnings stay."""

import logging
import warnings
from types import SimpleNamespace

import pytest


class _Named(list):
    """A Snakemake namedlist stand-in: a list with attributes."""


def _sm(tmp_path):
    return SimpleNamespace(rule="probe", log=[str(tmp_path / "job.log")], wildcards={}, threads=1,
                           resources=SimpleNamespace(compute_threads=1), input=_Named(), output=_Named())


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            h.close()
    root.handlers[:], root.level = handlers, level
    logging.captureWarnings(False)


def test_known_noise_is_counted_not_logged(tmp_path, capsys, restore_logging):
    from vlsens.core.scripting import run

    def main(sm):
        for _ in range(3):
            logging.getLogger().warning("Please consider pre-processing before quantization. See https://...")
        warnings.warn("Converting a tensor to a Python list might cause the trace to be incorrect",
                      type("TracerWarning", (UserWarning,), {}), stacklevel=1)
        logging.getLogger("vlsens.probe").warning("a real caveat")

    run(_sm(tmp_path), main)
    log = (tmp_path / "job.log").read_text()
    assert "consider pre-processing before quantization" not in log and "trace to be incorrect" not in log
    assert "a real caveat" in log
    assert ("known-noise warnings not logged: 3 x onnxruntime quantizer: 'consider pre-processing', "
            "1 x torch TracerWarning") in log
    assert "a real caveat" in capsys.readouterr().err  # vlsens' own warnings also reach the console


def test_ctrl_c_in_a_job_is_one_line_not_a_traceback(tmp_path, capsys, restore_logging):
    """Ctrl-C reaches every job of the run: its traceback from deep inside a library was printed on
    the console; now one line and exit status 130 (Snakemake then puts the previous output back)."""
    from vlsens.core.scripting import run

    def main(sm):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        run(_sm(tmp_path), main)
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert err.strip() == "vlsens ERROR [probe]: interrupted (Ctrl-C)" and "Traceback" not in err
