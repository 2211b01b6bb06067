"""Slurm job states for ``status``/``list``/following: one query for all runs, shared a few seconds.

A shared cluster's controller is rate-limited per user, and ``watch jobs status`` runs this
every two seconds. So every caller goes through :func:`slurm_states`:

- the states of ALL the ids asked for come from ONE ``SlurmClient.poll_states`` call (one
  ``squeue``; ``sacct`` only for ids the controller already forgot);
- the answer is kept in ``$SLURM_TRAIN_STATE_DIR/slurm-states.json`` for ``ttl_s`` seconds, so
  another shell (or the next ``watch`` round) within that time asks nothing;
- a job that accounting (sacct) reports final is final for good (the controller forgot it: it
  cannot come back) and is never asked about again.

Every answer is kept under the cluster it came from and the submission (run id) that asked,
never under a bare job id: a new job that gets an old id (another cluster, a rebuilt cluster,
ids wrapping around) is asked about, not shown as the old one. Only answers asked for a
submission (``scopes``) are kept as final.

The file is a cache: a damaged, foreign or stale one is ignored (and rewritten), never an error.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster import JobInfo
from jobs.records import ensure_state_dir, state_dir
from train.runfiles import atomic_write

if TYPE_CHECKING:
    from cluster import Slurm

ClientFactory = Callable[[], "Slurm"]
CACHE = "slurm-states.json"
VERSION = 2
TTL_S = 5.0
# Final states cannot change once the controller has forgotten the job; keep this many.
FINAL_KEEP = 20000
_FIELDS = {f.name for f in fields(JobInfo)}


def cache_path() -> Path:
    return state_dir() / CACHE


def _info(data: Any) -> JobInfo | None:
    if not isinstance(data, dict) or not isinstance(data.get("job_id"), str):
        return None
    try:
        info = JobInfo(**{k: v for k, v in data.items() if k in _FIELDS})
    except TypeError:
        return None
    return info if isinstance(info.state, str) else None


def _load() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    # An older layout (states under bare job ids) is not trusted: asked again, rewritten.
    return data if isinstance(data, dict) and data.get("version") == VERSION else {}


def _bucket(cluster: str, scope: str) -> str:
    """The cache's key for one cluster and one submission."""
    return json.dumps([cluster, scope])


def _infos(data: Any) -> dict[str, JobInfo]:
    if not isinstance(data, dict):
        return {}
    out = {}
    for key, value in data.items():
        info = _info(value)
        if info is not None and info.job_id == key:
            out[key] = info
    return out


def _buckets(data: Any, read: Callable[[Any], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if not isinstance(data, dict):
        return {}
    return {k: read(v) for k, v in data.items() if isinstance(k, str)}


def _covers(states: dict[str, Any], job_id: str) -> bool:
    prefix = f"{job_id}_"
    return any(k == job_id or k.startswith(prefix) for k in states)


def _pick(states: dict[str, Any], job_id: str) -> dict[str, Any]:
    prefix = f"{job_id}_"
    return {k: v for k, v in states.items() if k == job_id or k.startswith(prefix)}


def _save(data: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs queries
        path = ensure_state_dir() / CACHE  # proven ours; never through a link
        atomic_write(path, json.dumps(data, separators=(",", ":")), durable=False)


def slurm_states(
    job_ids: Iterable[str],
    client: ClientFactory,
    *,
    ttl_s: float = TTL_S,
    fresh: bool = False,
    scopes: Mapping[str, str] | None = None,
    cluster: str = "",
) -> dict[str, JobInfo]:
    """States of ``job_ids`` (an array's base id returns all its tasks), at most one Slurm query.

    ``fresh``: ask now even if the cache is younger than ``ttl_s`` (a follower that saw the
    run's files change); the answer still refreshes the cache for everyone else. ``scopes``:
    the submission (run id) each job id was asked for, ``cluster``: the cluster asked; what is
    known is known only for the same cluster and submission (see the module docstring).
    """
    ids = list(dict.fromkeys(str(j) for j in job_ids if j))
    if not ids:
        return {}
    scopes = scopes or {}
    data = _load()
    now = time.time()
    finals = _buckets(data.get("final"), _infos)
    recents = _buckets(data.get("recent"), lambda v: _recent(v, now, ttl_s))
    out: dict[str, JobInfo] = {}
    ask = []
    for job_id in ids:
        where = _bucket(cluster, scopes.get(job_id, ""))
        final, recent = finals.get(where, {}), recents.get(where, {})
        if _covers(final, job_id):
            out.update(_pick(final, job_id))
        elif not fresh and _covers(recent, job_id):
            out.update({k: v for k, (_, v) in _pick(recent, job_id).items()})
        else:
            ask.append(job_id)
    if not ask:
        return out
    found = client().poll_states(ask)
    out.update(found)
    asked = time.time()
    for job_id in ask:  # what was asked again replaces what was known of it
        scope = scopes.get(job_id, "")
        recent = recents.setdefault(_bucket(cluster, scope), {})
        for key in list(recent):
            if key == job_id or key.startswith(f"{job_id}_"):
                del recent[key]
        mine = _pick(found, job_id)
        recent.update({k: (asked, v) for k, v in mine.items()})
        if scope:  # final for good only for the submission that asked
            final = finals.setdefault(_bucket(cluster, scope), {})
            for key, info in mine.items():
                if info.source == "sacct" and info.terminal and info.partition:
                    final[key] = info
    _save(
        {
            "version": VERSION,
            "recent": {
                b: {k: [t, asdict(v)] for k, (t, v) in r.items()} for b, r in recents.items() if r
            },
            "final": _trim({b: {k: asdict(v) for k, v in f.items()} for b, f in finals.items()}),
        }
    )
    return out


def forget(job_ids: Iterable[str]) -> None:
    """Drop the recent (not the final) states of ``job_ids`` from the cache, in every bucket:
    something just changed them (``jobs cancel``), so the next reader asks. A task's whole
    array goes (an array is asked and kept as a whole: one task missing is not "not there")."""
    ids = list(dict.fromkeys(str(j).split("_", 1)[0] for j in job_ids if j))
    data = _load()
    recent = data.get("recent")
    if not ids or not isinstance(recent, dict):
        return
    changed = False
    for entries in recent.values():
        if not isinstance(entries, dict):
            continue
        for key in [k for k in entries if any(k == j or k.startswith(f"{j}_") for j in ids)]:
            del entries[key]
            changed = True
    if changed:
        _save(data)


def _trim(finals: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """At most :data:`FINAL_KEEP` final states, the newest buckets kept."""
    out: dict[str, dict[str, Any]] = {}
    kept = 0
    for bucket, entries in reversed(list(finals.items())):
        if entries and kept + len(entries) <= FINAL_KEEP:
            out[bucket] = entries
            kept += len(entries)
    return dict(reversed(list(out.items())))


def _recent(data: Any, now: float, ttl_s: float) -> dict[str, tuple[float, JobInfo]]:
    """Entries asked about at most ``ttl_s`` ago (``[time, info]`` per id)."""
    if not isinstance(data, dict):
        return {}
    out = {}
    for key, value in data.items():
        if not (isinstance(value, list) and len(value) == 2):
            continue
        stamp, info = value[0], _info(value[1])
        fresh = isinstance(stamp, int | float) and 0 <= now - stamp <= ttl_s
        if fresh and info is not None and info.job_id == key:
            out[key] = (float(stamp), info)
    return out
