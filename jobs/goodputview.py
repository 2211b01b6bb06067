"""The goodput ledger of a run as ``jobs status`` and ``jobs plot`` show it (torch-free).

Reads each task's ``events.jsonl`` and ``metrics.jsonl`` (the tolerant reader: a damaged line
is skipped) and Slurm's own times of every attempt: ONE ``sacct -D`` per run
(:meth:`cluster.Slurm.attempt_times`; an array answers for all its tasks). Where
Slurm cannot be asked, the ledger says ``unaccounted`` for what only Slurm knows. The
arithmetic is :func:`jobs.goodput.compute`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import IO, Any

from cluster import ClusterError, JobAttempt, JobInfo, Slurm
from jobs.goodput import Ledger, compute, sum_ledgers
from jobs.records import RunRecord
from train.runfiles import EVENTS_FILE, METRICS_FILE
from train.schema import EVENT, METRIC, read_records

__all__ = ["dir_ledger", "run_ledger", "run_records", "task_ledgers", "write_goodput"]


def _slurm_attempts(
    record: RunRecord, client: Callable[[], Slurm] | None, sluid: bool = False
) -> tuple[dict[str, list[JobAttempt]], str]:
    """Attempts per task job id (one ``sacct -D`` per array of the run), and a note when
    Slurm could not be asked. ``sluid``: the run's attempts recorded their SLUID (the release
    has one): asked for too, the ledger keys the attempts by it."""
    if record.executor != "slurm" or client is None or not record.job_id:
        return {}, ""
    by_job: dict[str, list[JobAttempt]] = {}
    try:
        slurm = client()
        for array_id in record.slurm_job_ids():
            asked = slurm.attempt_times(array_id, sluid=True) if sluid else None
            for a in asked if asked is not None else slurm.attempt_times(array_id):
                for task_id in _task_ids(a.job_id):
                    by_job.setdefault(task_id, []).append(a)
    except (ClusterError, OSError, ValueError) as exc:
        # status still answers: what only Slurm knows is unaccounted
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return by_job, f"no Slurm times ({first[:120]})"
    return by_job, ""


def _chain_attempts(
    record: RunRecord, client: Callable[[], Slurm] | None
) -> tuple[dict[str, list[JobAttempt]], str, dict[str, int]]:
    """A chain's links as the attempts of its one task (ONE ``sacct -D`` for every link), in
    the order they started, and each link's place in that order."""
    by_job: dict[str, list[JobAttempt]] = {}
    if client is None:
        return {}, "", {}
    try:
        for a in client().attempt_times(",".join(record.chain_job_ids)):
            by_job.setdefault(a.job_id, []).append(a)
    except (ClusterError, OSError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return {}, f"no Slurm times ({first[:120]})", {}
    ran = [j for j in record.chain_job_ids if any(a.start is not None for a in by_job.get(j, []))]
    ran = ran or record.chain_job_ids[:1]  # none started yet: the first link's queue wait
    links = [a for j in ran for a in by_job.get(j, [])[-1:]]  # a link is never requeued
    return {record.job_id: links}, "", {j: k for k, j in enumerate(ran)}


def _as_links(events: list[dict[str, Any]], order: Mapping[str, int]) -> list[dict[str, Any]]:
    """A chain's events for the ledger: each link's ``restart_count`` its place in the chain
    (every link is a first start for Slurm); the chain's own bookkeeping left out."""
    out = []
    for e in events:
        if e.get("event") in ("link_started", "chain_ended"):
            continue
        place = order.get(str(e.get("job_id")))
        out.append(e if place is None else {**e, "restart_count": place})
    return out


def run_records(
    records: list[dict[str, Any]], submitted_at: float | None, job_ids: Collection[str] = ()
) -> list[dict[str, Any]]:
    """The records of this run: a directory used again keeps an earlier run's lines. An event
    of one of this run's jobs (``job_ids``: its Slurm ids, array ids included; a local run's
    ``local-N``, which its events carry as ``submission``) is this run's even when stamped
    before the submission (a node whose clock is behind the controller's): the cut for the
    other records moves back by that skew."""
    if not submitted_at:
        return records
    cut = submitted_at
    ours = {str(j).split("_")[0] for j in job_ids if j}
    for r in records:
        t, job = r.get("time"), r.get("job_id")
        job = r.get("submission") if job is None else job
        if ours and _finite(t) and job is not None and str(job).split("_")[0] in ours:
            cut = min(cut, float(t or 0))
    return [r for r in records if float(r.get("time") or 0) >= cut]


def _task_ids(job_id: str) -> list[str]:
    """sacct's id of a line: one task (``12_3``, ``12``), or array tasks that never started,
    as one line (``12_[0-4,7%2]``): each of them."""
    head, _, rest = job_id.partition("_[")
    if not rest.endswith("]"):
        return [job_id]
    out: list[str] = []
    for part in rest[:-1].split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) - int(lo) > 100_000:
            return [job_id]
        out.extend(f"{head}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _never_started(
    record: RunRecord, states: Mapping[str, JobInfo] | None, events: list[list[dict[str, Any]]]
) -> bool:
    """Every task of a Slurm run is pending, never restarted, with no event since the run's
    submission (``events``: each task's, already cut to this run): no attempt has begun, so
    Slurm's times can add nothing to "queued since the submission" (``jobs status`` asked for
    the states already: no second query)."""
    ids = record.job_ids()
    if record.executor != "slurm" or not states or not ids or not record.submitted_at:
        return False
    for jid in ids:
        info = states.get(jid)
        if info is None or info.state != "PENDING" or (info.restarts or 0) > 0:
            return False
    return not any(events)


