"""Where the local dev cluster keeps its config and state, and how commands find it."""

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


def resolve_slurm_conf(environ: Mapping[str, str] | None = None) -> str | None:
    """The slurm.conf Slurm commands should use.

    ``SLURM_CONF`` if set; else the system config if present (a real cluster); else the local
    dev cluster's config if it exists (the embedded default); else None (Slurm's built-in default).
    """
    env = os.environ if environ is None else environ
    if env.get("SLURM_CONF"):
        return env["SLURM_CONF"]
    if SYSTEM_CONF.exists():
        return None
    conf = local_conf(env)
    return str(conf) if conf.exists() else None
