"""What ``/proc`` says about a process (torch-free, stdlib only, Linux; elsewhere nothing).

The one reader of ``/proc`` inside ``train/``: the command supervisor (:mod:`train.command`:
which signals its command catches, what it writes, its process tree) and the hang watcher
(:mod:`train.hang`: whether a rank is stopped, the processes of a hung command) ask here. Every
read survives a process that is gone or a ``/proc`` that says nothing: the answer is then empty.

:func:`step_back` is the one thing here that changes a process: our own processes beside the
user's (the command's supervisor, the hang watcher) give the CPU to the user's first (issue 46);
:func:`step_forward` runs what must not wait behind anyone (a hang's record) at a full share
again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "PROC",
    "STEP_BACK_NICE",
    "describe_tree",
    "is_child",
    "proc_state",
    "process_tree",
    "scan_tree",
    "session_is_ours",
    "status",
    "step_back",
    "step_forward",
    "stepped_from",
    "walk_tree",
]

PROC = Path("/proc")


def status(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The fields of ``/proc/PID/status`` (``{}`` when the process is gone or /proc absent)."""
    try:
        text = (proc / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def process_tree(root: int, proc: Path = PROC) -> dict[int, int]:
    """``{pid: parent}`` for ``root`` and all its descendants (``{root: 0}`` without /proc).

    Walked down from ``root`` through each thread's ``/proc/PID/task/TID/children``: what it
    costs grows with the command's own processes and threads, not with every process on the
    node (a node of eight ranks with their data-loader workers holds thousands, and every
    supervisor looks every second). Where the kernel has no ``children`` files
    (``CONFIG_PROC_CHILDREN``), every process's parent is read instead (:func:`scan_tree`)."""
    tree = walk_tree(root, proc)
    return tree if tree is not None else scan_tree(root, proc)


def walk_tree(root: int, proc: Path = PROC) -> dict[int, int] | None:
    """:func:`process_tree` through the ``children`` files; None where there are none (a
    ``root`` that is gone: ``{root: 0}``)."""
    try:
        tasks = os.listdir(proc / str(root) / "task")
    except OSError:
        return {root: 0} if (proc / "self" / "task").is_dir() else None
    if not tasks or not (proc / str(root) / "task" / tasks[0] / "children").exists():
        return None
    tree, todo = {root: 0}, [(root, tasks)]
    while todo:
        pid, threads = todo.pop()
        for tid in threads:
            try:
                kids = (proc / str(pid) / "task" / tid / "children").read_text().split()
            except OSError:
                continue  # the thread or the process is gone
            for kid in kids:
                child = int(kid)
                if child in tree:
                    continue
                tree[child] = pid
                try:
                    todo.append((child, os.listdir(proc / kid / "task")))
                except OSError:
                    continue  # gone already
    return tree


def scan_tree(root: int, proc: Path = PROC) -> dict[int, int]:
    """:func:`process_tree` from every process's parent (``/proc/PID/status``)."""
    parents: dict[int, int] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return {root: 0}
    for entry in entries:
        parent = status(int(entry), proc).get("PPid", "")
        if parent.isdigit():
            parents[int(entry)] = int(parent)
    tree = {root: 0}
    grew = True
    while grew:  # descendants of descendants (a few passes: trees are shallow)
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree[pid] = ppid
                grew = True
    return tree


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name (state, parent, ...); [] when gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[-1].split()


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``T``: stopped), None when it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def is_child(pid: int, parent: int) -> bool:
    """Whether ``pid`` is (still) a child of ``parent``: proof before a signal to its group."""
    fields = _stat_fields(pid)
    return len(fields) > 1 and fields[1] == str(parent)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def describe_tree(root: int) -> list[str]:
    """State, wait channel, command line and kernel stack (where readable) of ``root`` and its
    descendants, one line each (the stack's frames indented below); [] when all are gone."""
    lines: list[str] = []
    for pid in sorted(process_tree(root)):
        proc = PROC / str(pid)
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        wchan = _read(proc / "wchan") or "-"
        lines.append(f"pid {pid} state {proc_state(pid)} wchan {wchan}: {cmdline.strip()}")
        stack = _read(proc / "stack")
        lines.extend(f"    {frame}" for frame in stack.splitlines() if frame.strip())
    return lines


#: The nice value our own processes beside the user's take (issue 46): the supervisor once the
#: command is started, the hang watcher from its start. They mostly sleep (a poll, a /proc scan);
#: what they do at once with the command's start (the supervisor's imports and set-up, the
#: watcher's) then waits for the CPU the command leaves, instead of taking a share of it.
STEP_BACK_NICE = 10

