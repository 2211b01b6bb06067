"""The one owner of the run directory and of node-local state (torch-free: the stdlib only,
and the bad-input marker of :mod:`cluster.errors`).

Three things live here and nowhere else:

- **the layout**: every name inside ``RUN_DIR`` (:data:`SPEC`, :data:`RESOLVED`,
  :data:`EVENTS_FILE`, ...) and :data:`LAYOUT`, the table of who writes and who reads each one
  (ARCHITECTURE.md shows it; a test keeps the two the same);
- **the only writers**: :func:`atomic_write` (a temporary file, fsync, rename),
  :func:`append_line`, :func:`create_exclusive`, :func:`write_text` / :func:`open_text` /
  :func:`touch`, :func:`make_dirs`, :func:`rename`, :func:`remove` and, for node-local state,
  :func:`private_dir` and :func:`remove_own_tree`;
- **the table of event kinds** (:data:`EVENT_KINDS`, :data:`FAILURE_KINDS`): what ends an
  attempt, which budget an event spends, its label and its plot colour. Every list of event
  names elsewhere (``train.history``, ``train.stop.decision.EVENT_OF_KIND``, ``jobs.goodput``,
  ``jobs.follow``, ``jobs.drill``, ``jobs.plot``, ...) is derived from it.

Links. A link planted in a shared run directory (``events.jsonl -> ~/.bashrc``) must not make
a rank or ``jobs`` truncate, append to, rename over or delete a file elsewhere. Every open is
``O_NOFOLLOW`` (the open fails with ``ELOOP`` before anything is truncated, and the error says
which path is a link); renames and deletes work on the entry in a directory opened with
``O_NOFOLLOW`` (``dir_fd``), never on what a link names; :func:`remove` deletes only a regular
file owned by this user. The run directory itself is the user's choice (it may sit under a
link they made, ``/scratch -> /lustre/...``); below it, :func:`make_dirs` walks one directory
at a time, refusing links. Checkpoints follow the same rule in :mod:`train.checkpoint`.

Node-local state (hang heartbeats under ``/dev/shm``) and the state folder
(``$SLURM_TRAIN_STATE_DIR``) sit in places other users can write to or predict. Their folders
come from :func:`private_dir`: created ``0700``, then checked (``fstat`` of the directory
opened without following a link: a directory, owned by this user; one of ours that is open
to others is closed),
walked from a root one directory fd at a time so that no planted parent is ever followed.
Anything else is refused with one line (:class:`NotOursError`). A clean-up
(:func:`remove_own_tree`) deletes only entries owned by this user, never through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from cluster import BadInputError

__all__ = [
    "BUDGETS",
    "EVENTS",
    "EVENT_KINDS",
    "EVENT_OF_KIND",
    "FAILURE_CLASSES",
    "FAILURE_KINDS",
    "LAYOUT",
    "EventKind",
    "FailureKind",
    "LayoutEntry",
    "LinkRefusedError",
    "NotOursError",
    "RunDirError",
    "append_line",
    "atomic_write",
    "create_exclusive",
    "default_run_dir",
    "events_where",
    "make_dirs",
    "node_local_parts",
    "open_dir",
    "open_fd",
    "open_text",
    "private_dir",
    "remove",
    "remove_own_tree",
    "rename",
    "touch",
    "write_text",
]

# -- the layout -------------------------------------------------------------------------------
SPEC = "spec.yaml"  # the spec as written
RESOLVED = "resolved.yaml"  # the validated spec after --set (a sweep: also tasks/N/resolved.yaml)
RUN_RECORD = "run.json"  # jobs.records.RunRecord
SBATCH = "sbatch.sh"  # the submitted script (sbatch-K.sh for a sweep's K-th array)
SLURM_DIR = "slurm"  # submitit pickles and per-rank logs
TASKS_DIR = "tasks"  # a sweep's task directories: tasks/N
EVENTS_FILE = "events.jsonl"  # the history (train.history)
METRICS_FILE = "metrics.jsonl"  # the metrics, rank 0
CHECKPOINTS = "checkpoints"  # step-N/, step-N.bB/, branch.json (train.checkpoint)
CONFIGS = "configs"  # configs/HASH.json (train.resume)
LOGS = "logs"  # logs/rank-R.log (train.logsetup)
TENSORBOARD = "tensorboard"
WANDB_ID = "wandb-id"
PROGRESS = ".progress"  # .progress/JOB-RESTART/rank-R.json, nodes/NODE.json
HANGS = "hangs"  # hangs/JOB-RESTART/: claimed, decided, stacks, reports
FAILURES = ".failures"  # .failures/JOB-RESTART: one failure record per attempt
STOPS = ".stops"  # .stops/JOB-RESTART/R: a rank's command exited
LOCAL_STATE = "local_state.json"  # the local executor's state
LOCAL_STOP = ".local-stop"  # "cancel": the local executor's ranks stop for good
OWNER = ".owner"  # jobs.claim: who owns the directory
OWNER_LOCK = ".owner.lock"
DRILL_DIR = "drill"  # jobs drill's preempting job
RUN_INDEX = "runs.jsonl"  # in the state folder ($SLURM_TRAIN_STATE_DIR), not in RUN_DIR


class LayoutEntry:
    """One name in the run directory: what it holds, who writes it (through this module's
    writers), who reads it. (Plain classes here, not dataclasses: ``python -m jobs`` imports
    this module, and building a dataclass or a NamedTuple costs milliseconds.)"""

    __slots__ = ("holds", "path", "reader", "writer")

    def __init__(self, path: str, holds: str, writer: str, reader: str) -> None:
        self.path, self.holds, self.writer, self.reader = path, holds, writer, reader


#: The run directory. ARCHITECTURE.md's table "Files a run leaves behind" is this table
#: (tests/unit/train/test_runfiles.py renders it and compares).
LAYOUT: tuple[LayoutEntry, ...] = (
    LayoutEntry(SPEC, "the spec as written", "`jobs/submit.py`", "people"),
    LayoutEntry(RESOLVED, "the validated spec after `--set` (a sweep: also in `tasks/N/`)",
                "`jobs/submit.py` (a lazy sweep's task: `jobs/launch.py`, at its start)",
                "`python -m train`"),
    LayoutEntry(SBATCH, "the submitted script (`sbatch-K.sh`: a sweep's K-th array)",
                "`jobs/submit.py`", "sbatch, people"),
    LayoutEntry(SLURM_DIR, "submitit pickles, per-rank logs, the local supervisor's log",
                "`jobs/submit.py`, Slurm", "submitit, `jobs logs`"),
    LayoutEntry(TASKS_DIR, "a sweep's task directories `tasks/N/` (each a run directory)",
                "`jobs/submit.py`", "`jobs status/logs`"),
    LayoutEntry(RUN_RECORD, "job ids, executor, times, sweep points (`RunRecord`); a line in "
                "`$SLURM_TRAIN_STATE_DIR/runs.jsonl` names it",
                "`jobs/records.py` (atomic)", "`status/list/logs/cancel`"),
    LayoutEntry(EVENTS_FILE, "the history: one event a line (kinds: `EVENT_KINDS`)",
                "`train/history.py` (through `train/stop/act.py`, the session, the hang "
                "watcher, the command supervisor; appended)",
                "budgets, `status`, `--follow`, `plot`"),
    LayoutEntry(METRICS_FILE, "rank 0's metrics (`train` lines carry interval saves' "
                "`checkpoint_s`, `eval` lines their `seconds`; `report` lines: a script's "
                "`train.report`)", "`train/loop/metrics.py`, `train/report.py`",
                "`status`, `--follow`, `plot`, the goodput ledger"),
    LayoutEntry(CHECKPOINTS, "`step-N/`, `step-N.bB/` (`manifest.json` last, with `run_id`, "
                "`branch`, `parents`); `branch.json` (the current branch)",
                "`train/checkpoint/` (`branch.json`: `train/resume.py` decides, rank 0 writes "
                "it through `train/checkpoint/branches.py`)", "resume, pruning"),
    LayoutEntry(CONFIGS, "`configs/<config_hash>.json`", "`train/resume.py` (atomic)",
                "the config-change check on resume"),
    LayoutEntry(LOGS, "`logs/rank-R.log`", "`train/logsetup.py`", "`jobs logs`, people"),
    LayoutEntry(TENSORBOARD, "TensorBoard scalars", "`train/tracking.py`", "TensorBoard"),
    LayoutEntry(WANDB_ID, "the W&B run id (a resume continues that run)",
                "`train/tracking.py`", "W&B"),
    LayoutEntry(PROGRESS, "`.progress/JOB-RESTART/rank-R.json` (once per rank), "
                "`.progress/JOB-RESTART/nodes/NODE.json` (one per node, every 10 s; every "
                "quarter of a short timeout while its ranks are silent)",
                "`train/hang/heartbeat.py`, `train/hang/watcher.py`", "the hang watchers"),
    LayoutEntry(HANGS, "`hangs/JOB-RESTART/`: `claimed`, `decided`, each rank's stacks and "
                "report", "`train/hang/watcher.py` (the claim: `train/stop/claims.py`)",
                "the hang watchers, the stop path (`hang_claimed`), people"),
    LayoutEntry(FAILURES, "`.failures/JOB-RESTART`: one failure record per attempt; "
                "`.failures/JOB-RESTART.ranks/MS-R.json`: a rank's command exited non-zero "
                "(when, its error, its stderr tail)",
                "`train/stop/act.py` (exclusive create), `train/command/rootcause.py` (atomic)",
                "`train/stop/act.py`; the supervisor that records the failure (the root, not "
                "its cascade)"),
    LayoutEntry(STOPS, "`.stops/JOB-RESTART/R`: a rank's command exited",
                "`train/command/stop.py`", "rank 0's supervisor, before it requeues"),
    LayoutEntry(LOCAL_STATE, "the local executor's state", "`jobs/localrun.py` (atomic)",
                "`jobs/monitor.py`"),
    LayoutEntry(LOCAL_STOP, "`cancel`: the local executor's ranks stop for good",
                "`jobs/localrun.py` (atomic; removed only when ours)", "`train/stop/facts.py`"),
    LayoutEntry(OWNER, "who owns the directory: run id, submitter, host, time",
                "`jobs/claim.py` (exclusive create under the lock; removed only when ours)",
                "`jobs/claim.py` (the next submission naming the directory)"),
    LayoutEntry(OWNER_LOCK, "held (flock) while a claim is judged and written",
                "`jobs/claim.py`", "`jobs/claim.py`"),
    LayoutEntry(DRILL_DIR, "`drill/preempt.sbatch`: the preempting job of `jobs drill`",
                "`jobs/drill.py`", "sbatch"),
)  # fmt: skip


# -- the table of event kinds -----------------------------------------------------------------
class EventKind:
    """One kind of ``events.jsonl`` line and everything the code knows about it."""

    __slots__ = (
        "asks_slurm", "budget", "colour", "count_key", "drill", "ends_segment", "final",
        "interrupts", "name", "settles", "stop_kinds", "summary",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        *,
        interrupts: bool = False,
        final: bool = False,
        settles: bool = False,
        ends_segment: bool = False,
        asks_slurm: bool = False,
        stop_kinds: tuple[str, ...] = (),
        budget: str | None = None,
        count_key: str | None = None,
        summary: str | None = None,
        drill: str | None = None,
        colour: str | None = None,
    ) -> None:
        self.name = name
        #: it interrupts an attempt: what ``jobs plot`` marks, what explains an attempt's end
        self.interrupts = interrupts
        #: the run is over (the last word of a run)
        self.final = final
        #: after it the batch script has nothing left to do for the attempt (train.stop.step)
        self.settles = settles
        #: the process stops training: it ends a goodput segment
        self.ends_segment = ends_segment
        #: Slurm's view of the job changes with it: ``--follow`` asks at once
        self.asks_slurm = asks_slurm
        #: the stop kinds (train.stop.decision) recorded as this event
        self.stop_kinds = stop_kinds
        #: the RequeueConfig field whose budget it spends (failures: per class, FAILURE_KINDS)
        self.budget = budget
        #: the key of its count in ``RunHistory.to_dict`` and the word of the summary line
        self.count_key = count_key
        self.summary = summary
        #: the ``jobs drill`` kind that produces it
        self.drill = drill
        #: its colour in ``jobs plot`` (interruptions)
        self.colour = colour

    def __repr__(self) -> str:
        return f"EventKind({self.name!r})"


_STOP: dict[str, Any] = {"interrupts": True, "ends_segment": True, "asks_slurm": True}
_FINAL: dict[str, Any] = {"final": True, "settles": True, "ends_segment": True, "asks_slurm": True}

#: Every event kind, in the order ``train.history.EVENTS`` lists them (``jobs drill --kind``
#: lists the drills in the order of their events here).
EVENT_KINDS: tuple[EventKind, ...] = (
    EventKind("start", asks_slurm=True),
    EventKind("resume", asks_slurm=True),
    EventKind("signal"),
    EventKind("checkpoint"),
    EventKind("requeue", settles=True, asks_slurm=True),
    # a requeue Slurm refused (train.stop.act); the batch script retries it (train.stop.step)
    EventKind("requeue_failed", asks_slurm=True),
    EventKind(
        "preempted",
        **_STOP,
        stop_kinds=("preemption", "requeued"),
        budget="max_preemptions",
        count_key="preemptions",
        summary="preempted",
        drill="preempt",
        colour="tab:orange",
    ),
    EventKind(
        "timeout",
        **_STOP,
        stop_kinds=("timeout",),
        budget="max_timeouts",
        count_key="timeouts",
        summary="timeout",
        drill="timeout",
        colour="tab:purple",
    ),
    EventKind(
        "cancelled",
        **{**_STOP, **_FINAL},
        stop_kinds=("cancel",),
        drill="cancel",
        colour="tab:gray",
    ),
    EventKind(
        "failure",
        **_STOP,
        stop_kinds=("failure",),
        count_key="failures",
        summary="failed",
        drill="fail",
        colour="tab:red",
    ),
    EventKind("target"),
    EventKind("complete", **_FINAL),
    EventKind("budget_exhausted", **_FINAL),
    EventKind(
        "hang",
        **_STOP,
        stop_kinds=("hang",),
        budget="max_hangs",
        count_key="hangs",
        summary="hung",
        colour="tab:brown",
    ),
    EventKind("quarantine"),
    EventKind(
        "node_fail",
        **_STOP,
        settles=True,
        stop_kinds=("node_fail",),
        count_key="node_failures",
        summary="node failure",
        colour="tab:pink",
    ),
    EventKind(
        "restart_in_place",
        settles=True,
        ends_segment=True,
        count_key="restarts_in_place",
        summary="restarted in place",
    ),
    # a link of a chain of jobs (jobs.chain) started: its job id, place, the checkpoint step
    EventKind("link_started", asks_slurm=True),
    # the chain is over: completed, a spent budget, no checkpoint progress (the last word)
    EventKind("chain_ended", final=True, settles=True, asks_slurm=True),
)


class FailureKind:
    """One class of failure (train.stop.causes): its budget and how messages name it."""

    __slots__ = ("budget", "label", "name", "named")

    def __init__(self, name: str, budget: str, label: str, named: str | None) -> None:
        self.name, self.budget = name, budget
        self.label = label  # in a budget message: "infrastructure failure 3x, over the budget"
        self.named = named  # in the summary's last failure: "last failure (infrastructure): ..."


#: The failure classes, in the order their budgets are checked.
FAILURE_KINDS: tuple[FailureKind, ...] = (
    FailureKind("unknown", "max_failures", "failure", None),
    FailureKind("infra", "max_infra_failures", "infrastructure failure", "infrastructure"),
    FailureKind("user", "max_user_failures", "error of the code or config", "code or config"),
)
FAILURE_CLASSES: tuple[str, ...] = tuple(f.name for f in FAILURE_KINDS)

EVENTS: tuple[str, ...] = tuple(k.name for k in EVENT_KINDS)

#: A stop's kind (train.stop.decision) -> the event recorded for it.
EVENT_OF_KIND: Mapping[str, str] = {s: k.name for k in EVENT_KINDS for s in k.stop_kinds}


def _budgets() -> dict[str, str]:
    out: dict[str, str] = {}
    for k in EVENT_KINDS:
        if k.budget:
            out[k.name] = k.budget
        if k.name == "failure":  # a failure spends the budget of its class
            out.update({f"failure_{f.name}": f.budget for f in FAILURE_KINDS})
    return out


#: What consumes a requeue budget (an event, or ``failure_CLASS``) -> the RequeueConfig field.
BUDGETS: Mapping[str, str] = _budgets()
#: How a budget message names each budget's events (the rest: the event's name).
BUDGET_LABELS: Mapping[str, str] = {f"failure_{f.name}": f.label for f in FAILURE_KINDS}


def events_where(**flags: bool) -> frozenset[str]:
    """The names of the event kinds whose columns have these values
    (``events_where(interrupts=True)``)."""
    return frozenset(
        k.name for k in EVENT_KINDS if all(getattr(k, f) == v for f, v in flags.items())
    )


# -- errors ----------------------------------------------------------------------------------
class LinkRefusedError(OSError):
    """A write inside the run directory met a symbolic link where a file should be."""


class NotOursError(LinkRefusedError, BadInputError):
    """A path that should be this user's (a private folder, a file to delete) is not: another
    user's, a link, or not what it should be. Bad input: a requeue would not help."""


