"""Check a spec against the live cluster before anything is submitted.

Partition exists and is up, the time limit fits its MaxTime, enough usable nodes, GPUs (gres)
and CPUs per node; a sweep fits the cluster's array limits. Each failure names the field, the
limit and the fix.

Cost: ONE Slurm command per submission (``sinfo``: partitions and nodes together). The array
limits (MaxArraySize, MaxJobCount, from ``scontrol show config``) are settings in slurm.conf:
they change only when an admin edits that file, so they are kept in the state directory keyed
on the file's path, size and mtime (``cluster.conf.conf_stamp``) and asked again only after
an edit (or hourly where no slurm.conf is readable, as in configless set-ups).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster import ClusterLimits, format_slurm_time
from jobs.confcache import read_entry, write_entry
from jobs.errors import PreflightError

if TYPE_CHECKING:
    from pathlib import Path

    from cluster import ClusterState, Slurm
    from jobs.spec import JobSpec

Where = Callable[[tuple[str, ...]], str]
LIMITS_FILE = "cluster-limits.json"
SBATCH_OPTIONS_FILE = "sbatch-options.json"
SBATCH_OPTIONS_TTL_S = 86400.0


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _limits_of(data: dict, *, for_deciding: bool = True) -> ClusterLimits:
    """The cached entry as limits; an entry written before the restart levers were kept (no
    ``successor_wait_s``) raises KeyError ``for_deciding`` (the cluster is asked again), else
    reads as Slurm's defaults."""
    delay, expire = data.get("requeue_delay_s"), data.get("cred_expire_s")
    wait = data["successor_wait_s"] if for_deciding else data.get("successor_wait_s", 30)  # Slurm's
    return ClusterLimits(
        int(data["max_array_size"]),
        int(data["max_job_count"]),
        # an entry written before these fields existed reads as none set
        expedited_requeue=data.get("expedited_requeue") is True,
        requeue_delay_s=delay if _whole(delay) else None,
        cred_expire_s=expire if _whole(expire) else None,
        slurm_version=str(data.get("slurm_version") or ""),
        successor_wait_s=int(wait),
    )


def cluster_limits(client: Slurm, cache_dir: Path) -> ClusterLimits:
    """The cluster's array limits, from the cache when slurm.conf has not changed since."""
    stamp = client.conf_stamp()
    data = read_entry(cache_dir, LIMITS_FILE, stamp)
    if data is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):  # foreign: ask the cluster
            return _limits_of(data)
    limits = client.limits()
    write_entry(cache_dir, LIMITS_FILE, stamp, dict(limits.__dict__))
    return limits


