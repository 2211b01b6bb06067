"""The local cluster's files: writing its config, and stamps of the config each daemon runs with.

``up`` writes a Slurm daemon's stamp (the SHA-256 of the config files it reads) when it starts
it or finds it running with the current config; a live daemon whose stamp differs from the files
on disk is stale and ``up`` restarts it. That is how a changed config (a new node, a new prolog)
reaches a running cluster without ``down``.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.local import config as cfg
from cluster.local.daemons import read_text

if TYPE_CHECKING:
    from cluster.local.hosts import Network

__all__ = ["is_stale", "stamp", "write_config"]


def write_config(
    layout: cfg.Layout, hostname: str, slurm: str = cfg.HOST_SLURM, net: Network | None = None
) -> set[Path]:
    """Create the state directories and write every config file whose text differs, for
    Slurm release ``slurm``.

    Returns the files written (each replaced atomically, with its mode).
    """
    L = layout
    for d in (L.etc, L.run, L.log, L.spool, L.spool / "ctld", L.gres_dev, L.mysql_dir):
        d.mkdir(parents=True, exist_ok=True)
    for n in cfg.NODES:
        (L.spool / f"d-{n}").mkdir(exist_ok=True)
    for i in range(cfg.GPUS_PER_NODE):
        (L.gres_dev / f"gpu{i}").touch(exist_ok=True)
    if not L.db_password.exists():
        L.db_password.write_text(secrets.token_hex(16))
        L.db_password.chmod(0o600)
    password = L.db_password.read_text().strip()
    files = {
        L.slurm_conf: (cfg.render_slurm_conf(L, hostname, slurm, net), 0o644),
        L.gres_conf: (cfg.render_gres_conf(L), 0o644),
        L.cgroup_conf: (cfg.render_cgroup_conf(slurm), 0o644),
        L.task_prolog: (cfg.render_task_prolog(), 0o755),
        L.slurmdbd_conf: (cfg.render_slurmdbd_conf(L, password), 0o600),
    }
    changed: set[Path] = set()
    for path, (text, mode) in files.items():
        if read_text(path, strip=False) != text:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.chmod(mode)
            tmp.replace(path)
            changed.add(path)
    return changed


def config_files(layout: cfg.Layout, daemon: str) -> list[Path]:
    """The config files ``daemon`` reads (none for munged and mariadbd)."""
    if daemon == "slurmdbd":
        return [layout.slurmdbd_conf]
    if daemon == "slurmctld" or daemon.startswith("slurmd-"):
        return [layout.slurm_conf, layout.gres_conf, layout.cgroup_conf, layout.task_prolog]
    if daemon == "sshd":  # the login node of --remote (cluster/local/sshd.py: its ports, Match)
        return [layout.root / "ssh" / "sshd_config"]
    return []


def config_digest(layout: cfg.Layout, daemon: str) -> str | None:
    files = config_files(layout, daemon)
    if not files:
        return None
    h = hashlib.sha256()
    for path in files:
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"(missing)")
        h.update(b"\0")
    return h.hexdigest()


def stamp_file(layout: cfg.Layout, daemon: str) -> Path:
    return layout.run / f"{daemon}.config-sha256"


def stamp(layout: cfg.Layout, daemon: str) -> None:
    """Record that the live ``daemon`` runs with the config on disk now."""
    digest = config_digest(layout, daemon)
    if digest is not None:
        path = stamp_file(layout, daemon)
        if read_text(path) != digest:
            path.write_text(digest)


def is_stale(layout: cfg.Layout, daemon: str, changed: set[Path]) -> bool:
    """True when the live ``daemon`` runs with another config than the one on disk now.

    Without a stamp (started by an older version of this code) it is stale only if ``up`` has
    just rewritten one of the files it reads (``changed``).
    """
    digest = config_digest(layout, daemon)
    if digest is None:
        return False
    recorded = read_text(stamp_file(layout, daemon))
    if recorded is None:
        return any(p in changed for p in config_files(layout, daemon))
    return recorded != digest
