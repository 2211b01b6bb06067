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

When the records do not tell one story (``run.json`` damaged, another directory's, older than
the claim beside it, or missing beside a run's files), nothing proves the run over, so every
sign of life is looked for (:func:`_signs_of_life`): a job the index or the damaged record
names that Slurm does not call over (one query), a process on this host that names the
directory (a local supervisor or rank, a task of a job on this node), a write to the run's
own files (events, metrics, logs, checkpoints) in the last :data:`RECENT_S` seconds. Any
sign refuses the directory, in one line that says how to proceed; none leaves it to the next
submission, as a run that is over does.

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
from jobs.pids import ProcHandle, cmdline
from jobs.records import RECORD, Plan, RunRecord, load_record
from train import runfiles
from train.runfiles import open_fd

if TYPE_CHECKING:
    from cluster import Slurm

ClientFactory = Callable[[], "Slurm"]
OWNER = runfiles.OWNER
LOCK = runfiles.OWNER_LOCK
CLAIM_GRACE_S = 600.0  # a submission on another host: its claim counts as live this long
# Records in doubt: a write to the run's own files this recent is a sign that it lives.
RECENT_S = 600.0
# What a run (not a submission) writes in its directory, and in each task directory of a sweep.
RUN_FILES = (runfiles.EVENTS_FILE, runfiles.METRICS_FILE)
RUN_FOLDERS = (runfiles.LOGS, runfiles.SLURM_DIR, runfiles.CHECKPOINTS, runfiles.PROGRESS)
SCAN_LIMIT = 20000  # entries looked at for recent writes (a sweep of thousands of tasks)


def _owner_data(run_dir: Path) -> dict[str, Any] | None:
    """``.owner`` as written, None when missing; a damaged one names no run (``{}``)."""
    try:
        data = json.loads((run_dir / OWNER).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def owner_id(run_dir: Path) -> str:
    """The run id of ``run_dir``'s claim ("" when there is none or it names no run)."""
    data = _owner_data(run_dir)
    return str(data.get("run_id") or "") if data else ""


def _record(run_dir: Path) -> tuple[RunRecord | None, str | None]:
    """``run.json`` and why it cannot be trusted (None: it can; (None, None): there is none)."""
    if not os.path.lexists(run_dir / RECORD):
        return None, None
    try:
        record = load_record(run_dir)
    except RunNotFoundError as exc:
        text = str(exc)
        cause = text.partition("not a readable run record (")[2].removesuffix(")") or text
        return None, f"its run.json is damaged ({cause[:120]})"
    if not _same_dir(record.run_dir, run_dir):
        return record, f"its run.json is the record of another directory ({record.run_dir})"
    return record, None


def _same_dir(a: str | Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return os.path.abspath(a) == os.path.abspath(b)


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
    from cluster import ClusterError
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


def _judge(run_dir: Path, client: ClientFactory) -> tuple[str, str, str] | None:
    """(owner run id, why it is live, what to do) when ``run_dir`` belongs to a live or pending
    run, or when its records are in doubt and a sign says a run lives there."""
    owner = _owner_data(run_dir)
    owner_id = str(owner.get("run_id") or "") if owner else ""
    record, doubt = _record(run_dir)
    if owner and (record is None or doubt is not None or record.run_id != owner_id):
        why = _claim_live(owner)
        if why is not None:
            return owner_id or "?", why, ""
    if record is not None and doubt is None:
        why = _run_live(record, client)
        if why is not None:
            return record.run_id, why, ""
        if not owner_id or owner_id == record.run_id:
            return None  # the records agree: the run is over
        doubt = f"its run.json is run {record.run_id}'s but its claim is run {owner_id}'s"
    elif doubt is None:
        doubt = "it has no run.json"
    return _signs_of_life(run_dir, doubt, owner_id or (record.run_id if record else ""), client)


def _signs_of_life(
    run_dir: Path, doubt: str, owner: str, client: ClientFactory
) -> tuple[str, str, str] | None:
    """The records of ``run_dir`` are in doubt (``doubt`` says how): any sign that a run lives
    there (module docstring) as (owner, why, what to do); None when there is none."""
    owner = owner or "?"
    other = "or choose another train.run_dir"
    jobs = _named_jobs(run_dir)
    if jobs:
        from cluster import ClusterError
        from jobs.statecache import slurm_states

        try:
            states = slurm_states(list(jobs), client, ttl_s=0.0, fresh=True)
        except ClusterError as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            ids = ", ".join(jobs)
            why = f"{doubt}, and Slurm cannot say whether job {ids} is over ({first})"
            return jobs[next(iter(jobs))] or owner, why, f"try again when Slurm answers, {other}"
        for jid, info in sorted(states.items()):
            if not info.terminal and info.state != "UNKNOWN":
                base = jid.split("_", 1)[0]
                why = f"{doubt}, and job {jid} is {info.state}"
                return jobs.get(base) or owner, why, f"cancel it (scancel {base}), {other}"
    pid = _process_in(run_dir)
    if pid is not None:
        why = f"{doubt}, and process {pid} ({' '.join(cmdline(pid))[:80]}) runs in it"
        return owner, why, f"wait for it to end or stop it (kill {pid}), {other}"
    newest = _last_write(run_dir)
    if newest is not None:
        path, age = newest
        left = RECENT_S - age
        why = f"{doubt}, and {path.relative_to(run_dir)} was written {age:.0f} s ago"
        what = (
            f"if nothing runs there any more, submit again once it has been quiet for "
            f"{RECENT_S / 60:.0f} min (in {left:.0f} s), {other}"
        )
        return owner, why, what
    return None


def _named_jobs(run_dir: Path) -> dict[str, str]:
    """Slurm job ids that a record of ``run_dir`` names (its index lines, a damaged run.json
    read leniently), each with its run id ("" unknown)."""
    from jobs.records import read_index

    found: dict[str, str] = {}
    for entry in read_index(report=False):
        if entry.get("executor", "slurm") == "slurm" and _same_dir(entry["run_dir"], run_dir):
            job = entry.get("job_id")
            if isinstance(job, str) and job:
                found[job] = str(entry.get("run_id") or "")
    try:
        data = json.loads((run_dir / RECORD).read_bytes().decode("utf-8", "replace"))
    except (OSError, ValueError, RecursionError):
        data = None
    if isinstance(data, dict) and data.get("executor", "slurm") == "slurm":
        named = data.get("run_id")
        run_id = named if isinstance(named, str) else ""
        arrays = data.get("array_job_ids")
        for job in [data.get("job_id"), *(arrays if isinstance(arrays, list) else [])]:
            if isinstance(job, str) and job.split("_", 1)[0].isdigit():
                found.setdefault(job.split("_", 1)[0], run_id)
    return {j: r for j, r in found.items() if j.split("_", 1)[0].isdigit()}


def _process_in(run_dir: Path) -> int | None:
    """A process on this host (not this one) with ``run_dir`` or a path under it as one of
    its arguments: a local supervisor or rank, a task of a job on this node."""
    want = os.path.abspath(run_dir)
    mine = {os.getpid(), os.getppid()}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if pid in mine:
            continue
        for arg in cmdline(pid):
            if arg == want or arg.startswith(want + os.sep):
                return pid
    return None


def _last_write(run_dir: Path) -> tuple[Path, float] | None:
    """The newest write (path, seconds ago) to a run's own files under ``run_dir`` (and its
    tasks') in the last :data:`RECENT_S` seconds; None when there is none."""
    now = time.time()
    newest: tuple[Path, float] | None = None
    seen = 0
    tasks = run_dir / runfiles.TASKS_DIR
    dirs = [run_dir]
    with contextlib.suppress(OSError), os.scandir(tasks) as it:
        dirs += [tasks / e.name for e in it if e.is_dir(follow_symlinks=False)]
    for base in dirs:
        paths = [base / name for name in RUN_FILES]
        for folder in RUN_FOLDERS:
            if folder != runfiles.SLURM_DIR:  # the submission writes its pickles there too
                paths.append(base / folder)
            with contextlib.suppress(OSError), os.scandir(base / folder) as it:
                for entry in it:
                    seen += 1
                    if seen > SCAN_LIMIT:
                        break
                    if folder != runfiles.SLURM_DIR or entry.name.endswith(
                        (".out", ".err", ".log")
                    ):
                        paths.append(base / folder / entry.name)  # not a submission's pickles
        for path in paths:
            try:
                mtime = path.lstat().st_mtime
            except OSError:
                continue
            age = max(0.0, now - mtime)
            if age < RECENT_S and (newest is None or age < newest[1]):
                newest = (path, age)
        if seen > SCAN_LIMIT:
            break
    return newest


def _enclosing(run_dir: Path) -> Iterator[Path]:
    """Directories above ``run_dir`` that hold a run (a sweep's root above its task dirs)."""
    for parent in run_dir.parents:
        if (parent / RECORD).exists() or (parent / OWNER).exists():
            yield parent
            return


def _busy(
    run_dir: Path, owner: str, why: str, what: str = "", inside: Path | None = None
) -> RunDirBusyError:
    where = f" (inside {inside}, the directory of run {owner})" if inside else ""
    what = what or (
        f"wait for it to end or cancel it (python -m jobs cancel {owner}), "
        "or choose another train.run_dir"
    )
    return RunDirBusyError(
        f"{run_dir}: belongs to run {owner}{where}, which is not over: {why}; {what}"
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
            raise _busy(run_dir, *found, inside=outer)
    runfiles.make_dirs(run_dir)  # RunDirError: the place cannot hold a directory
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