def cached_limits(cache_dir: Path) -> ClusterLimits | None:
    """What the last submission's preflight read (:func:`cluster_limits`'s cache), without a
    query and whatever its age: for showing, never for deciding. None when there is none (or
    it is damaged or foreign)."""
    try:
        data = json.loads((cache_dir / LIMITS_FILE).read_bytes())
        return _limits_of(data, for_deciding=False) if isinstance(data, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def restart_levers_line(limits: ClusterLimits | None) -> str | None:
    """One line of how the cluster restarts a requeued job (``jobs status``): its
    ``requeue_delay`` where set, whether it allows an expedited requeue; None when neither."""
    if limits is None:
        return None
    said = []
    if limits.requeue_delay_s is not None:
        said.append(
            f"a requeued job waits {limits.requeue_delay_s} s (SchedulerParameters=requeue_delay)"
        )
    if limits.expedited_requeue:
        said.append("a node failure's requeue is expedited (--requeue=expedite)")
    if not said:
        return None
    release = f"Slurm {limits.slurm_version}: " if limits.slurm_version else ""
    return f"  requeue: {release}{'; '.join(said)}"


def sbatch_options(client: Slurm, cache_dir: Path) -> frozenset[str] | None:
    """The long options of the cluster's ``sbatch`` (``sbatch --help``: its release's), kept
    per cluster as the array limits are (on slurm.conf's stamp: a new release comes with its
    daemons restarted on an edited slurm.conf) and asked again at least daily
    (:data:`SBATCH_OPTIONS_TTL_S`); None when it cannot be asked (sbatch itself will then say
    what is wrong)."""
    from cluster import ClusterError

    stamp = client.conf_stamp()
    data = read_entry(cache_dir, SBATCH_OPTIONS_FILE, stamp, ttl_s=SBATCH_OPTIONS_TTL_S)
    if data is not None and isinstance(data.get("options"), list):
        return frozenset(str(o) for o in data["options"])
    try:
        options = client.sbatch_options()
    except ClusterError:
        return None
    write_entry(cache_dir, SBATCH_OPTIONS_FILE, stamp, {"options": sorted(options)})
    return options


def check_sbatch_release(
    spec: JobSpec, live: frozenset[str] | None, where: Where | None = None
) -> None:
    """The script's options against the cluster's ``sbatch`` (:func:`sbatch_options`): the
    hand-kept list of :mod:`jobs.sbatchopts` checked against the release Slurm runs.
    PreflightError naming the first problem (its ``launch.sbatch_args`` key when it is one)."""
    if live is None:
        return
    from jobs.render import slurm_options
    from jobs.sbatchopts import release_problems

    extra = spec.launch.sbatch_args
    written = [k for k, _ in slurm_options(spec).sbatch if k not in extra]
    written += ["output", "open-mode", "wckey"] + (["array"] if spec.sweep else [])
    problems = release_problems(extra, written, live)
    if problems:
        key, problem = problems[0]
        loc = where or (lambda path: "preflight")
        if key is None:
            raise PreflightError(f"{loc(())}: {problem}")
        raise PreflightError(
            f"{loc(('launch', 'sbatch_args', key))}: launch.sbatch_args.{key}: {problem}"
        )


def array_limit(tasks: int, limits: ClusterLimits, where: Where | None = None) -> int:
    """Tasks per array for a sweep of ``tasks`` points; PreflightError when it cannot fit."""
    loc = where or (lambda path: "preflight")
    if limits.max_array_size < 1:
        raise PreflightError(
            f"{loc(('sweep',))}: sweep: this cluster has job arrays turned off "
            "(MaxArraySize=0); submit the points as separate specs"
        )
    arrays = math.ceil(tasks / limits.max_array_size)
    if arrays > limits.max_job_count:
        raise PreflightError(
            f"{loc(('sweep', 'grid'))}: sweep.grid: {tasks} points need {arrays} arrays of at most "
            f"{limits.max_array_size} (MaxArraySize) but the cluster holds at most "
            f"{limits.max_job_count} jobs (MaxJobCount); split the sweep into smaller specs"
        )
    return limits.max_array_size


def preflight(
    spec: JobSpec,
    client: Slurm,
    where: Where | None = None,
    *,
    state: ClusterState | None = None,
) -> str:
    """Raise :class:`PreflightError` when the cluster cannot run ``spec``; return the partition.

    ``state``: the cluster as already read (else one ``sinfo`` now).
    """
    loc = where or (lambda path: "preflight")
    res = spec.resources
    state = state or client.cluster_state()
    nodes, partitions = list(state.nodes), list(state.partitions)
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
    if res.max_nodes > len(members):
        raise PreflightError(
            f"{loc(('resources', 'nodes'))}: resources.nodes: {res.nodes} nodes but partition "
            f"{part.name} has {len(members)} ({', '.join(n.name for n in members)}); "
            f"ask for at most {len(members)}"
        )
    gpus = res.gpus
    cpus = spec.ntasks_per_node * (res.cpus_per_task or 1)
    fitting = [n for n in members if n.usable and n.gres.get("gpu", 0) >= gpus and n.cpus >= cpus]
    if len(fitting) < res.min_nodes:
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


def shapes_note(spec: JobSpec, state: ClusterState) -> str | None:
    """For ``resources.nodes: "MIN-MAX"``: the shapes the job may run at, and how many nodes of
    its partition could take one of its tasks now (from the preflight's ``sinfo``); None for a
    fixed node count."""
    res = spec.resources
    if res.min_nodes == res.max_nodes:
        return None
    part = next(
        (
            p
            for p in state.partitions
            if p.name == res.partition or (not res.partition and p.default)
        ),
        None,
    )
    if part is None:
        return None
    cpus = spec.ntasks_per_node * (res.cpus_per_task or 1)
    members = [n for n in state.nodes if n.name in set(part.nodes)]
    fitting = [
        n for n in members if n.usable and n.gres.get("gpu", 0) >= res.gpus and n.cpus >= cpus
    ]
    tasks = spec.ntasks_per_node
    shapes = ", ".join(
        f"{n} node{'s' * (n > 1)} x {tasks} (world size {n * tasks})"
        for n in range(res.min_nodes, res.max_nodes + 1)
    )
    return (
        f"jobs: resources.nodes {res.nodes}: runs as {shapes}; partition {part.name} has "
        f"{len(fitting)} of {len(members)} node(s) usable for it now. A requeued run resumes on "
        "the nodes free then (same global batch; tasks per node and the train section fixed)"
    )


def save_lead_notes(
    spec: JobSpec, run_dirs: list[Path], partition: str, state: ClusterState
) -> list[str]:
    """Lines for stderr when the stops these run directories measured (train.stop.lead: signal
    -> saved checkpoint) need more than the spec's ``requeue.signal_delay_s`` or the partition's
    GraceTime gives (nothing measured yet, a fresh run: nothing to say)."""
    from train.history import RunHistory
    from train.stop import lead_notes, needed_lead_s

    needed = [n for d in run_dirs if (n := needed_lead_s(RunHistory(d).events())) is not None]
    if not needed:
        return []
    part = next((p for p in state.partitions if p.name == partition), None)
    grace = part.grace_time_s if part is not None else None
    return lead_notes(max(needed), spec.requeue.signal_delay_s, grace, partition)
