"""``report(step, **scalars)``: one line for your own script to tell the tool how training goes.

    from train.report import report        # torch-free: no import of torch, no set-up
    report(step, loss=loss.item(), lr=sched.get_last_lr()[0])

Rank 0 appends one line to ``$RUN_DIR/metrics.jsonl`` (``{"kind": "report", "time", "step",
"scalars": {...}}``; the other ranks, and a script run outside a job (no ``RUN_DIR``), write
nothing). From those lines ``jobs plot`` draws your curves beside the run's life, ``jobs drill``
and ``jobs status`` know the last step trained and the step a restart resumed from, and the
goodput ledger knows when the command last made progress. Call it as often as you log (every N
steps): it is one small append of one process, never a read; a value that is not a finite
number (NaN, inf, a string) is left out of the line, and a write that fails (a full disk) is
reported once on stderr and never stops training.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import SupportsFloat

from train.runfiles import METRICS_FILE, open_fd

__all__ = ["REPORT_KIND", "last_reported_step", "report"]

REPORT_KIND = "report"
_RESERVED = frozenset({"kind", "time", "step", "scalars"})
_failed = False


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, SupportsFloat):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def report(step: int, **scalars: object) -> None:
    """Record that training reached ``step`` (after it, 1-based or 0-based as you count), with
    ``scalars`` (name -> a number: a float, an int, a 0-d tensor). Rank 0 only (``RANK``)."""
    global _failed
    if os.environ.get("RANK", "0") != "0":
        return
    run_dir = os.environ.get("RUN_DIR")
    if not run_dir or isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return
    values = {
        name: number
        for name, value in scalars.items()
        if name not in _RESERVED and (number := _number(value)) is not None
    }
    line = json.dumps(
        {"kind": REPORT_KIND, "time": round(time.time(), 3), "step": step, "scalars": values},
        separators=(",", ":"),
    )
    try:
        fd = open_fd(os.path.join(run_dir, METRICS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        if not _failed:
            _failed = True
            print(f"train.report: cannot write to {run_dir}: {exc}", file=sys.stderr)


#: how much of the end of ``metrics.jsonl`` :func:`last_reported_step` reads (one read per stop)
_TAIL_BYTES = 64 * 1024


def last_reported_step(run_dir: str | os.PathLike[str]) -> int | None:
    """The step of the newest ``report`` line in ``RUN_DIR/metrics.jsonl`` (a command's own
    progress, where it keeps no checkpoint of ours), or None. Reads only the file's last
    64 KiB, once (a stop's decision, a start's event); a damaged or foreign line is skipped,
    a link is not followed."""
    try:
        fd = open_fd(os.path.join(run_dir, METRICS_FILE), os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - _TAIL_BYTES), os.SEEK_SET)
        data = os.read(fd, _TAIL_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    for raw in reversed(data.split(b"\n")):
        if REPORT_KIND.encode() not in raw:
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a torn first or last line, a foreign one
        if not isinstance(line, dict):
            continue
        step = line.get("step")
        if line.get("kind") == REPORT_KIND and type(step) is int and step >= 0:
            return step
    return None
