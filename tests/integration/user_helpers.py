"""Running the tool as an unprivileged user (``trainee``, made by ``scripts/setup.sh``): the
integration tests test_as_user.py and test_user_install.py.

Every command runs through ``runuser`` in a clean environment (``env -i``), on the cluster's
login host where its nodes are hosts of their own (``--hosts net``): a HOME of the test's own,
a PATH with the user's venv first, the cluster's ``SLURM_CONF`` and the few variables a test
passes on purpose; nothing else of root's environment reaches it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

USER = os.environ.get("SLURM_TRAIN_TEST_USER", "trainee")
SYSTEM_PYTHON = Path("/usr/bin/python3")
# The variables a user's shell would have that matter here (the rest of root's stay out).
PASSED = (
    "SLURM_CONF",
    "SLURM_TRAIN_CLUSTER_DIR",
    "SLURM_TRAIN_CLUSTER_PORT_OFFSET",
    "PYTHONPATH",
    "TRAIN_TEST_STEP_S",
    "TRAIN_TEST_PACE_FILE",
)


def skip_reason() -> str | None:
    """Why the user's tests cannot run here, or None."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no user {USER!r} (scripts/setup.sh creates it when run as root)"
    if shutil.which("runuser") is None:
        return "runuser is not installed (util-linux)"
    if not SYSTEM_PYTHON.exists():
        return f"{SYSTEM_PYTHON} is missing: the user's venv is made from it"
    probe = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if probe.stdout.strip() != str(sys.version_info[:2]):
        return f"{SYSTEM_PYTHON} is not Python {sys.version_info[:2]}"
    return None


def user_dir(path: Path) -> Path:
    """``path``, made afresh and owned by the user (0755: root's test reads what it writes)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o755, parents=True)
    shutil.chown(path, USER, USER)
    return path


def uid() -> int:
    return pwd.getpwnam(USER).pw_uid


def run_as_user(
    argv: list[str],
    *,
    home: Path,
    cwd: Path,
    venv: Path,
    env: Mapping[str, str],
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``argv`` as the user in ``cwd``, its venv's ``bin`` first on PATH; of ``env`` only
    :data:`PASSED` goes through."""
    keep = [f"{k}={env[k]}" for k in PASSED if k in env]
    path = f"{venv / 'bin'}:/usr/bin:/bin"
    cmd = ["runuser", "-u", USER, "--", "env", "-i", f"HOME={home}", f"PATH={path}"]
    cmd += ["LANG=C.UTF-8", *keep, *argv]
    return subprocess.run(
        on_login_host(cmd, cwd, env), cwd=cwd, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def on_login_host(cmd: list[str], cwd: Path, env: Mapping[str, str]) -> list[str]:
    """``cmd`` on the login host of the cluster ``env`` names where its nodes are hosts of
    their own (``--hosts net``: as a user of a real cluster submits, from a host that runs no
    slurmd), else as it is (on this machine)."""
    from cluster.local.hosts import LOGIN
    from cluster.local.manager import LocalCluster

    if "SLURM_TRAIN_CLUSTER_DIR" not in env:
        return cmd
    offset = int(env.get("SLURM_TRAIN_CLUSTER_PORT_OFFSET", "0"))
    lc = LocalCluster(Path(env["SLURM_TRAIN_CLUSTER_DIR"]), port_offset=offset)
    return cmd if lc.net is None else lc.shell_command(LOGIN, cmd, str(cwd), None)


def make_venv(venv: Path, home: Path) -> None:
    """A plain venv of the system's Python, made by the user (with pip, no system packages)."""
    proc = run_as_user(
        [str(SYSTEM_PYTHON), "-m", "venv", str(venv)],
        home=home, cwd=home, venv=venv, env={}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
