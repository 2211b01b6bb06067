# Two commands do everything on a fresh machine (Debian, root): `make demo` and `make test`.
SHELL := /bin/bash
PYTHON := .venv/bin/python
PYTEST_ARGS ?=
# The Slurm release of the local clusters (22.05, the host's package, when empty; 24.11 or 26.05
# run in a root file system built once with mmdebstrap): `make test SLURM=24.11`,
# `make cluster-up SLURM=26.05`. Passed to the tests as SLURM_TRAIN_TEST_SLURM (tests/conftest.py)
# and to the set-up (which installs mmdebstrap only for a release other than the host's).
SLURM ?=
ifneq ($(SLURM),)
export SLURM_TRAIN_TEST_SLURM := $(SLURM)
endif
# The releases `make test` and `make integration` run (scripts/test.sh): the whole suite on
# SLURM_TRAIN_TEST_SLURM's (22.05 by default), then the whole integration half on each other one
# named here, one after another (`make test SLURM_RELEASES=none`: the one release alone). The
# set-up installs mmdebstrap for them.
test integration: export SLURM_RELEASES ?= 22.05 24.11 26.05
# The suite's two halves, their workers (pytest-xdist) and the order they run in live in
# scripts/test.sh: `make test` runs them side by side (the integration half waits on Slurm for
# about a fifth of its time), `make unit` / `make integration` one of them. pytest's exit 5 (no
# test collected) is a failure unless the other half ran tests. PYTEST_ARGS go to both.

.PHONY: setup lock demo test unit integration lint format bench cluster-up cluster-down clean

setup:
	@SLURM=$(SLURM) scripts/setup.sh

## Refresh requirements.lock on purpose to today's newest releases (README: Reproducible installs).
lock:
	@scripts/lock.sh

## The main job: the local cluster, then the CIFAR example on it (2 nodes x 1 task).
demo: setup cluster-up
	$(PYTHON) -m jobs submit examples/cifar.yaml --follow

## The whole suite: the unit half (in parallel) and, at the same time, the integration half
## against real local clusters (scripts/test.sh).
test: setup
	@scripts/test.sh all $(PYTEST_ARGS)

unit: setup
	@scripts/test.sh unit $(PYTEST_ARGS)

integration: setup
	@scripts/test.sh integration $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	shellcheck sbatch_templates/*.sbatch scripts/*.sh .ci/run train/command/bin/scontrol

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

bench: setup cluster-up
	$(PYTHON) -m bench

cluster-up: setup
	$(PYTHON) -m cluster up $(if $(SLURM),--slurm $(SLURM))

## Stops the default cluster, the other releases' and the test workers' own (make test leaves
## them up for the next run).
cluster-down:
	$(PYTHON) -m cluster down
	@for d in /var/tmp/slurm-train-cluster-*; do \
		[ -d "$$d" ] || continue; $(PYTHON) -m cluster --slurm "$${d##*-cluster-}" down; \
	done
	@for d in /var/tmp/slurm-train-test-*; do \
		[ -d "$$d" ] || continue; n=$${d##*-test-}; \
		$(PYTHON) -m cluster --state-dir "$$d" --port-offset $$((100 * (n + 2))) down; \
	done

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find jobs cluster train bench tests -name __pycache__ -type d -prune -exec rm -rf {} +
