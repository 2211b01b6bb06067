"""Who owns a run directory: one run, from the moment a submission claims it.

    RUN_DIR/.owner        {"run_id", "submitter" (a jobs.pids.ProcHandle), "host", "time"}
    RUN_DIR/.owner.lock   held (flock) while a claim is judged and written

``jobs submit`` claims its run directory before it writes anything into it. A generated
directory is new (created exclusively); an explicit ``train.run_dir`` may hold an earlier run,
which must be proven over before the directory changes hands:

- the earlier owner's ``run.json`` is not written yet: its submission is still in progress
  while the submitting process lives (proven by PID + start time + boot, :mod:`jobs.pids`;
  a submitter on another host: for :data:`CLAIM_GRACE_S` after its claim);
- a Slurm run: ONE query for all its jobs (:func:`jobs.monitor.states_many`, fresh); any job
  that is not over (pending, running, requeued, suspended...) makes the run live. When Slurm
  cannot be asked, or the run was submitted to another cluster, nothing proves it over: refused;
- a local run: its supervisor or one of its ranks still runs (:mod:`jobs.monitor`).

A directory inside another run's directory (``RUN/tasks/3``, a sweep's task) is judged by that
run. The claim itself is an exclusive create of ``.owner`` under the lock, so of two racing
submissions exactly one wins and the other sees the winner's claim. A run that is over leaves
its directory to the next submission (resuming in place, as before).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.errors import RunDirBusyError, RunNotFoundError
from jobs.pids import ProcHandle
from jobs.records import RECORD, Plan, RunRecord, load_record
from train import runfiles
from train.runfiles import open_fd

if TYPE_CHECKING:
    from cluster import Slurm

ClientFactory = Callable[[], "Slurm"]
OWNER = runfiles.OWNER
LOCK = runfiles.OWNER_LOCK
CLAIM_GRACE_S = 600.0  # a submission on another host: its claim counts as live this long


def _owner_data(run_dir: Path) -> dict[str, Any] | None:
    """``.owner`` as written, None when missing; a damaged one names no run (``{}``)."""
    try:
        data = json.loads((run_dir / OWNER).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _record(run_dir: Path) -> RunRecord | None:
    if not (run_dir / RECORD).exists():
        return None
    try:
        return load_record(run_dir)
    except RunNotFoundError:
        return None  # a damaged record proves nothing runs; its claim (if any) is judged


def _claim_live(data: dict[str, Any]) -> str | None:
    """Why a claim whose run has no record yet is still a submission in progress (or None)."""
    handle = ProcHandle.from_json(data.get("submitter"))
    host, when = data.get("host"), data.get("time")
    if handle is not None and host == socket.gethostname():
        return "its submission is in progress" if handle.alive() else None
    fresh = isinstance(when, int | float) and 0 <= time.time() - when <= CLAIM_GRACE_S
    return f"its submission on {host} is in progress" if fresh else None


def _run_live(record: RunRecord, client: ClientFactory) -> str | None:
    """Why ``record``'s run is live or pending (one Slurm query, or its local processes), or
    None when it is over. Raises :class:`RunDirBusyError` when that cannot be proven."""
    from cluster.errors import ClusterError
    from jobs.monitor import OTHER_CLUSTER, live_ranks, states_many, supervisor

    if record.executor == "local":
        from jobs.localrun import read_state

        state = read_state(record.run_dir)
        if supervisor(record, state) is not None:
            return f"its local supervisor (pid {record.pid}) runs"
        return "its local ranks are still stopping" if live_ranks(record, state) else None
    if not record.job_id:
        return None
    try:
        states = states_many([record], client, ttl_s=0.0, fresh=True)
    except ClusterError as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise RunDirBusyError(
            f"{record.run_dir}: belongs to run {record.run_id} (job {record.job_id}) and Slurm "
            f"cannot say whether it is over ({first}); try again when Slurm answers"
        ) from None
    for jid, info in states.items():
        if info.reason.startswith(OTHER_CLUSTER):
            raise RunDirBusyError(
                f"{record.run_dir}: belongs to run {record.run_id} (job {record.job_id}), "
                f"{info.reason}: ask there (python -m jobs status {record.run_id}), or choose "
                "another train.run_dir"
            )
        if not info.terminal and info.state != "UNKNOWN":
            return f"job {jid} is {info.state}"
    return None


def _judge(run_dir: Path, client: ClientFactory) -> tuple[str, str] | None:
    """(owner run id, why it is live) when ``run_dir`` belongs to a live or pending run."""
    owner = _owner_data(run_dir)
    record = _record(run_dir)
    if owner and (record is None or record.run_id != owner.get("run_id")):
        why = _claim_live(owner)
        if why is not None:
            return str(owner.get("run_id") or "?"), why
    if record is not None:
        why = _run_live(record, client)
        if why is not None:
            return record.run_id, why
    return None


def _enclosing(run_dir: Path) -> Iterator[Path]:
    """Directories above ``run_dir`` that hold a run (a sweep's root above its task dirs)."""
    for parent in run_dir.parents:
        if (parent / RECORD).exists() or (parent / OWNER).exists():
            yield parent
            return


def _busy(run_dir: Path, owner: str, why: str, inside: Path | None = None) -> RunDirBusyError:
    where = f" (inside {inside}, the directory of run {owner})" if inside else ""
    return RunDirBusyError(
        f"{run_dir}: belongs to run {owner}{where}, which is not over: {why}; wait for it to end "
        f"or cancel it (python -m jobs cancel {owner}), or choose another train.run_dir"
    )


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    fd = open_fd(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_owner(run_dir: Path, run_id: str) -> None:
    """Create ``.owner`` exclusively (a stale one, judged over under the lock, is removed first)."""
    me = ProcHandle.of(os.getpid())
    data = {
        "run_id": run_id,
        "submitter": me.to_json() if me else None,
        "host": socket.gethostname(),
        "time": round(time.time(), 3),
    }
    path = run_dir / OWNER
    runfiles.remove(path)  # ours only: another user's claim (or a link) is refused
    if not runfiles.create_exclusive(path, json.dumps(data, sort_keys=True) + "\n"):
        raise FileExistsError(errno.EEXIST, f"{path}: claimed by another submission meanwhile")


def claim(plan: Plan, client: ClientFactory) -> Plan:
    """Make ``plan``'s run directory this submission's, before anything is written into it.

    Raises :class:`RunDirBusyError` (one line, exit 2) when it belongs to a live or pending
    run, OSError when it cannot be created.
    """
    if not plan.explicit:
        plan = plan.claim()  # a new directory, created exclusively
        _write_owner(plan.run_dir, plan.run_id)
        return plan
    run_dir = plan.run_dir
    for outer in _enclosing(run_dir):
        found = _judge(outer, client)
        if found is not None:
            raise _busy(run_dir, found[0], found[1], inside=outer)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _locked(run_dir):
        found = _judge(run_dir, client)
        if found is not None:
            raise _busy(run_dir, *found)
        _write_owner(run_dir, plan.run_id)
    return plan


def release(plan: Plan) -> None:
    """Give the directory back after a submission that did not happen (its claim only)."""
    owner = _owner_data(plan.run_dir)
    if owner and owner.get("run_id") == plan.run_id:
        with contextlib.suppress(OSError):
            runfiles.remove(plan.run_dir / OWNER)
