# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORES  ?= $(shell nproc 2>/dev/null || echo 2)
GPUS   ?= 1
# Extra arguments for snakemake / pytest, e.g. make run ARGS="-n" or make test ARGS="-k export".
ARGS   ?=
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.vlsens-installed

.PHONY: run test install install-test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first, pinned: the CPU wheel of this machine (an unpinned torch pulls several GB of CUDA).
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e .
	touch $@

$(STAMP)-test: $(STAMP)
	$(PIP) install --quiet -c constraints.txt -e ".[test,slurm]"
	touch $@

install: $(STAMP)

install-test: $(STAMP)-test

run: install
	$(BIN)/snakemake --cores $(CORES) --resources gpu=$(GPUS) $(ARGS)

test: install-test
	$(BIN)/python -m pytest $(ARGS)

lint: install
	$(BIN)/snakemake --lint

bench: install
	$(BIN)/python bench/bench_spine.py
	$(BIN)/python bench/bench_sensitivity.py

clean:
	rm -rf results .snakemake
