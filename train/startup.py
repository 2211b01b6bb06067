"""Where a (re)start's time goes, from the process start to training (torch-free, stdlib only).

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
"""

from __future__ import annotations

import gc
import os
import time

__all__ = ["mark", "pause_collector", "process_start", "resume_collector", "summary"]

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
