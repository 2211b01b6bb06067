#!/usr/bin/env bash
# One idempotent set-up for `make demo` and `make test`: Slurm packages (Debian, as root), a
# virtual environment in .venv with a CPU build of torch where no GPU is present, and the project.
# A second run checks and changes nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY_BOOT="${PYTHON_BOOTSTRAP:-python3}"
STAMP="$VENV/.setup-stamp"

log() { printf 'setup: %s\n' "$*"; }

install_system_packages() {
    local need=()
    command -v slurmctld >/dev/null || need+=(slurm-wlm)
    command -v slurmdbd >/dev/null || need+=(slurmdbd)
    command -v munged >/dev/null || need+=(munge)
    command -v mariadbd >/dev/null || need+=(mariadb-server)
    command -v shellcheck >/dev/null || need+=(shellcheck)
    if [ "${#need[@]}" -eq 0 ]; then
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        log "missing ${need[*]}; install them (Debian: apt-get install -y ${need[*]}) to run the local cluster"
        return 0
    fi
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
}

has_gpu() {
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU
}

install_torch() {
    if "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        return 0
    fi
    if has_gpu; then
        log "GPU present: installing torch with CUDA"
        "$VENV/bin/pip" install -q "torch>=2.6"
        return 0
    fi
    # No GPU: a CPU build, never the multi-GB CUDA one. A CPU wheel on local disk first (these
    # machines keep one in their find-links directory; its dependencies come from the index),
    # then PyTorch's CPU index (few retries: it may be unreachable), then the pinned version.
    log "no GPU: installing a CPU build of torch"
    local wheel
    wheel=$(local_cpu_wheel)
    if [ -n "$wheel" ] && "$VENV/bin/pip" install -q "$wheel"; then
        return 0
    fi
    "$VENV/bin/pip" install -q --retries 1 --timeout 15 "torch>=2.6" \
        --index-url https://download.pytorch.org/whl/cpu \
        || "$VENV/bin/pip" install -q "torch==2.13.0"
}

# The newest CPU torch wheel for this interpreter in a find-links directory, or nothing.
local_cpu_wheel() {
    local tag dir
    tag=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
        [ -d "$dir" ] || continue
        find "$dir" -maxdepth 1 -name "torch-*+cpu-${tag}-${tag}-*linux*_$(uname -m).whl"
    done | sort -V | tail -n 1
}

install_system_packages

if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PY_BOOT" -m venv "$VENV"
fi
# Byte-compile the project (only what changed): an editable install does not, and where
# PYTHONDONTWRITEBYTECODE is set, as on these machines, every command would compile jobs/,
# train/ and cluster/ from source again (about 10 ms per CLI call, more for a restarting job).
"$VENV/bin/python" -m compileall -q jobs cluster train bench >/dev/null
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && "$VENV/bin/python" -c 'import torch, cluster, jobs, train' 2>/dev/null; then
    exit 0
fi
install_torch
log "installing the project and its dev tools"
"$VENV/bin/pip" install -q -e ".[dev]"
touch "$STAMP"
log "done"
