# Two commands do everything on a fresh machine (Debian, root): `make demo` and `make test`.
SHELL := /bin/bash
PYTHON := .venv/bin/python
PYTEST_ARGS ?=
# Unit tests run in parallel (pytest-xdist; auto: one worker per core), integration tests serially.
# worksteal: a worker that runs out takes queued tests from the other (durations range from ms to
# 20 s: the multi-process training tests).
UNIT_WORKERS ?= auto
UNIT_XDIST = -n $(UNIT_WORKERS) --dist worksteal
# pytest's exit 5 means it ran no test. A half whose marker selects nothing is fine only when the
# other half ran tests; no test run at all fails (`make unit` alone: its half must run tests).
CHECK_RAN = if [ $$u -eq 5 ] && [ $$i -eq 5 ]; then echo "make $@: no tests were collected" >&2; exit 1; fi; \
	for rc in $$u $$i; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

.PHONY: setup lock demo test unit integration lint format bench cluster-up cluster-down clean

setup:
	@scripts/setup.sh

## Refresh requirements.lock on purpose to today's newest releases (README: Reproducible installs).
lock:
	@scripts/lock.sh

## The main job: the local cluster, then the CIFAR example on it (2 nodes x 1 task).
demo: setup cluster-up
	$(PYTHON) -m jobs submit examples/cifar.yaml --follow

## The whole suite: unit tests in parallel, then integration tests, one at a time, against the
## real local cluster. pytest's exit 5 (no tests collected) is a failure, never a pass.
test: setup
	@set +e; \
	$(PYTHON) -m pytest -m "not integration" $(UNIT_XDIST) $(PYTEST_ARGS); u=$$?; \
	$(PYTHON) -m pytest -m integration -p no:xdist $(PYTEST_ARGS); i=$$?; \
	$(CHECK_RAN)

unit: setup
	@set +e; \
	$(PYTHON) -m pytest -m "not integration" $(UNIT_XDIST) $(PYTEST_ARGS); u=$$?; i=5; \
	$(CHECK_RAN)

integration: setup
	$(PYTHON) -m pytest -m integration $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	shellcheck sbatch_templates/*.sbatch scripts/*.sh .ci/run

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

bench: setup cluster-up
	$(PYTHON) -m bench

cluster-up: setup
	$(PYTHON) -m cluster up

cluster-down:
	$(PYTHON) -m cluster down

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find jobs cluster train bench tests -name __pycache__ -type d -prune -exec rm -rf {} +
