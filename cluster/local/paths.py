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
# Outside /root on purpose: munge and mysql daemons run as their own users and must reach it.
DEFAULT_STATE_DIR = Path("/var/tmp/slurm-train-cluster")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(STATE_ENV) or DEFAULT_STATE_DIR)


def local_conf(environ: Mapping[str, str] | None = None) -> Path:
    return state_dir(environ) / "etc" / "slurm.conf"


def find_local_conf(environ: Mapping[str, str]) -> str | None:
    """The dev cluster's slurm.conf when it exists (the registered finder)."""
    conf = local_conf(environ)
    return str(conf) if conf.exists() else None


def resolve_slurm_conf(environ: Mapping[str, str] | None = None) -> str | None:
    """The slurm.conf Slurm commands should use (:func:`cluster.conf.find_slurm_conf` with
    this cluster as the only finder; kept for callers inside ``cluster/local``)."""
    from cluster.conf import find_slurm_conf

    return find_slurm_conf(os.environ if environ is None else environ, [find_local_conf])
