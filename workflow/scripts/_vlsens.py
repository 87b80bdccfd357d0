"""Imported first by every script: makes ``src/vlsens`` importable where the package is not
installed (e.g. a conda env built from envs/*.yaml). Snakemake puts this folder on sys.path."""
import sys
from pathlib import Path

_SRC = str(Path(__file__).resolve().parents[2] / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
