"""Where the local dev cluster keeps its config and state, and how commands find it.

:func:`find_local_conf` is registered as a ``slurm_train.slurm_conf`` finder
(``pyproject.toml``): :func:`cluster.conf.find_slurm_conf` asks it when ``SLURM_CONF`` is unset
and the machine has no system slurm.conf.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STATE_ENV = "SLURM_TRAIN_CLUSTER_DIR"
#: Shifts every port of the cluster in STATE_ENV (a second cluster beside the default one: the
#: integration tests run one per test worker).
PORT_OFFSET_ENV = "SLURM_TRAIN_CLUSTER_PORT_OFFSET"
# Outside /root on purpose: munge and mysql daemons run as their own users and must reach it.
DEFAULT_STATE_DIR = Path("/var/tmp/slurm-train-cluster")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(STATE_ENV) or DEFAULT_STATE_DIR)


def port_offset(environ: Mapping[str, str] | None = None) -> int:
    """The port offset :data:`PORT_OFFSET_ENV` asks for (0 when unset)."""
    from cluster.errors import LocalClusterError

    env = os.environ if environ is None else environ
    raw = (env.get(PORT_OFFSET_ENV) or "0").strip()
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 20000:
        raise LocalClusterError(
            f"{PORT_OFFSET_ENV}={raw!r}: expected a whole number of ports from 0 to 20000"
        )
    return value


def local_conf(environ: Mapping[str, str] | None = None) -> Path:
    return state_dir(environ) / "etc" / "slurm.conf"


def find_local_conf(environ: Mapping[str, str]) -> str | None:
    """The dev cluster's slurm.conf while its controller runs (the registered finder). A
    cluster that is down leaves its config behind: offered then, every Slurm command would
    wait on a controller that never answers (about 18 s a command here) instead of saying at
    once that there is no Slurm."""
    conf = local_conf(environ)
    if not conf.exists():
        return None
    from cluster.local.config import Layout  # lazy: only when a config is there
    from cluster.local.daemons import pid_runs, read_pid

    pid_file = Layout(state_dir(environ)).pid_file("slurmctld")
    return str(conf) if pid_runs(read_pid(pid_file), "slurmctld") else None