_STEPPED_FROM: list[int] = []  # this process's nice before it stepped back (once)


def stepped_from() -> int | None:
    """The nice value this process had before :func:`step_back` (None: it never stepped back):
    what a process it starts afterwards that must not inherit the step back asks for."""
    return _STEPPED_FROM[0] if _STEPPED_FROM else None


def session_is_ours(pid: int, proc: Path = PROC) -> bool:
    """Whether every process of ``pid``'s session is ``pid``, one of its descendants or Slurm's
    ``slurmstepd`` (the task's session under Slurm; the session a process started with
    ``start_new_session`` leads): the session's autogroup then holds no one else's processes
    (never a user's shell). False when /proc does not say."""
    try:
        sid = os.getsid(pid)
        entries = [int(e) for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return False
    tree = process_tree(pid, proc)
    for other in entries:
        if other in tree:
            continue
        try:
            if os.getsid(other) != sid:
                continue
        except OSError:
            continue  # gone
        if _read(proc / str(other) / "comm") != "slurmstepd":
            return False
    return True


def _autogroup_nice(path: Path) -> int | None:
    """The nice value of an autogroup (``/autogroup-123 nice 0``); None where there is none."""
    words = _read(path).split()
    if len(words) == 3 and words[1] == "nice":
        with contextlib.suppress(ValueError):
            return int(words[2])
    return None


def step_back(
    nice: int = STEP_BACK_NICE, *, session: bool = False, proc: Path = PROC, tries: int = 12
) -> None:
    """Let the user's processes have the CPU first: the calling thread (and every thread and
    process it starts from now on: they inherit it) at ``nice`` unless it is lower already, and
    with ``session`` (the caller checked :func:`session_is_ours`) the autogroup of this
    process's session too: where the kernel groups processes by session (autogroups, on in most
    distributions) it shares the CPU between sessions first, and the user's command runs in a
    session of its own. Never raises: a kernel that refuses leaves the priority as it was. An
    unprivileged process cannot take it back, so a caller steps back only after starting what
    must run at its own priority (the user's command)."""
    with contextlib.suppress(OSError):
        before = os.getpriority(os.PRIO_PROCESS, 0)
        if before < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            if not _STEPPED_FROM:
                _STEPPED_FROM.append(before)
    if not session:
        return
    path = proc / "self" / "autogroup"
    for attempt in range(tries):
        now = _autogroup_nice(path)
        if now is None or now >= nice:
            return
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            return
        try:
            os.write(fd, str(nice).encode())
            return
        except BlockingIOError:  # EAGAIN: unprivileged, one change per 100 ms on the machine
            # (a node's tasks start together: each gets its turn within ~1 s)
            if attempt + 1 < tries:
                time.sleep(0.11)
        except OSError:
            return
        finally:
            os.close(fd)


def step_forward(fn: Callable[[], object]) -> bool:
    """Run ``fn`` at a full share of the CPU again after :func:`step_back`, and wait for it.

    What a process stepped back cannot take back itself (an unprivileged process never lowers
    its nice or its autogroup's), a child of it gets by leading a session of its own: a new
    session is a new autogroup, at nice 0, and alone in it the child's own nice weighs nothing
    against other sessions. So ``fn`` runs in a child forked into a new session (the same
    cgroup: Slurm still ends it with the job), this process waiting for it. For the few tenths
    of a CPU-second that must not wait behind other sessions' load: the hang watcher's record
    and requeue at a hang (its ranks silent; stepped back on a node whose cores other sessions
    keep busy, 0.1 s of imports took 4.5 s).

    True when ``fn`` ran in such a child (its exceptions logged there), False when it ran here:
    this process is not stepped back (its nice and its autogroup's at 0 or below: by itself or
    by inheritance, as the watcher a stepped-back supervisor starts), another thread runs (a
    fork copies the locks it may hold), or the fork was refused."""
    group = _autogroup_nice(PROC / "self" / "autogroup")
    back = os.getpriority(os.PRIO_PROCESS, 0) > 0 or (group is not None and group > 0)
    if not back or threading.active_count() > 1:
        fn()
        return False
    _flush()  # nothing buffered is written twice
    try:
        pid = os.fork()
    except OSError:
        fn()
        return False
    if pid == 0:  # the child: never back into the caller's stack (its finally blocks are the
        code = 1  # parent's to run)
        try:
            with contextlib.suppress(OSError):
                os.setsid()  # refused: at the caller's share, as without the fork
            fn()
            code = 0
        except BaseException:
            logging.getLogger(__name__).exception("at full share: failed")
        finally:
            _flush()
            os._exit(code)
    os.waitpid(pid, 0)
    return True


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