class RunDirError(OSError, BadInputError):
    """The run directory cannot be made where the user put it (a file there, no permission, a
    read-only or missing place): bad input, said in one line; a requeue would not help."""

    def __str__(self) -> str:
        return str(self.strerror)


# why a run directory cannot be made that is the place the user chose, not the moment (an I/O
# error, a full disk, a stale handle stay failures of the run)
_PLACE_ERRNOS = frozenset(
    {errno.EEXIST, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EROFS,
     errno.ENAMETOOLONG, errno.ELOOP}
)  # fmt: skip


def _make_base(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno not in _PLACE_ERRNOS:
            raise
        why = "a file is there, not a directory" if exc.errno == errno.EEXIST else exc.strerror
        if exc.filename is not None and Path(exc.filename) != root and exc.errno != errno.EEXIST:
            why = f"{why} ({exc.filename})"
        raise RunDirError(exc.errno, f"{root}: cannot make the run directory: {why}") from None


def _refuse(path: object, exc: OSError) -> LinkRefusedError:
    return LinkRefusedError(exc.errno, f"{path} is a symbolic link: refusing to write through it")


# -- the writers -----------------------------------------------------------------------------
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def open_fd(
    path: str | os.PathLike[str], flags: int, mode: int = 0o644, *, dir_fd: int | None = None
) -> int:
    """``os.open`` that never follows a link in the last component of ``path``."""
    try:
        return os.open(path, flags | _NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, exc) from exc
        raise


def open_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """A directory opened for ``dir_fd`` use, refusing a link (or a non-directory) there."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if _is_link(path, dir_fd) else "not a directory"
            raise LinkRefusedError(exc.errno, f"{path} is {kind}: refusing to use it") from exc
        raise


def _is_link(path: str | os.PathLike[str], dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def open_text(path: str | os.PathLike[str], mode: str = "w") -> IO[str]:
    """A text file opened for writing (``"w"``) or appending (``"a"``), links refused."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(open_fd(path, flags), mode, encoding="utf-8")


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """``Path.write_text`` that refuses a link (for files only their writer reads while it
    writes; a file others read at any time: :func:`atomic_write`)."""
    with open_text(path, "w") as f:
        f.write(text)


def touch(path: str | os.PathLike[str]) -> None:
    """Create ``path`` if missing (a marker), refusing a link."""
    os.close(open_fd(Path(path), os.O_WRONLY | os.O_CREAT))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    durable: bool = True,
    mode: int = 0o644,
    temp: str | None = None,
) -> None:
    """Replace ``path`` with ``data`` in one step: a temporary file beside it (created
    exclusively, never through a link), fsync (``durable``), rename in the directory opened
    without following a link. A reader sees the old file or the new one, never half of one. A
    link planted at ``path`` is refused, not replaced (nor written through). ``temp``: a fixed
    temporary name instead of a fresh one (a format that names it, the checkpoints'
    ``NAME.partial``): a stale one left by a crash is truncated, a link there is refused."""
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    dfd = open_dir(p.parent)
    try:
        if _is_link(p.name, dfd):
            raise LinkRefusedError(
                errno.ELOOP, f"{p} is a symbolic link: refusing to write through it"
            )
        tmp = temp or f".{p.name}.{os.getpid()}.{os.urandom(3).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if temp else os.O_EXCL)
        fd = open_fd(tmp, flags, mode, dir_fd=dfd)
        try:
            try:
                _write_all(fd, raw)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, p.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        if durable:
            os.fsync(dfd)
    finally:
        os.close(dfd)


