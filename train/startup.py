"""Where a (re)start's time goes, from the process start to training (torch-free, stdlib only).

The launch path calls :func:`mark` at its milestones (``main``: the CLI runs, ``config``: spec
loaded, ``imports``: torch and the trainer imported, ``process_group``, ``data_model``: data and
model built, ``restored``: checkpoint loaded); :func:`summary` turns them into seconds per phase,
which the ``start``/``resume`` event carries as ``startup`` (``bench/bench_preempt.py`` reports
it). The process start comes from ``/proc/self/stat`` (Linux); elsewhere the first mark is the
origin.
"""

from __future__ import annotations

import os
import time

__all__ = ["mark", "process_start", "summary"]

_MARKS: dict[str, float] = {}


def process_start() -> float | None:
    """When this process started (``time.time()`` scale), or None where /proc cannot tell."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat", encoding="ascii") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
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
