#!/usr/bin/env bash
# `make lock`: refreshes requirements.lock, on purpose, to today's newest releases within
# pyproject.toml's ranges (every extra), with pip-tools (pip-compile) in a throwaway venv.
# pip-compile resolves with pip's own finder and pip's configuration, so it sees the CPU torch
# wheel in find-links (/opt/wheels on these machines), pinned by requirements/lock-input.txt.
set -euo pipefail

cd "$(dirname "$0")/.."
PY_BOOT="${PYTHON_BOOTSTRAP:-python3}"
# The lock tool itself is pinned: a new pip-tools may write the file differently.
TOOLS="${LOCK_TOOLS:-pip==26.3 pip-tools==7.6.2}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY_BOOT" -m venv "$tmp/venv"
# shellcheck disable=SC2086  # TOOLS is a list of requirements
"$tmp/venv/bin/pip" install -q $TOOLS
CUSTOM_COMPILE_COMMAND="make lock" "$tmp/venv/bin/pip-compile" --quiet --upgrade \
    --all-extras --strip-extras --generate-hashes --allow-unsafe \
    --no-emit-index-url --no-emit-find-links \
    --constraint requirements/lock-input.txt \
    --output-file "$tmp/requirements.lock" pyproject.toml
# The CPU-torch rule: a lock that would download CUDA wheels is not written.
if grep -Ein '^(nvidia|cuda|triton)' "$tmp/requirements.lock"; then
    echo "make lock: the resolver picked CUDA packages (above); requirements.lock is unchanged" >&2
    exit 1
fi
mv "$tmp/requirements.lock" requirements.lock
echo "make lock: requirements.lock has $(grep -c '^[A-Za-z0-9]' requirements.lock) pinned packages"
