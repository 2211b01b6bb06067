"""Job states, logs and cancelling for recorded runs (Slurm or local); following is
:mod:`jobs.follow`.

Slurm states come from ONE query for any number of runs, shared for a few seconds through the
state dir (:func:`jobs.statecache.slurm_states`); local runs' states from their supervisor's
``local_state.json``, checked against the processes themselves (:mod:`jobs.pids`).
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from cluster import JobInfo
from jobs.pids import ProcHandle, cmdline, signal_if_ours
from jobs.records import RunRecord

if TYPE_CHECKING:
    from cluster import Slurm

ClientFactory = Callable[[], "Slurm"]
FINAL_LOCAL = {"COMPLETED", "FAILED", "CANCELLED"}
# A task `jobs cancel` asked to cancel (RunRecord.cancel_requested) that is not over yet.
CANCELLING = "CANCELLING"
# Reasons of an UNKNOWN state that Slurm's answer is not about this run's job.
OTHER_CLUSTER = "not this run's job: submitted to cluster"
REUSED = "not this run's job: id reused"


def is_supervisor(pid: int, record: RunRecord) -> bool:
    """``pid`` runs ``python -m jobs.localrun RUN_DIR`` for this very run."""
    argv = cmdline(pid)
    return "jobs.localrun" in argv and record.run_dir in argv


def is_rank(pid: int, record: RunRecord) -> bool:
    """``pid`` runs ``python -m train ... --run-dir DIR`` for a task of this run."""
    argv = cmdline(pid)
    return "train" in argv and any(t.run_dir in argv for t in record.tasks)


def supervisor(record: RunRecord, state: dict[str, Any]) -> ProcHandle | None:
    """The live supervisor of a local run, proven by its recorded start time (written by the
    supervisor itself) and its command line; None when it is gone (or the PID is another's)."""
    handle = ProcHandle.from_json(state.get("supervisor"))
    if handle is None or handle.pid != record.pid:
        # Not written yet (it has just started): its command line and start time must fit.
        if not isinstance(record.pid, int) or record.pid <= 0:
            return None
        handle = ProcHandle.of(record.pid)
        if handle is None or not _started_after(handle, record.submitted_at):
            return None
    return handle if handle.alive() and is_supervisor(handle.pid, record) else None


def _started_after(handle: ProcHandle, when: float) -> bool:
    from jobs.pids import started_at

    started = started_at(handle)
    return started is not None and started >= when - 2.0


def live_ranks(record: RunRecord, state: dict[str, Any]) -> list[ProcHandle]:
    """Rank processes of the run that still run (each proven by start time and command line)."""
    out = []
    tasks = state.get("tasks")
    for entry in tasks.values() if isinstance(tasks, dict) else ():
        ranks = entry.get("ranks") if isinstance(entry, dict) else None
        for data in ranks if isinstance(ranks, list) else ():
            handle = ProcHandle.from_json(data)
            if handle is not None and handle.alive() and is_rank(handle.pid, record):
                out.append(handle)
    return out


def local_states(record: RunRecord) -> dict[str, JobInfo]:
    """States of a local run from its supervisor's state file, told the truth by the processes:
    a supervisor that is gone (killed) leaves FAILED tasks, or RUNNING while orphaned ranks
    are still stopping."""
    from jobs.localrun import read_state

    state = read_state(record.run_dir)
    alive = supervisor(record, state) is not None
    orphans = bool(live_ranks(record, state)) if not alive else False
    out: dict[str, JobInfo] = {}
    tasks = state.get("tasks")
    tasks = tasks if isinstance(tasks, dict) else {}
    for job_id in record.job_ids():
        entry = tasks.get(job_id)
        entry = entry if isinstance(entry, dict) else {}
        name = entry.get("state")
        name = name if isinstance(name, str) else ("PENDING" if alive else "FAILED")
        why = entry.get("reason")
        why = why if isinstance(why, str) else ""
        if name not in FINAL_LOCAL and not alive:
            if orphans:
                name, why = "RUNNING", "local supervisor is gone; its ranks are stopping"
            else:
                name, why = "FAILED", "local supervisor is gone"
        codes = entry.get("exit_codes")
        codes = [c for c in codes if isinstance(c, int)] if isinstance(codes, list) else []
        code = next((c for c in codes if c != 0), 0) if codes else None
        out[job_id] = JobInfo(job_id, name, exit_code=code, reason=why, source="local")
    return out


def states_many(
    runs: list[RunRecord], client: ClientFactory, *, ttl_s: float | None = None, fresh: bool = False
) -> dict[str, JobInfo]:
    """States of every task of several runs: ONE Slurm query for all Slurm runs together,
    shared with other shells for ``ttl_s`` seconds (:mod:`jobs.statecache`).

    A job id is the run's only on the cluster it was submitted to and while Slurm's job is the
    one submitted (same job name): a run of another cluster is UNKNOWN without asking, and an
    answer about another job that got the id is UNKNOWN too, never shown as the run's.
    """
    from jobs.statecache import TTL_S, slurm_states

    out: dict[str, JobInfo] = {}
    slurm_runs = [r for r in runs if r.executor == "slurm" and r.job_id]
    if slurm_runs:
        client = functools.cache(client)
        here = _cluster_name(client) if any(r.cluster for r in slurm_runs) else ""
        elsewhere = [r for r in slurm_runs if r.cluster and here and r.cluster != here]
        for r in elsewhere:
            why = f"{OTHER_CLUSTER} {r.cluster}; this shell's Slurm is {here}"
            out.update({j: JobInfo(j, "UNKNOWN", reason=why) for j in r.job_ids()})
        asked = [r for r in slurm_runs if r not in elsewhere]
        scopes: dict[str, str] = {}
        for r in asked:  # every array of a split sweep
            for jid in r.slurm_job_ids():
                # an id asked for two runs at once (reused) is kept for neither
                scopes[jid] = r.run_id if scopes.get(jid, r.run_id) == r.run_id else ""
        ttl = TTL_S if ttl_s is None else ttl_s
        found = slurm_states(
            [j for r in asked for j in r.slurm_job_ids()],
            client,
            ttl_s=ttl,
            fresh=fresh,
            scopes={j: s for j, s in scopes.items() if s},
            cluster=here or (_cluster_name(client) if asked else ""),
        )
        for r in asked:
            links = r.chain_job_ids and _chain_state(r, found)  # a chain: one run, its links'
            for jid in r.job_ids():
                info = (
                    links or found.get(jid) or JobInfo(jid, "UNKNOWN", reason="not known to Slurm")
                )
                if info.name and r.name and info.name != r.name:
                    why = f"{REUSED}: Slurm's job {jid} is another job ({info.name}); ours is gone"
                    info = JobInfo(jid, "UNKNOWN", reason=why)
                out[jid] = info
    for r in runs:
        if r.executor == "local":
            out.update(local_states(r))
    for r in runs:
        for jid in r.job_ids():
            if jid in out and r.cancel_requested(jid):
                out[jid] = cancelling(out[jid], r.cancel_requested_at)
    return out


def _chain_state(record: RunRecord, found: dict[str, JobInfo]) -> JobInfo | None:
    from jobs.chain import chain_state

    return chain_state(record, found)


def cancelling(info: JobInfo, asked_at: float | None) -> JobInfo:
    """``info`` of a task ``jobs cancel`` asked to cancel: CANCELLING until Slurm (or the local
    supervisor) says it is over; what it says meanwhile is kept in the reason."""
    if _finished(info) or info.state in ("UNKNOWN", CANCELLING):
        return info
    ago = max(0, int(time.time() - asked_at)) if asked_at is not None else None
    when = f"cancel asked {ago} s ago" if ago is not None else "cancel asked"
    was = "the local run" if info.source == "local" else "Slurm"
    why = f"{when}; {was} still shows {info.state} until it is done"
    return dataclasses.replace(info, state=CANCELLING, reason=why)


def _cluster_name(client: ClientFactory) -> str:
    """The cluster the client talks to ("" when it cannot say)."""
    value = client().cluster_name()
    return value if isinstance(value, str) else ""


def task_states(record: RunRecord, client: ClientFactory) -> dict[str, JobInfo]:
    return states_many([record], client)


def reason(info: JobInfo) -> str:
    """Why a job waits (sacct keeps a pending reason after the job ran: drop it then)."""
    if info.terminal and info.source != "local":
        return ""
    return "" if info.reason in ("", "None") else info.reason


def outcome(states: dict[str, JobInfo]) -> int:
    """0 iff every task COMPLETED."""
    return 0 if states and all(s.state == "COMPLETED" for s in states.values()) else 1


def _finished(info: JobInfo) -> bool:
    """Over for good: a Slurm terminal state, or a local run's final one."""
    return info.terminal or (info.source == "local" and info.state in FINAL_LOCAL)


def print_logs(record: RunRecord, rank: int, only: str | None, out: IO[str]) -> int:
    """Print the rank-``rank`` log of one task or of every task (with headers)."""
    ids = [only] if only else (record.chain_job_ids or record.job_ids())  # a chain: every link
    found = 0
    for jid in ids:
        path = record.log_file(jid, rank)
        if not path.exists():
            continue
        found += 1
        if len(ids) > 1:
            out.write(f"==> {jid} rank {rank}: {path} <==\n")
        with path.open("r", encoding="utf-8", errors="replace") as f:
            for chunk in iter(lambda: f.read(65536), ""):
                out.write(chunk)
    out.flush()
    return found


def cancel(record: RunRecord, client: ClientFactory, only: str | None = None) -> list[str]:
    """Cancel the run (or one task of it); returns what was cancelled ([]: nothing runs).

    A local run is signalled only through handles proven to be this run's processes (start
    time and command line, :mod:`jobs.pids`): an ended run's PID may be anyone's by now.
    """
    if record.executor == "local":
        if only is not None and only != record.job_id:
            from jobs.errors import UsageError

            raise UsageError(
                f"cancel: {only} is one task of a local run; cancel the run ({record.job_id})"
            )
        return _cancel_local(record)
    # Every array of a split sweep, the last first: each waits (afterany) on the one before, so
    # cancelling an earlier one first would let the next one start.
    target = [only] if only else list(reversed(record.slurm_job_ids()))
    # A run that is over is left alone (scancel of an ended job is an error, and a no-op).
    states = states_many([record], client, ttl_s=0.0)
    mine = [i for j, i in states.items() if only is None or j == only or j.startswith(f"{only}_")]
    foreign = next((i for i in mine if i.reason.startswith(OTHER_CLUSTER)), None)
    if foreign is not None:  # the id names another cluster's job here: never scancel it
        from jobs.errors import UsageError

        raise UsageError(
            f"cancel: {record.run_id}: {foreign.reason} "
            "(cancel it with SLURM_CONF naming that cluster)"
        )
    if mine and all(i.terminal or i.reason.startswith(REUSED) for i in mine):
        return []
    # Not requeueable first: neither Slurm nor train's guard may bring a cancelled job back.
    client().cancel(target, no_requeue=True)
    _cancel_asked(record, target)
    return target


def _cancel_asked(record: RunRecord, target: list[str]) -> None:
    """After the cancel went out: the record status/list read (CANCELLING until confirmed),
    and no cached state of these jobs from before it (jobs.statecache)."""
    from jobs.records import mark_cancel
    from jobs.statecache import forget

    mark_cancel(record, target)
    forget(target)


def _cancel_local(record: RunRecord) -> list[str]:
    from jobs.localrun import read_state

    state = read_state(record.run_dir)
    sup = supervisor(record, state)
    # The supervisor stops its ranks, records CANCELLED and restarts nothing.
    ours = sup is not None and signal_if_ours(
        sup, signal.SIGTERM, lambda pid: is_supervisor(pid, record)
    )
    # Killed supervisor: its orphaned ranks (if any still run) are stopped directly.
    sent = ours or any([
        signal_if_ours(h, signal.SIGTERM, lambda pid: is_rank(pid, record))
        for h in live_ranks(record, state)
    ])  # fmt: skip
    if not sent:
        return []
    _cancel_asked(record, [record.job_id])
    return [record.job_id]


def events_summary(record: RunRecord) -> dict[str, str]:
    """Per task run dir: the requeue history in a few words."""
    # train.history is torch-free: jobs and train read the same file the same way.
    from train.history import RunHistory

    out = {}
    for task in record.tasks:
        history = RunHistory(task.run_dir)
        out[task.run_dir] = history.summary() if history.events() else ""
    return out


def last_failures(record: RunRecord) -> dict[str, dict[str, Any]]:
    """Per task run dir: its newest ``failure`` event (error, exit code or signal, the last
    lines of stderr), when it has one."""
    from train.history import RunHistory

    out = {}
    for task in record.tasks:
        failures = [e for e in RunHistory(task.run_dir).events() if e["event"] == "failure"]
        if failures:
            out[task.run_dir] = failures[-1]
    return out


def describe_failure(event: dict[str, Any], tail: int = 3) -> list[str]:
    """A failure event in a few lines: ``error: ...`` (the exception line of its traceback,
    whole, also for an event recorded with the last stderr line), ``cause: ...`` (the rule
    that sorted it, train.stop.causes; the root rank of several), and the last ``tail`` lines
    of stderr."""
    from train.stop import exception_line

    error = event.get("error")
    stderr = event.get("stderr_tail")
    if isinstance(error, str) and isinstance(stderr, list):
        exc = exception_line(stderr)
        head, sep, said = error.partition(": ")
        if exc and sep and head.startswith("command ") and said != exc:
            error = f"{head}: {exc}"
    lines = [f"error: {error}"] if isinstance(error, str) and error else []
    cause = event.get("cause")
    if isinstance(cause, str) and cause:
        root = event.get("root_rank")
        cascade = event.get("cascade")
        more = f", rank {root} failed first" if isinstance(root, int) and cascade else ""
        lines.append(f"cause: {cause}{more}")
    if isinstance(stderr, list):
        lines += [f"| {line}" for line in stderr[-tail:] if isinstance(line, str)]
    return lines


def progress_summary(record: RunRecord) -> dict[str, dict[str, object]]:
    """Per task run dir: newest step, loss and test accuracy (from train's metrics.jsonl)."""
    from jobs.records import latest_progress

    return {t.run_dir: latest_progress(t.run_dir) for t in record.tasks}
