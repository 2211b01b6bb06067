"""Check a spec against the live cluster before anything is submitted.

Partition exists and is up, the time limit fits its MaxTime, enough usable nodes, GPUs (gres)
and CPUs per node. Each failure names the field, the limit and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster.timefmt import format_slurm_time
from jobs.errors import PreflightError
from jobs.spec import JobSpec

if TYPE_CHECKING:
    from cluster.client import SlurmClient

Where = Callable[[tuple[str, ...]], str]


def preflight(spec: JobSpec, client: SlurmClient, where: Where | None = None) -> str:
    """Raise :class:`PreflightError` when the cluster cannot run ``spec``; return the partition."""
    loc = where or (lambda path: "preflight")
    res = spec.resources
    nodes = client.nodes()
    partitions = client.partitions()
    if res.partition is None:
        part = next((p for p in partitions if p.default), None)
        if part is None:
            raise PreflightError(
                f"{loc(('resources',))}: resources.partition: the cluster has no default "
                f"partition (set one of: {', '.join(p.name for p in partitions) or 'none'})"
            )
    else:
        part = next((p for p in partitions if p.name == res.partition), None)
        if part is None:
            raise PreflightError(
                f"{loc(('resources', 'partition'))}: resources.partition: partition "
                f"{res.partition!r} does not exist on this cluster "
                f"(available: {', '.join(p.name for p in partitions) or 'none'})"
            )
    if part.state.upper() != "UP":
        raise PreflightError(
            f"{loc(('resources', 'partition'))}: resources.partition: partition {part.name} is "
            f"{part.state} (pick another partition or ask the admins)"
        )
    time_s = res.time_s
    if part.max_time_s is not None and (time_s is None or time_s > part.max_time_s):
        limit = format_slurm_time(part.max_time_s)
        raise PreflightError(
            f"{loc(('resources', 'time'))}: resources.time: {res.time} is over partition "
            f"{part.name}'s MaxTime {limit} (ask for at most {limit}; preemption-safe "
            "training resumes across shorter jobs)"
        )
    members = [n for n in nodes if n.name in set(part.nodes)]
    if res.nodes > len(members):
        raise PreflightError(
            f"{loc(('resources', 'nodes'))}: resources.nodes: {res.nodes} nodes but partition "
            f"{part.name} has {len(members)} ({', '.join(n.name for n in members)}); "
            f"ask for at most {len(members)}"
        )
    gpus = res.gpus
    cpus = spec.ntasks_per_node * (res.cpus_per_task or 1)
    fitting = [n for n in members if n.usable and n.gres.get("gpu", 0) >= gpus and n.cpus >= cpus]
    if len(fitting) < res.nodes:
        best_gpus = max((n.gres.get("gpu", 0) for n in members), default=0)
        best_cpus = max((n.cpus for n in members), default=0)
        if gpus > best_gpus:
            field, why = (
                "gpus_per_node",
                f"{gpus} GPUs per node; nodes in {part.name} have at most {best_gpus}",
            )
        elif cpus > best_cpus:
            field = "cpus_per_task" if res.cpus_per_task else "ntasks_per_node"
            why = (
                f"{spec.ntasks_per_node} tasks x {res.cpus_per_task or 1} CPUs per node; nodes in "
                f"{part.name} have at most {best_cpus} CPUs"
            )
        else:
            states = ", ".join(f"{n.name}={n.state}" for n in members)
            field, why = "nodes", f"only {len(fitting)} usable nodes in {part.name} ({states})"
        raise PreflightError(
            f"{loc(('resources', field))}: resources.{field}: {why} (lower the request or pick "
            "another partition)"
        )
    return part.name
