# Two commands do everything on a fresh machine (Debian, root): `make demo` and `make test`.
SHELL := /bin/bash
PYTHON := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup lock demo test unit integration lint format bench cluster-up cluster-down clean

setup:
	@scripts/setup.sh

## Refresh requirements.lock on purpose to today's newest releases (README: Reproducible installs).
lock:
	@scripts/lock.sh

## The main job: the local cluster, then the CIFAR example on it (2 nodes x 1 task).
demo: setup cluster-up
	$(PYTHON) -m jobs submit examples/cifar.yaml --follow

## The whole suite: unit tests, then integration tests against the real local cluster.
## pytest's exit 5 (no tests collected) is a failure, never a pass.
test: setup
	@set +e; $(PYTHON) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests were collected" >&2; exit 1; fi; exit $$rc

unit: setup
	$(PYTHON) -m pytest -m "not integration" $(PYTEST_ARGS)

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
