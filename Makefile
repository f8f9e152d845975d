# Two commands do all the set-up on a fresh machine with Python 3.10-3.13:
#   make local-run   creates .venv, installs, fetches real MNIST, trains jobs/mnist.yaml on this machine
#   make test        the test suite (the same venv and data)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUNNER := $(VENV)/bin/runner
STAMP := $(VENV)/.installed-stamp
JOB ?= jobs/mnist.yaml
PYTEST_ARGS ?=
# Test processes (pytest-xdist): many tests wait on emulated operations, heartbeats and subprocesses, so three share
# two cores better than two. The whole suite on 2 cores (2026-12-05/06): 17 min 10 s with 2, 13 min 50 s to 15 min with
# 3; 4 keep both cores busy all along and gain nothing clear (12 min 38 s once, 15 min 7 s another time): the suite is
# bounded by CPU.
# 0 runs it in this process.
# --dist loadgroup keeps the tests that build and run the image together (xdist_group "containers": one build),
# and those on the Kubernetes rehearsal (xdist_group "kube": one API server).
PYTEST_WORKERS ?= 3
PYTEST_DIST = -n $(PYTEST_WORKERS) --dist loadgroup

include mk/image.mk
include mk/containers.mk
include mk/kube.mk

.PHONY: help install data browser local-run pyc test test-fast faults bench bench-speedup bench-callbacks bench-scale cli-bench lint schema clean

help:  ## show the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# TensorFlow's CPU build on a machine without an NVIDIA GPU, as in the cpu image (docker/requirements.py local).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) docker/requirements.py local --out $(VENV)/requirements
	$(PY) -m pip uninstall --quiet --yes --requirement $(VENV)/requirements/remove.txt
	$(PY) -m pip install --quiet -e '.[dev]' --requirement $(VENV)/requirements/requirements.txt
	$(PY) -m pip install --quiet --no-deps --requirement $(VENV)/requirements/no-deps.txt
	touch $@

install: $(STAMP)  ## create .venv and install the runner, TensorFlow and the test tools

data: $(STAMP)  ## fetch real MNIST into the data cache (once)
	$(PY) -m runner.datasets fetch

# The report's browser test opens the page in headless Chromium (Debian's package). Installed once, as root or
# through sudo; where neither can install it, the test fails in CI (CI=true) and is skipped elsewhere, naming why.
browser:  ## install Chromium (Debian's package) for the report's browser test, if missing
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends chromium; }

local-run: data  ## train the default job on this machine (CPU, or GPU if there is one)
	$(RUNNER) submit $(JOB) --local

# The suite starts a thousand Python processes that import the runner (CLIs, supervisors, trainers, emulated VMs):
# each compiles the modules it imports from source again where nothing writes their bytecode (PYTHONDONTWRITEBYTECODE
# set, as on the machines the suite is timed on). compileall writes it once, whatever that variable says.
pyc: $(STAMP)
	$(PY) -m compileall -q -j 0 runner tpu_emulator faults tests examples scripts

test: data lint browser containers kube test-images pyc  ## lint, then the whole test suite
	$(PY) -m pytest $(PYTEST_DIST) $(PYTEST_ARGS)

test-fast: data pyc  ## the tests without the slow end-to-end ones
	$(PY) -m pytest $(PYTEST_DIST) -m 'not slow' $(PYTEST_ARGS)

faults: data  ## fault-injection suite on the TPU + Cloud Storage emulators; prints one table (FAULTS_ARGS=--only NAME)
	$(PY) -m faults $(FAULTS_ARGS)

bench: data  ## the 'GPU vs TPU' notebook's benchmark on this machine: table + plot in runs/bench-* (BENCH_ARGS=--quick)
	$(RUNNER) bench $(BENCH_ARGS)

bench-speedup: data  ## our trainer vs the notebook's plain model.fit at batch 1024: examples/s ratio and accuracies
	$(PY) scripts/bench_speedup.py $(BENCH_ARGS)

bench-callbacks: data  ## the Dense guide's fit with keras_callbacks() vs without, epochs interleaved: ratio and spread
	$(PY) scripts/bench_callbacks.py $(BENCH_ARGS)

bench-scale: $(STAMP)  ## `runner submit` following 1 to 256 simulated hosts on the emulators: requests, CPU, end->delete
	$(PY) scripts/bench_scale.py $(BENCH_ARGS)

cli-bench: $(STAMP)  ## cold start of `runner --help` and `runner validate` next to the libraries' import cost
	$(PY) scripts/bench_cli.py

lint: $(STAMP) lint-docker  ## ruff, mypy, hadolint, shellcheck
	$(VENV)/bin/ruff check runner tpu_emulator tests faults infra docker scripts
	$(VENV)/bin/ruff format --check runner tpu_emulator tests faults infra docker scripts
	$(VENV)/bin/mypy runner tpu_emulator faults

schema: $(STAMP)  ## write runner.schema.json (editor completion for job files)
	$(RUNNER) schema > runner.schema.json

clean:  ## remove the venv, caches and local runs (not the MNIST cache)
	rm -rf $(VENV) .pytest_cache .ruff_cache runs *.egg-info
