"""A task process's life: where its (re)start's time goes, its collector, its end after a stop
(torch-free, stdlib only).

The launch path calls :func:`mark` at its milestones (``main``: the CLI runs, ``config``: spec
loaded, ``imports``: torch and the trainer imported, ``process_group``, ``data_model``: data and
model built, ``restored``: checkpoint loaded; before ``main``, ``behind_command``: the task waited
asleep behind a command started first, :func:`train.command.prestart.wait_behind`);
:func:`summary` turns them into seconds per phase,
which the ``start``/``resume`` event carries as ``startup`` (``bench/bench_preempt.py`` reports
it). The process start comes from ``/proc/self/stat`` (Linux); elsewhere the first mark is the
origin.

The cyclic collector during start-up: importing torch and building a run creates hundreds of
thousands of objects that live as long as the process, and CPython's collector scans them again
and again while they are made (13% of ``import torch`` here) and once more when the process
exits. The task's entry points (``python -m train``, :class:`jobs.launch.TrainLaunch`) call
:func:`pause_collector` first; the run's start (``RunSession.started``, before the first step
or the user's function) calls :func:`resume_collector`, which freezes what start-up built
(``gc.freeze``: kept out of every later collection, and out of the one at exit) and turns the
collector back on for training and the user's code. Called in a process whose collector was
not paused by us (tests, a notebook), :func:`resume_collector` does nothing.

The end after a stop (a failure restarted in place or requeued, a requeue Slurm refused, a
budget spent): the job's nodes wait for every task's process to end, and after its last line
Python's own exit tears down every module and the objects they hold: with torch and the trainer
loaded, 0.15-0.25 s of a core after the collector's work (which the freeze above already
spares), measured here (issue 46). Nothing of ours needs that teardown: the run closes its own
files (metrics, tracker, checkpoints written whole and renamed). :func:`leave` does what
Python's exit does first, in its order, that anything relies on (``threading``'s own shutdown,
which tells an executor's idle workers to end and joins the other non-daemon threads, the
``atexit`` functions: logging's flush, multiprocessing's end of its daemonic
children, torch's; the standard streams flushed), then ``os._exit``. Only where nothing but this
project's code ran in the process (the built-in trainer: ``train.cli`` calls :func:`ours_only`),
and only from the process's entry (``python -m train``, :mod:`jobs.taskstart`): an entrypoint
function's objects may flush only when Python frees them, and its process ends as Python ends
it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
import time

__all__ = [
    "leave",
    "mark",
    "ours_only",
    "pause_collector",
    "process_start",
    "resume_collector",
    "summary",
]

_MARKS: dict[str, float] = {}
_PAUSED = [False]  # whether pause_collector turned the collector off (and nobody resumed it)


def pause_collector() -> None:
    """For a task's entry point: the cyclic collector off until :func:`resume_collector`."""
    if gc.isenabled():
        gc.disable()
        _PAUSED[0] = True


def resume_collector() -> None:
    """Start-up is over: freeze what it built, collector on (only if :func:`pause_collector`
    turned it off)."""
    if _PAUSED[0]:
        _PAUSED[0] = False
        gc.freeze()
        gc.enable()


def process_start() -> float | None:
    """When this process started (``time.time()`` scale, to the kernel's 10 ms tick), or None
    where /proc cannot tell. Its start after boot against the boot clock now: ``btime`` in
    /proc/stat is whole seconds, which put every phase up to a second off."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):  # no CLOCK_BOOTTIME: not Linux
        return None


def mark(name: str) -> None:
    """Remember when milestone ``name`` was first reached."""
    _MARKS.setdefault(name, time.time())


def summary() -> dict[str, float]:
    """Seconds from the previous milestone (the process start first) to each one, in order."""
    out: dict[str, float] = {}
    previous = process_start()
    for name, at in sorted(_MARKS.items(), key=lambda kv: kv[1]):
        if previous is not None:
            out[name] = round(max(0.0, at - previous), 3)
        previous = at
    return out


_OURS_ONLY = [False]  # nothing but this project's code runs in this process (ours_only)


def ours_only() -> None:
    """Nothing but this project's code runs in this process (the built-in trainer): its end
    after a stop may skip the interpreter's teardown (:func:`leave`)."""
    _OURS_ONLY[0] = True


def leave(code: int) -> None:
    """For a process's entry: end it with ``code`` after a stop as Python's own exit would, but
    for the teardown of its modules; returns (the caller exits as Python does) where user code
    ran in this process, ``code`` is 0 (the run's end) or this is not the main thread."""
    if not _OURS_ONLY[0] or code == 0:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    # what Python's exit does first, in its way: the threading module's exit functions (an
    # executor's idle workers told to end), then every other non-daemon thread joined
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None:
        return  # a Python without it: its own exit
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to flush
            if stream is not None:
                stream.flush()
    os._exit(code)
