# Two commands do everything on a fresh machine (Debian, root): `make demo` and `make test`.
SHELL := /bin/bash
PYTHON := .venv/bin/python
PYTEST_ARGS ?=
# Both halves run in parallel (pytest-xdist). worksteal: a worker that runs out takes queued tests
# from another (durations range from ms to a minute).
# Unit tests: two workers per core; about half of their time is waiting (time-outs of the hang and
# stop tests, child processes), so one per core left the cores idle (124 s vs 108 s here).
UNIT_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))
UNIT_XDIST = -n $(UNIT_WORKERS) --dist worksteal
# The unit half does not collect tests/integration at all (every test there is marked integration;
# importing its modules cost each unit worker about a second).
UNIT_SELECT = -m "not integration" --ignore=tests/integration
# Integration tests: each worker has a Slurm cluster of its own, started afresh for the session
# (tests/conftest.py: /var/tmp/slurm-train-test-N on ports shifted by (N+2) x 100), so one test's
# preemptions and dead nodes never reach another's jobs; most of their time is waiting on Slurm.
# load, one test at a time: tests are handed out in collection order, the long ones first
# (tests/integration/conftest.py), to whichever worker is free.
IT_WORKERS ?= 4
IT_XDIST = -n $(IT_WORKERS) --dist load --maxschedchunk=1
# The slowest tests of each half, in every run's output.
DURATIONS = --durations=15
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
	$(PYTHON) -m pytest $(UNIT_SELECT) $(UNIT_XDIST) $(DURATIONS) $(PYTEST_ARGS); u=$$?; \
	$(PYTHON) -m pytest -m integration $(IT_XDIST) $(DURATIONS) $(PYTEST_ARGS); i=$$?; \
	$(CHECK_RAN)

unit: setup
	@set +e; \
	$(PYTHON) -m pytest $(UNIT_SELECT) $(UNIT_XDIST) $(DURATIONS) $(PYTEST_ARGS); u=$$?; i=5; \
	$(CHECK_RAN)

integration: setup
	$(PYTHON) -m pytest -m integration $(IT_XDIST) $(DURATIONS) $(PYTEST_ARGS)

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

## Stops the default cluster and the test workers' own (make test leaves them up for the next run).
cluster-down:
	$(PYTHON) -m cluster down
	@for d in /var/tmp/slurm-train-test-*; do \
		[ -d "$$d" ] || continue; n=$${d##*-test-}; \
		$(PYTHON) -m cluster --state-dir "$$d" --port-offset $$((100 * (n + 2))) down; \
	done

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find jobs cluster train bench tests -name __pycache__ -type d -prune -exec rm -rf {} +
