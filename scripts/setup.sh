#!/usr/bin/env bash
# One idempotent set-up for `make demo` and `make test`: Slurm packages (Debian, as root), a
# virtual environment in .venv with the exact versions of requirements.lock (hash-checked; a CPU
# build of torch where no GPU is present), and the project itself, editable.
# A second run checks and changes nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY_BOOT="${PYTHON_BOOTSTRAP:-python3}"
STAMP="$VENV/.setup-stamp"
LOCK=requirements.lock

log() { printf 'setup: %s\n' "$*"; }

install_system_packages() {
    local need=()
    command -v slurmctld >/dev/null || need+=(slurm-wlm)
    command -v slurmdbd >/dev/null || need+=(slurmdbd)
    command -v munged >/dev/null || need+=(munge)
    command -v mariadbd >/dev/null || need+=(mariadb-server)
    command -v shellcheck >/dev/null || need+=(shellcheck)
    # the local cluster's login node for --remote (cluster/local/sshd.py), and what jobs --remote uses
    [ -x /usr/sbin/sshd ] || need+=(openssh-server)
    command -v ssh >/dev/null || need+=(openssh-client)
    command -v rsync >/dev/null || need+=(rsync)
    # the test clusters' hosts (cluster up --hosts net: network namespaces, veth, a bridge)
    command -v ip >/dev/null || [ -x /usr/sbin/ip ] || need+=(iproute2)
    # the one-time code of its 2FA alias (keyboard-interactive through PAM: pam_oath)
    compgen -G '/lib/*/security/pam_oath.so' >/dev/null || compgen -G '/usr/lib/*/security/pam_oath.so' >/dev/null || need+=(libpam-oath)
    # A release other than the host's (`make setup SLURM=24.11`, or one of SLURM_RELEASES:
    # `make test` runs the release-sensitive integration tests on 24.11 and 26.05 too) runs in
    # a root file system that `python -m cluster up --slurm` builds with mmdebstrap
    # (cluster/local/release.py).
    case " ${SLURM:-} ${SLURM_RELEASES:-} " in
    *" 24.11 "* | *" 26.05 "*) command -v mmdebstrap >/dev/null || need+=(mmdebstrap) ;;
    esac
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

# The unprivileged user the integration tests submit, follow, cancel, drill and plot as
# (tests/integration/test_as_user.py): on a real cluster the submitter is not root, and root
# keeps only the daemons. Idempotent; only where this runs as root (a user's own machine
# without root needs none of it).
TEST_USER="${SLURM_TRAIN_TEST_USER:-trainee}"
ensure_test_user() {
    if [ "$(id -u)" -ne 0 ] || id -u "$TEST_USER" >/dev/null 2>&1; then
        return 0
    fi
    if ! command -v useradd >/dev/null; then
        log "no useradd: the tests that run as the user $TEST_USER will skip"
        return 0
    fi
    log "creating the unprivileged user $TEST_USER (the integration tests submit as it)"
    useradd --create-home --shell /bin/bash --user-group "$TEST_USER"
}

has_gpu() {
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU
}

# The lock's torch pin, e.g. 2.13.0+cpu.
locked_torch() {
    sed -n 's/^torch==\([^ ]*\).*/\1/p' "$LOCK"
}

# The lock minus its torch entry (the pin, its hashes and its comments).
lock_without_torch() {
    awk '/^[^ ]/ { skip = ($0 ~ /^torch==/) } !skip' "$LOCK"
}

# Where the lock's CPU torch is: a find-links directory that holds the wheel (these machines keep
# it in /opt/wheels), else nothing (PyTorch's CPU index is used). Either way the installer checks
# the wheel against the lock's hash.
cpu_torch_dir() {
    local dir
    for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
        if [ -d "$dir" ] && [ -n "$(find "$dir" -maxdepth 1 -name "torch-$(locked_torch)-*.whl")" ]; then
            echo "$dir"
            return 0
        fi
    done
}

# uv, pinned by requirements/uv.txt (hash-checked), unpacked into $1; fails where pip cannot
# fetch it (no wheel for this platform, no route to the index).
fetch_uv() {
    local dir=$1
    "$PY_BOOT" -m pip download -q --no-deps --only-binary=:all: --require-hashes \
        -r requirements/uv.txt -d "$dir/wheel" >/dev/null 2>&1 || return 1
    "$PY_BOOT" - "$dir" <<'PY' || return 1
import pathlib, sys, zipfile
d = pathlib.Path(sys.argv[1])
(whl,) = (d / "wheel").glob("uv-*.whl")
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/uv"))
    (d / "uv").write_bytes(z.read(name))
(d / "uv").chmod(0o755)
PY
}