def task_ledgers(
    record: RunRecord,
    client: Callable[[], Slurm] | None,
    now: float | None = None,
    states: Mapping[str, JobInfo] | None = None,
) -> list[Ledger]:
    """One ledger per task of ``record`` (a single job: one). ``states``: the tasks' states
    when the caller has them (a run that never started is then not asked about again)."""
    now = time.time() if now is None else now
    ids = record.job_ids() or [""] * len(record.tasks)
    since = record.submitted_at
    ours = [*record.slurm_job_ids(), *ids] if record.executor == "slurm" else []
    events = [
        run_records(read_records(Path(t.run_dir) / EVENTS_FILE, EVENT), since, ours)
        for t in record.tasks
    ]
    chain = bool(record.chain_job_ids) and record.executor == "slurm"
    if _never_started(record, states, events):
        submitted = record.submitted_at
        attempts = {j: [JobAttempt(j, "PENDING", submitted, None, None, None)] for j in ids}
        note = ""
    elif chain:
        attempts, note, order = _chain_attempts(record, client)
        events = [_as_links(task_events, order) for task_events in events]
    else:
        sluid = any(e.get("sluid") for task_events in events for e in task_events)
        attempts, note = _slurm_attempts(record, client, sluid)
    out = []
    for jid, task, task_events in zip(ids, record.tasks, events, strict=False):
        info = (states or {}).get(jid)
        # the metrics of this run: from its own first event on (a skewed clock included)
        first = min((float(e["time"]) for e in task_events if _finite(e.get("time"))), default=None)
        cut = since if first is None or not since else min(since, first)
        ledger = compute(
            task_events,
            run_records(read_records(Path(task.run_dir) / METRICS_FILE, METRIC), cut),
            attempts.get(jid, []),
            submitted_at=record.submitted_at or None,
            now=now,
            state=info.state if info is not None else None,
            slurm=record.executor == "slurm",
            chain=chain,
            expedited_hold_s=record.expedited_hold_s if record.executor == "slurm" else None,
        )
        if note:
            ledger.notes.append(note)
        out.append(ledger)
    return out


def run_ledger(
    record: RunRecord,
    client: Callable[[], Slurm] | None,
    now: float | None = None,
    states: Mapping[str, JobInfo] | None = None,
) -> Ledger:
    """The run's ledger (a sweep: its tasks summed)."""
    return sum_ledgers(task_ledgers(record, client, now, states))


def dir_ledger(
    run_dir: Path, client: Callable[[], Slurm] | None, now: float | None = None
) -> Ledger:
    """The ledger of the run in ``run_dir`` (its ``run.json``; a directory without one: from
    its files alone, Slurm's part unaccounted)."""
    from jobs.errors import RunNotFoundError
    from jobs.records import load_record

    try:
        return run_ledger(load_record(run_dir), client, now)
    except RunNotFoundError:
        now = time.time() if now is None else now
        return compute(
            read_records(run_dir / EVENTS_FILE, EVENT),
            read_records(run_dir / METRICS_FILE, METRIC),
            now=now,
        )


def write_goodput(ledger: Ledger, out: IO[str] | None = None) -> dict[str, Any]:
    """Write status's one line (``  goodput 0.91 (biggest loss: ...)``) to ``out``; return the
    ledger as ``--json`` shows it."""
    line = ledger.line()
    if out is not None and line:
        out.write(f"  {line}\n")
    if out is not None:
        for expedited in ledger.expedited:  # the wait each expedited requeue saved
            out.write(f"  {expedited.line()}\n")
    return ledger.to_dict()
