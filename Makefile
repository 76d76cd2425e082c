# thinwire: two commands.
#   make repro   set up .venv (if needed) and run every pipeline at CPU scale (dvc repro)
#   make test    set up .venv (if needed), lint, type-check and run the test suite
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Nothing is sent anywhere: DVC analytics and MLflow telemetry off.
export DVC_NO_ANALYTICS := 1
export ITERATIVE_DO_NOT_TRACK := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export HF_HUB_OFFLINE := 1
# DVC stages call `python`, `torchrun` and `dvc`: the venv's.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup style test lint repro mlflow mlflow-ui clean-results

setup: $(STAMP)

# pip finds the pinned torch wheels on local disk; its "Location ... is ignored" warnings about
# missing local index folders are noise and filtered out. pip byte-compiles what it installs on one
# core (114 s of a 275 s install here); compileall does it on every core after (70 s on 2). Like pip's
# own step it passes over files that do not compile (some packages ship Python 2 examples).
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -r requirements.txt 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
	$(PY) -m pip install -q --no-compile --no-deps --no-build-isolation -e . 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	$(PY) -m compileall -q -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	$(PY) -c "import torch, torchvision, triton, mlflow, dvc, transformers"
	touch $@

LINTED := common trainer kernels harness papers pipelines tests benchmarks examples
TYPED := common trainer kernels harness papers pipelines

style: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

lint: style
	$(VENV)/bin/mypy $(TYPED)

# mypy (about 90 s of one core from a cold cache) type-checks while pytest runs; its report follows
# pytest's, and either failing fails the target. The background mypy is stopped on every exit.
# pytest runs on 2 xdist workers, grouped and ordered by tests/conftest.py (a module's tests on one
# worker); a plain `pytest` runs in one process.
test: style
	log=$$(mktemp); \
	$(VENV)/bin/mypy $(TYPED) > "$$log" 2>&1 & mypy_pid=$$!; \
	trap 'kill $$mypy_pid 2>/dev/null || true; rm -f "$$log"' EXIT; \
	tests=0; $(PY) -m pytest -n 2 || tests=$$?; \
	typed=0; wait $$mypy_pid || typed=$$?; \
	echo "mypy $(TYPED):"; cat "$$log"; \
	test $$tests -eq 0 -a $$typed -eq 0

repro: $(STAMP)
	$(VENV)/bin/dvc config core.analytics false
	$(VENV)/bin/dvc repro --allow-missing

# Load every committed run (results/) into the local MLflow store and check that every run id the
# summary quotes is there; then: make mlflow-ui (see README).
mlflow: $(STAMP)
	$(PY) -m pipelines.mlflow_import --verify results/summary.md

# The MLflow UI on that store, opening in the model-training view: http://127.0.0.1:5000
mlflow-ui: $(STAMP)
	$(PY) -m pipelines.mlflow_ui
