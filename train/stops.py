"""Why Slurm is stopping a job (preemption, time limit, cancel), from ``scontrol show job``.

:func:`classify_from_job_info` is pure (tested on recorded fields); :func:`classify_stop` asks
Slurm through :mod:`cluster.client` (imported lazily: ``train`` does not need ``cluster`` to
import) and answers ``"signal"`` when Slurm cannot be asked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from train.signals import StopKind

__all__ = [
    "StopKind",
    "classify_from_job_info",
    "classify_stop",
    "node_failure",
    "preemption_grace_s",
]

log = logging.getLogger(__name__)

_UNSET = {"", "none", "unknown", "n/a", "(null)"}


def _parse_slurm_timestamp(value: str | None) -> float | None:
    if value is None or value.strip().lower() in _UNSET:
        return None
    try:
        # Slurm prints local time without a zone, e.g. 2026-11-22T10:40:00
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def _time_limit_s(value: str | None) -> float | None:
    if value is None or value.strip().lower() in _UNSET:
        return None
    try:
        from cluster.timefmt import parse_slurm_time  # stdlib only; lazy like cluster.client

        seconds = parse_slurm_time(value.strip())
    except Exception:  # UNLIMITED parses to None; anything odd: unknown
        return None
    return float(seconds) if seconds is not None else None


def classify_from_job_info(
    info: Mapping[str, str],
    signal_delay_s: float,
    now: float | None = None,
    restart_count: int | None = None,
) -> Literal["preemption", "timeout", "cancel"]:
    """Why Slurm is stopping the job, from ``scontrol show job`` fields (pure).

    - PreemptTime set, or Restarts already above this run's restart count (Slurm requeued it
      when the grace time ended) -> ``preemption``;
    - job still RUNNING: EndTime within ``signal_delay_s + 120`` s -> ``timeout`` (Slurm may
      send the signal up to 60 s early, and its timer runs about every 30 s: seen 61 s early on
      the local cluster), EndTime far away -> ``preemption`` (also a manual
      ``scancel --signal=USR2``: checkpoint and requeue);
    - job already ending (COMPLETING, CANCELLED, ...): its time limit reached -> ``timeout``,
      else ``cancel`` (a plain ``scancel`` sends SIGTERM: stop, never requeue).
    """
    now = time.time() if now is None else now
    margin = signal_delay_s + 120
    if _parse_slurm_timestamp(info.get("PreemptTime")) is not None:
        return "preemption"
    restarts = info.get("Restarts", "")
    if restart_count is not None and restarts.isdigit() and int(restarts) > restart_count:
        return "preemption"
    state = info.get("JobState", "RUNNING").strip().upper()
    if state == "TIMEOUT":
        return "timeout"
    if state in ("RUNNING", "SUSPENDED", "CONFIGURING", "PENDING", ""):
        end = _parse_slurm_timestamp(info.get("EndTime"))
        if end is not None and end - now <= margin:
            return "timeout"
        return "preemption"
    start = _parse_slurm_timestamp(info.get("StartTime"))
    limit = _time_limit_s(info.get("TimeLimit"))
    if start is not None and limit is not None and start + limit - now <= margin:
        return "timeout"
    return "cancel"


def classify_stop(
    job_id: str,
    signal_delay_s: float,
    *,
    client: Any = None,
    now: float | None = None,
    restart_count: int | None = None,
) -> StopKind:
    """Ask Slurm why job ``job_id`` is being stopped; ``"signal"`` if Slurm cannot be asked."""
    try:
        if client is None:
            from cluster.client import SlurmClient  # lazy: train does not need cluster to import

            client = SlurmClient(timeout=10)
        info = client.show_job(job_id)
    except Exception as exc:  # no scontrol in a container, controller down, ...
        log.warning("cannot ask Slurm about job %s (%s); stop kind unknown", job_id, exc)
        return "signal"
    kind = classify_from_job_info(info, signal_delay_s, now, restart_count)
    log.warning("job %s: stop is a %s", job_id, kind)
    return kind


def preemption_grace_s(job_id: str, client: Any) -> int | None:
    """The GraceTime of job ``job_id``'s partition: how long Slurm waits between the preemption
    signal and the kill; None when Slurm cannot say (or the partition has none)."""
    try:
        name = str(client.show_job(job_id).get("Partition", "")).split(",")[0]
        part = client.partition(name) if name else None
    except Exception as exc:  # controller busy or gone: keep the configured grace
        log.debug("cannot read the partition's GraceTime (%s)", exc)
        return None
    return part.grace_time_s if part is not None else None


def node_failure(
    job_id: str, restart_count: int, hosts: Sequence[str], client: Any
) -> dict[str, str] | None:
    """The nodes of this attempt that Slurm failed under job ``job_id`` (node -> state), when
    this stop is a NODE_FAIL (see :func:`train.quarantine.failed_nodes`); None otherwise."""
    if not hosts:
        return None
    try:
        info = client.show_job(job_id)
    except Exception as exc:
        log.debug("cannot ask Slurm about job %s (%s)", job_id, exc)
        return None
    from train.quarantine import failed_nodes

    return failed_nodes(info, restart_count, hosts, client)


class AskedOnce:
    """``client`` whose ``show_job`` answers once per job (the rest passes through): one stop
    is classified, checked for a node failure and fitted to GraceTime from ONE scontrol call."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._jobs: dict[str, dict[str, str]] = {}

    def show_job(self, job_id: str) -> dict[str, str]:
        if job_id not in self._jobs:
            self._jobs[job_id] = self._client.show_job(job_id)
        return self._jobs[job_id]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
