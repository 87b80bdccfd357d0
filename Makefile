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
# Sensitivity engine "inc" (Intel Neural Compressor 3.7.1) needs onnx<=1.18 and numpy<2: its own
# virtualenv, built from envs/inc.yaml's pins, only when a config enables it (and for the tests).
INC_VENV  ?= .venv-inc
INC_STAMP := $(INC_VENV)/.vlsens-inc-installed
CONFIG    ?= config/config.yaml

.PHONY: run test test-fast install install-test install-lint inc-env lint bench scale scale-npu scale-int4 report upgrade clean train-tiny

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first, pinned: the CPU wheel of this machine (an unpinned torch pulls several GB of CUDA).
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[genai,peers]"
	touch $@

# ALT_MLD: another ml-dtypes than the pinned one, for tests/test_upgrade.py (a real version
# change: put first on PYTHONPATH by the test only).
ALT_MLD := .venv-alt/ml-dtypes-0.5.4
$(STAMP)-test: $(STAMP)
	$(PIP) install --quiet -c constraints.txt -e ".[test,slurm]"
	$(PIP) install --quiet --no-deps --only-binary=:all: --target $(ALT_MLD) ml-dtypes==0.5.4
	touch $@

$(STAMP)-lint: $(STAMP)
	$(PIP) install --quiet -c constraints.txt -e ".[lint]"
	touch $@

$(INC_STAMP): envs/inc.yaml | $(STAMP)
	rm -rf $(INC_VENV)
	$(PYTHON) -m venv $(INC_VENV)
	$(INC_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(INC_VENV)/bin/python -m pip install --quiet $$($(BIN)/python -m vlsens.sensitivity.inc.env requirements envs/inc.yaml)
	PYTHONPATH=src $(INC_VENV)/bin/python -c "from vlsens.sensitivity.inc.settings import check_environment as c; print(c())"
	touch $@

install: $(STAMP)

install-test: $(STAMP)-test

install-lint: $(STAMP)-lint

inc-env: $(INC_STAMP)

# QUIET: what Snakemake leaves out of the console (rules: the per-job blocks; the job logs under
# results/<model>/logs/ and vlsens' own warnings still say what happened). make run QUIET= shows all.
QUIET ?= rules
run: install
	@if $(BIN)/python -m vlsens.sensitivity.inc.env enabled $(CONFIG); then $(MAKE) --no-print-directory inc-env; fi
	$(BIN)/snakemake --configfile $(CONFIG) --cores $(CORES) --resources gpu=$(GPUS) $(if $(QUIET),--quiet $(QUIET)) $(ARGS)
	@$(BIN)/python -m vlsens.budget --config $(CONFIG)
	@$(BIN)/python -m vlsens.cli recommend --config $(CONFIG)

# make test fails (not skips) when engine inc's environment is missing; test-fast skips it. It
# lists its 30 slowest tests (the suite is to stay within 45 minutes on two cores).
test: install-test inc-env
	VLSENS_REQUIRE_INC=1 $(BIN)/python -m pytest --durations=30 $(ARGS)

# The unit tests: no whole-workflow run through Snakemake's CLI (those are marked slow).
test-fast: install-test
	$(BIN)/python -m pytest -m "not slow" $(ARGS)

# The report of a finished run (its figures and tables are made by `make run`): one HTML file,
# self-contained (figures, tables, rule graph, scripts inline), to open in any browser.
REPORT ?= results/report.html
report: install
	$(BIN)/snakemake --configfile $(CONFIG) --report $(REPORT) --report-stylesheet report/stylesheet.css $(ARGS)

# tests/duplicates.py: pairs of places sharing 6+ lines (the same, or the same but for names and
# values); the counts may only go down.
# rules: 18, all "same shape" pairs of directive tails (log, benchmark, conda, threads, resources),
# which every rule must carry; the measure's and the plan's rules added them (7 before), the
# recommendation's rule one more
lint: $(STAMP)-lint
	$(BIN)/ruff check src tests bench workflow
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint
	$(BIN)/python tests/duplicates.py --max 1 src
	$(BIN)/python tests/duplicates.py --max 18 rules Snakefile

bench: install inc-env
	$(BIN)/python bench/bench_spine.py --publish
	$(BIN)/python bench/bench_sensitivity.py --publish
	$(BIN)/python bench/bench_dynamic.py --publish
	$(BIN)/python bench/bench_profile.py --publish
	$(BIN)/python bench/bench_deploy.py --results results/tiny --tokens 256 --publish   # after make run
	$(BIN)/python bench/bench_int4.py --results results/tiny --exhaustive --publish   # after make run
	$(BIN)/python bench/readme_tables.py   # the README's quoted tables from docs/benchmarks/

# Real size: the whole DAG on the 3b preset (config/scale.yaml), then its per-stage table with
# memory budgets (fails when a job is over its budget). MEM_MB bounds the sum of the running
# jobs' declared memory (cluster.mem_mb of config/scale.yaml).
MEM_MB ?= 20000
scale: install
	$(BIN)/snakemake --configfile config/scale.yaml --cores $(CORES) --resources gpu=$(GPUS) mem_mb=$(MEM_MB) $(ARGS)
	$(BIN)/python bench/scale_table.py results/3b

# The NPU path at 3B widths (config/scale-npu.yaml on top of scale.yaml, results/3b/): the 448x448
# vision tower for quant.target npu, fp32 and fp32-smooth, W8A8 / W8A16 / float profiles, parts and
# the toolchains' files.
scale-npu: install
	$(BIN)/snakemake --configfile config/scale.yaml config/scale-npu.yaml --cores $(CORES) --resources gpu=$(GPUS) mem_mb=$(MEM_MB) $(ARGS)
	$(BIN)/python bench/npu_table.py results/3b

# The 36-layer INT4 decoder (config/scale-int4.yaml, results/3b-full/): the decoder graph, its
# weight-only sensitivity, the int4-mixed profile, the builder's anchors and the deploy folders.
scale-int4: install
	$(BIN)/snakemake --configfile config/scale-int4.yaml --cores $(CORES) --resources gpu=$(GPUS) mem_mb=$(MEM_MB) $(ARGS)
	$(BIN)/python bench/scale_table.py results/3b-full

# After upgrading a library (pip install -U torch, ...): re-run what the new version may change, in
# phases, and nothing downstream of an output that comes out equivalent (docs/reliability.md,
# "Upgrades: early cutoff"). make upgrade ARGS=--check says first what it would cost.
upgrade: install
	$(BIN)/vlsens upgrade --config $(CONFIG) --cores $(CORES) --gpus $(GPUS) $(ARGS)

# The tiny preset's trained weights (src/vlsens/model/presets/trained/tiny/, shipped, so make run does not
# train): the tiny Qwen2.5-VL trained from random init on the visual question task (vlsens.task), with its
# record (training.json: settings, loss curve, accuracy per modality). About 20 minutes on two cores.
train-tiny: install
	$(BIN)/python -m vlsens.task.train $(ARGS)

clean:
	rm -rf results .snakemake