def append_line(path: str | os.PathLike[str], line: str, *, durable: bool = True) -> None:
    """Append one line (one ``write`` with ``O_APPEND``: lines of concurrent writers stay
    whole), never through a link. A torn last line (a crash mid-write) is not glued onto: the
    new line starts on a fresh one."""
    text = line if line.endswith("\n") else line + "\n"
    fd = open_fd(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            text = "\n" + text
        os.write(fd, text.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def create_exclusive(path: str | os.PathLike[str], data: str | bytes = b"") -> bool:
    """Create ``path`` with ``data`` if nothing (not even a link) is there: True when this call
    created it, False when it existed (a claim: of racing callers exactly one wins)."""
    try:
        fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    try:
        _write_all(fd, data.encode() if isinstance(data, str) else data)
    finally:
        os.close(fd)
    return True


def make_dirs(base: str | os.PathLike[str], *parts: str, mode: int = 0o777) -> Path:
    """``base/parts...`` as directories: ``base`` (the run directory, the user's choice) is
    made with its parents, each of ``parts`` is created or entered one directory fd at a time,
    refusing a link or a non-directory there (nothing is created through a planted link)."""
    root = Path(base)
    _make_base(root)  # RunDirError: where the user put it, a directory cannot be
    if not parts:
        return root
    fd = open_dir(root)
    try:
        for name in Path(*parts).parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=fd)
            nfd = open_dir(name, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return root.joinpath(*parts)


def remove(path: str | os.PathLike[str], *, missing_ok: bool = True) -> bool:
    """Delete the file ``path`` when it is ours: a regular file owned by this user (checked on
    the entry itself, in its directory opened without following a link). A link, a directory
    or another user's file is refused (:class:`NotOursError`), never deleted. True when
    deleted, False when missing (``missing_ok``)."""
    p = Path(path)
    dfd = open_dir(p.parent)
    try:
        try:
            st = os.lstat(p.name, dir_fd=dfd)
        except FileNotFoundError:
            if missing_ok:
                return False
            raise
        _check_ours(p, st, directory=False)
        os.unlink(p.name, dir_fd=dfd)
        return True
    finally:
        os.close(dfd)


def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Move the file ``src`` to ``dst`` (replacing it), both entries in directories opened
    without following a link: ``src`` must be a regular file of ours, a link at ``dst`` is
    refused (:class:`NotOursError` / :class:`LinkRefusedError`), never renamed over."""
    s, d = Path(src), Path(dst)
    sfd = open_dir(s.parent)
    try:
        dfd = open_dir(d.parent)
        try:
            _check_ours(s, os.lstat(s.name, dir_fd=sfd), directory=False)
            if _is_link(d.name, dfd):
                raise LinkRefusedError(errno.ELOOP, f"{d} is a symbolic link: refusing it")
            os.rename(s.name, d.name, src_dir_fd=sfd, dst_dir_fd=dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _check_ours(path: object, st: os.stat_result, *, directory: bool) -> None:
    want = stat.S_ISDIR if directory else stat.S_ISREG
    if stat.S_ISLNK(st.st_mode):
        raise NotOursError(errno.ELOOP, f"{path} is a symbolic link: refusing to use it")
    if not want(st.st_mode):
        what = "a directory" if directory else "a regular file"
        raise NotOursError(errno.EPERM, f"{path} is not {what}: refusing to use it")
    if st.st_uid != os.getuid():
        raise NotOursError(
            errno.EPERM,
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}): "
            "refusing to use it (remove it, or choose another folder)",
        )


# -- node-local state and the state folder ---------------------------------------------------
def node_local_parts(run_dir: str | os.PathLike[str], attempt: str) -> tuple[str, str]:
    """The folder names below a node-local root (``/dev/shm``, the temporary folder) that hold
    one attempt's files of one run on a node, never in the run directory: this user's
    (``slurm-train-UID``), then the run's (a hash of its resolved path) with ``attempt``. Made
    with :func:`private_dir`; the hang watch's heartbeats and a command's requeue markers."""
    import hashlib  # here: OpenSSL's load is not paid by every command line that reads runfiles

    run = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    return f"slurm-train-{os.getuid()}", f"{run}-{attempt}"


def private_dir(root: str | os.PathLike[str], *parts: str, mode: int = 0o700) -> Path:
    """``root/parts...``, each of ``parts`` created with ``mode`` (``0700``: private) or found,
    and then proven ours: a directory (not a link), owned by this user (checked on the
    directory opened without following a link, one fd at a time from ``root``: a planted
    parent is never followed). One of ours that is more open than ``mode`` (made before this
    rule, or by a umask) is closed to ``mode``. ``root`` (``/dev/shm``, the state folder's
    parent) is made when missing. Raises :class:`NotOursError` (one line) for anything else."""
    top = Path(root)
    top.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    at = top
    try:
        for name in parts:
            at = at / name
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=fd)
            try:
                nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _check_ours(at, os.lstat(name, dir_fd=fd), directory=True)
                raise
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            _check_ours(at, st, directory=True)
            if stat.S_IMODE(st.st_mode) & ~mode:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & mode)
    finally:
        os.close(fd)
    return at


def remove_own_tree(path: str | os.PathLike[str]) -> None:
    """Delete the directory ``path`` and what is in it that this user owns, never through a
    link (a link is removed as an entry, what it names is left alone); another user's entry
    (and so its directory) is left in place. Missing: nothing to do."""
    p = Path(path)
    try:
        dfd = open_dir(p.parent)
    except OSError:
        return
    try:
        _remove_entry(dfd, p.name)
    finally:
        os.close(dfd)


def _remove_entry(dfd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dfd)
    except OSError:
        return
    if st.st_uid != os.getuid():
        return  # not ours: left alone
    if stat.S_ISDIR(st.st_mode):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dfd)
        except OSError:
            return
        try:
            if os.fstat(fd).st_ino != st.st_ino:
                return  # replaced between the look and the open
            for entry in _names(fd):
                _remove_entry(fd, entry)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):  # something foreign stayed inside
            os.rmdir(name, dir_fd=dfd)
    else:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)


def _names(fd: int) -> Iterator[str]:
    with os.scandir(fd) as it:
        return iter([e.name for e in it])


# -- where a run lives -------------------------------------------------------------------
def default_run_dir(run_dir: str | os.PathLike[str] | None, job_id: str | None) -> Path:
    """The run directory: ``train.run_dir`` when the spec gives one, else ``runs/job-JOBID``
    (stable across requeues), else ``runs/local``."""
    if run_dir:
        return Path(run_dir)
    return Path("runs") / (f"job-{job_id}" if job_id else "local")