# The lock with uv: every wheel fetched and unpacked in parallel, each hash-checked.
install_locked_uv() {
    local uv=$1 dir
    local -a opts=(pip install -q --python "$VENV/bin/python" --require-hashes --no-deps)
    if has_gpu; then
        log "GPU present: installing torch with CUDA, then $LOCK without its torch (uv)"
        "$uv" pip install -q --python "$VENV/bin/python" "torch>=2.6" \
            && "$uv" "${opts[@]}" -r <(lock_without_torch)
        return
    fi
    log "no GPU: installing $LOCK (torch $(locked_torch), uv)"
    dir=$(cpu_torch_dir)
    if [ -n "$dir" ]; then
        opts+=(--find-links "$dir")
    else
        opts+=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
    fi
    "$uv" "${opts[@]}" -r "$LOCK"
}

# The same lock with pip, one wheel after another: where uv cannot be had.
install_locked_pip() {
    "$VENV/bin/python" -m ensurepip --default-pip >/dev/null
    if has_gpu; then
        log "GPU present: installing torch with CUDA, then $LOCK without its torch (pip)"
        "$VENV/bin/python" -m pip install -q --no-compile "torch>=2.6"
        "$VENV/bin/python" -m pip install -q --no-compile --require-hashes --no-deps -r <(lock_without_torch)
        return
    fi
    log "no GPU: installing $LOCK (torch $(locked_torch), pip)"
    local -a source=(--extra-index-url https://download.pytorch.org/whl/cpu)
    [ -n "$(cpu_torch_dir)" ] && source=()
    "$VENV/bin/python" -m pip install -q --no-compile --require-hashes --no-deps -r "$LOCK" "${source[@]}"
}

install_locked() {
    local lock_py venv_py tools
    lock_py=$(sed -n 's/^# This file is autogenerated by pip-compile with Python \([0-9.]*\)$/\1/p' "$LOCK")
    venv_py=$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    if [ "$lock_py" != "$venv_py" ]; then
        log "$LOCK is for Python $lock_py, $VENV has $venv_py (PYTHON_BOOTSTRAP picks the interpreter)"
        return 1
    fi
    tools=$(mktemp -d)
    if fetch_uv "$tools" && install_locked_uv "$tools/uv"; then
        # the project itself with the same tool (editable, the lock's setuptools, no dependencies)
        log "installing the project (editable)"
        "$tools/uv" pip install -q --python "$VENV/bin/python" --no-deps --no-build-isolation -e .
        "$tools/uv" pip check -q --python "$VENV/bin/python"
        rm -rf "$tools"
        return 0
    fi
    rm -rf "$tools"
    log "uv could not be fetched, or its install failed: installing with pip"
    if [ "$CREATED" = 1 ]; then
        # what uv left half-installed in the environment this run created goes
        rm -rf "$VENV"
        "$PY_BOOT" -m venv --without-pip "$VENV"
    fi
    install_locked_pip
    log "installing the project (editable)"
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
    "$VENV/bin/python" -m pip check
}

# The installers leave byte-compiling to us; compileall does it on every core. Needed: where
# PYTHONDONTWRITEBYTECODE is set, as on these machines, nothing else would write the .pyc files,
# and every `import torch` would compile from source. Not compiled: what no run imports (the
# packages' own test suites, torch's internal test helpers, the installers; a fifth of the
# source). A file that does not compile (a package's test data) is skipped, as pip skips it.
compile_environment() {
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    log "byte-compiling $VENV"
    "$VENV/bin/python" -m compileall -q -j 0 \
        -x '/tests?/|/torch/testing/_internal/|/site-packages/(pip|setuptools|_distutils_hack)/' \
        "$site" >/dev/null 2>&1 || true
}

# What the venv was set up from: a change to any of these runs the install again.
stamp_value() {
    cat "$LOCK" requirements/uv.txt pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1
}

# Debian's packages install while the virtual environment does (on a fresh machine each takes
# about a minute); the script waits for both before it says done.
ensure_test_user
install_system_packages &
apt_pid=$!
wait_system_packages() {
    if ! wait "$apt_pid"; then
        log "installing Slurm's packages failed (see above)"
        exit 1
    fi
}

CREATED=0
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    # no pip in it: uv installs (install_locked), pip only where uv cannot be had
    "$PY_BOOT" -m venv --without-pip "$VENV"
    CREATED=1
fi
# Byte-compile the project (only what changed): an editable install does not, and where
# PYTHONDONTWRITEBYTECODE is set, as on these machines, every command would compile jobs/,
# train/ and cluster/ from source again (about 10 ms per CLI call, more for a restarting job).
"$VENV/bin/python" -m compileall -q jobs cluster train bench >/dev/null
if [ "$(cat "$STAMP" 2>/dev/null)" = "$(stamp_value)" ] \
    && "$VENV/bin/python" -c 'import torch, cluster, jobs, train' 2>/dev/null; then
    wait_system_packages
    exit 0
fi
# the lock, then the project itself: editable, nothing more (its dependencies are the lock's),
# built with the lock's setuptools rather than one fetched for an isolated build
install_locked
compile_environment
stamp_value >"$STAMP"
wait_system_packages
log "done"
