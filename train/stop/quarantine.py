"""Bad nodes: which node an interruption is due to, and keeping the job off it (torch-free).

An interruption is attributed to a node when

- Slurm failed the node under the job (``NODE_FAIL``: slurmd stopped answering, or an admin set
  it DOWN): Slurm kills the job and requeues it itself, and the surviving ranks get SIGTERM.
  :func:`failed_nodes` tells this apart from a preemption or a cancel: the job was already
  requeued without a ``PreemptTime``, and some of the attempt's nodes are no longer usable;
  or, at a failure (a step that died, a rank that lost a peer), one of the attempt's nodes is
  already DOWN or failed while Slurm has not requeued the job yet (``now``): a node failure
  too, not a failure of the training, and no reason to restart on the same nodes;
- a rank hung on it (:mod:`train.hang.watcher`);
- a failure's text names a device fault (:func:`device_fault`: ECC errors, a GPU that fell off
  the bus, NVIDIA Xid, NCCL's system errors), not a bug in the training code.

:func:`exclude` then keeps the requeued (pending) job off those nodes through ``ExcNodeList``,
merged with what it already excludes, while the job's partition keeps enough other usable nodes
for it; either way it records a ``quarantine`` event (``nodes`` excluded, or ``skipped`` and why),
which ``jobs status`` shows as ``n2 excluded after hang at step 57``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.history import FINAL_EVENTS, STOP_EVENTS, RunHistory

if TYPE_CHECKING:
    from cluster import JobQueries, Slurm

__all__ = ["device_fault", "exclude", "explain_previous_attempt", "failed_nodes"]

log = logging.getLogger(__name__)

# Errors that say the hardware, not the program, failed (CUDA, NVIDIA driver, NCCL).
_DEVICE_FAULT = re.compile(
    r"uncorrectable ECC error|ECC error encountered|"
    r"GPU has fallen off the bus|GPU is lost|Xid[ (:]|"
    r"CUDA error: (?:unspecified launch failure|an illegal instruction was encountered|"
    r"unknown error|uncorrectable)|"
    r"cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE|"
    r"NCCL error.*(?:unhandled system error|remote process exited or there was a network error)|"
    r"NVLink error|"
    r"Input/output error.*(?:/dev/nvidia|nvidia)",
    re.IGNORECASE,
)


def device_fault(*texts: object) -> bool:
    """Whether any of ``texts`` (an error line, a stderr tail) names a device fault."""
    return any(isinstance(t, str) and _DEVICE_FAULT.search(t) for t in texts)


def failed_nodes(
    info: dict[str, str],
    restart_count: int,
    hosts: Sequence[str],
    client: JobQueries,
    *,
    now: bool = False,
) -> dict[str, str] | None:
    """The nodes of this attempt (``hosts``) that Slurm failed under it, with their states, when
    ``info`` (``scontrol show job``) says Slurm already requeued the job without preempting it;
    with ``now`` (a failure), also the attempt's nodes that are down or failed already, before
    Slurm requeues the job. None when this is not a node failure (or Slurm cannot say)."""
    restarts = str(info.get("Restarts", ""))
    preempted = str(info.get("PreemptTime", "None")).strip() not in ("", "None", "Unknown")
    requeued = restarts.isdigit() and int(restarts) > restart_count
    if not hosts or preempted or not (requeued or now):
        return None
    try:
        nodes = {n.name: n for n in client.nodes()}
    except Exception as exc:  # controller busy or gone: not provable
        log.debug("cannot read the node states (%s)", exc)
        return None
    # Slurm requeued: whatever it no longer schedules on; before that, only a node that is
    # down or failed (cluster.models.Node.down), not one merely draining
    bad = {
        h: nodes[h].state
        for h in hosts
        if h in nodes and (not nodes[h].usable if requeued else nodes[h].down)
    }
    return bad or None


def exclude(
    run_dir: str | Path,
    job_id: str,
    nodes: Iterable[str],
    reason: str,
    *,
    step: int | None = None,
    restart_count: int = 0,
    client: Slurm | None = None,
) -> list[str]:
    """Keep pending job ``job_id`` off ``nodes`` (see the module docstring); returns the nodes
    excluded (empty when skipped). Best effort: the requeue has happened already."""
    nodes = sorted(set(nodes))
    history = RunHistory(run_dir)
    base = {"step": step, "restart_count": restart_count, "job_id": job_id}
    if not nodes:
        return []
    try:
        if client is None:
            from cluster import slurm_client  # lazy: only cluster/ runs Slurm commands

            client = slurm_client(timeout=30, shielded=True)
        job = client.show_job(str(job_id))
        need = int((job.get("NumNodes") or "1").split("-")[0])
        partition = client.partition(job.get("Partition", "").split(",")[0])
        members = set(partition.nodes) if partition is not None else set()
        excluded = set(nodes)
        have = job.get("ExcNodeList", "")
        if have and have != "(null)":
            from cluster import expand_hostlist

            excluded |= set(expand_hostlist(have))
        others = [n.name for n in client.nodes() if n.usable and n.name in members - excluded]
        if len(others) < need:
            why = (
                f"not excluding {','.join(nodes)}: the job needs {need} node(s) and partition "
                f"{job.get('Partition')} would have {len(others)} usable one(s) left"
            )
            log.warning("%s", why)
            history.append("quarantine", **base, nodes=[], reason=reason, skipped=why)
            return []
        merged = client.exclude_nodes(str(job_id), nodes)
    except Exception as exc:
        log.warning("could not exclude %s: %s", ",".join(nodes), exc)
        history.append("quarantine", **base, nodes=[], reason=reason, skipped=str(exc)[:200])
        return []
    log.warning("%s excluded after %s", ",".join(nodes), reason)
    history.append("quarantine", **base, nodes=nodes, excluded=merged, reason=reason)
    return nodes


# what a rank records when an attempt ends (any of them: the attempt is explained)
_ENDS = frozenset({*STOP_EVENTS, *FINAL_EVENTS, "requeue"})


def explain_previous_attempt(
    run_dir: str | Path, job_id: str | None, restart_count: int, client: Slurm | None = None
) -> dict[str, Any] | None:
    """At the start of attempt ``restart_count`` (rank 0): when the previous attempt recorded
    no end (its rank 0 died with its node, and the ranks that survived record nothing), ask
    Slurm (``sacct -D``) how it ended; a ``NODE_FAIL`` is recorded then, late, as a
    ``node_fail`` event with that attempt's nodes that are still unusable (``late: true``; the
    running job cannot be kept off them any more, but Slurm does not place work on a DOWN
    node). Returns the event, or None."""
    if not job_id or restart_count < 1:
        return None
    history = RunHistory(run_dir)
    previous = restart_count - 1
    events = history.events()
    if any(
        e.get("restart_count") == previous
        and e.get("event") in _ENDS
        and e.get("action") != "restart_in_place"  # that attempt went on, in a new step
        for e in events
    ):
        return None
    try:
        if client is None:
            from cluster import slurm_client  # lazy: only cluster/ runs Slurm commands

            client = slurm_client(timeout=30, shielded=True)
        ended = [a for a in client.attempts(str(job_id)) if a.terminal or a.state == "REQUEUED"]
        if not ended:
            return None
        before = ended[-1]
        if before.state != "NODE_FAIL":
            log.warning(
                "attempt %d of job %s ended without a record (Slurm: %s)",
                previous, job_id, before.state,
            )  # fmt: skip
            return None
        from cluster import expand_hostlist

        hosts = expand_hostlist(before.nodelist) if before.nodelist else []
        states = {n.name: n.state for n in client.nodes() if n.name in hosts and not n.usable}
    except Exception as exc:  # Slurm cannot say: nothing to add
        log.debug("cannot ask Slurm how attempt %d ended (%s)", previous, exc)
        return None
    log.error(
        "attempt %d of job %s ended in a node failure (%s)", previous, job_id, before.nodelist
    )
    return history.append(
        "node_fail",
        step=None,
        restart_count=previous,
        job_id=job_id,
        nodes=sorted(states),
        states=states,
        attempt_nodes=hosts,
        late=True,
    )
