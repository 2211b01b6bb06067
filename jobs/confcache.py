"""Facts about a cluster kept in the state folder until its slurm.conf changes (torch-free).

The preflight's array limits and restart levers (``scontrol show config``), the options of the
cluster's ``sbatch --help`` and whether requeue works in a partition (``JobRequeue``,
``PreemptMode``) are settings of the cluster's configuration: asked once, kept on the file's
stamp (:meth:`cluster.Slurm.conf_stamp`), asked again after an edit. A stamp that names no file
(``...:missing``: a configless client) keeps an entry for ``unstamped_ttl_s`` only.

One reader and one writer for every such cache: a missing, damaged, foreign or stale entry reads
as none (the cluster is asked again), and an entry is written through the run-directory owner
(:func:`train.runfiles.atomic_write` in a state folder proven ours, never through a link); one
that cannot be written only costs the query next time.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from train.runfiles import atomic_write, private_dir

__all__ = ["UNSTAMPED_TTL_S", "read_entry", "write_entry"]

#: How long an entry lives when the stamp names no file (the configuration cannot be watched).
UNSTAMPED_TTL_S = 3600.0


def read_entry(
    cache_dir: Path, name: str, stamp: str, *, ttl_s: float = math.inf
) -> dict[str, Any] | None:
    """The entry ``name`` when it was written for ``stamp`` and is younger than ``ttl_s``
    (``UNSTAMPED_TTL_S`` at most for an unstamped configuration); None otherwise."""
    if stamp.endswith(":missing"):
        ttl_s = min(ttl_s, UNSTAMPED_TTL_S)
    try:
        data = json.loads((cache_dir / name).read_bytes())
        if not isinstance(data, dict) or data["stamp"] != stamp:
            return None
        age = time.time() - float(data["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, damaged or foreign: ask the cluster
    return data if 0 <= age < ttl_s else None


def write_entry(cache_dir: Path, name: str, stamp: str, entry: dict[str, Any]) -> None:
    """Keep ``entry`` (JSON) as ``name`` for ``stamp``; a cache that cannot be written (a
    foreign state folder, a full disk) is left alone."""
    data = {**entry, "stamp": stamp, "at": time.time()}
    try:
        folder = private_dir(cache_dir.parent, cache_dir.name, mode=0o755)
        atomic_write(folder / name, json.dumps(data), durable=False)
    except OSError:
        pass  # a cache that cannot be written only costs one query next time
