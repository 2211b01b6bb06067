"""Processes we started, proven ours before anything signals them (Linux ``/proc``, torch-free).

A PID alone names whatever process has that number *now*: after the run ends the kernel hands it
to another program, and as root a signal to it would hit that program. A :class:`ProcHandle` is a
PID plus the process's start time (``/proc/PID/stat`` field 22, clock ticks since boot) and the
boot id, recorded by the process itself or by its parent right after starting it. A handle
matches a live process only when all three agree, and :func:`signal_if_ours` opens a pidfd
*before* it checks, so the process it checked is the one the signal reaches (a process that
exits in between makes the send fail instead of hitting a newcomer with the same PID).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ProcHandle",
    "boot_id",
    "cmdline",
    "pid_alive",
    "signal_if_ours",
    "start_ticks",
    "started_at",
    "wait_exec",
]

PROC = Path("/proc")


def boot_id() -> str:
    """This boot's id (start ticks restart at 0 after a reboot)."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return None
    # comm (field 2) may contain spaces and ')': everything after the LAST ')' is fields 3...
    return text.rsplit(")", 1)[-1].split()


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None when there is no such process."""
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


def started_at(handle: ProcHandle) -> float | None:
    """Wall-clock start time of the process of ``handle`` (epoch seconds), or None."""
    try:
        btime = next(
            int(line.split()[1])
            for line in (PROC / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return btime + handle.start / os.sysconf("SC_CLK_TCK")


def pid_alive(pid: int | None) -> bool:
    """``pid`` exists and is not a zombie (a zombie child of ours is reaped here)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    fields = _stat_fields(pid)
    return fields is None or (bool(fields) and fields[0] != "Z")


def cmdline(pid: int) -> list[str]:
    """The argument vector of ``pid`` ([] when gone or unreadable)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def wait_exec(pid: int, timeout: float = 10.0) -> bool:
    """Wait until the command line of ``pid``, a process just started, can be read; whether it
    could (False: the process is gone, or ``timeout`` passed). ``subprocess.Popen`` returns once
    the child's exec has closed its file descriptors, before the kernel has set up the new
    program's argument vector: ``/proc/PID/cmdline`` is then empty (382 and 388 of 400 reads
    right after ``Popen`` returned, 2026-11-27), and whoever proves the process ours by its
    command line (:func:`jobs.monitor.supervisor`) takes it for another: a run just submitted
    showed FAILED."""
    deadline = time.monotonic() + timeout
    while not cmdline(pid):
        if not pid_alive(pid) or time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


@dataclass(frozen=True)
class ProcHandle:
    """One process, as it was when it was recorded."""

    pid: int
    start: int
    boot: str

    @classmethod
    def of(cls, pid: int) -> ProcHandle | None:
        """The handle of the live process ``pid`` now (None when it is gone)."""
        ticks = start_ticks(pid)
        return None if ticks is None else cls(pid, ticks, boot_id())

    @classmethod
    def from_json(cls, data: Any) -> ProcHandle | None:
        """A handle from a record; anything damaged or foreign gives None (never an exception)."""
        if not isinstance(data, Mapping):
            return None
        pid, start, boot = data.get("pid"), data.get("start"), data.get("boot", "")
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (pid, start))
        if not ok or not isinstance(boot, str):
            return None
        assert isinstance(pid, int) and isinstance(start, int)
        return cls(pid, start, boot)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "boot": self.boot}

    def alive(self) -> bool:
        """This very process still runs (not merely some process with the same PID)."""
        if self.boot and boot_id() and self.boot != boot_id():
            return False
        return start_ticks(self.pid) == self.start and pid_alive(self.pid)


def signal_if_ours(
    handle: ProcHandle, sig: int, check: Callable[[int], bool] = lambda pid: True
) -> bool:
    """Send ``sig`` to the process of ``handle`` iff it is still that process and ``check(pid)``
    holds (e.g. its command line). Returns whether the signal was sent."""
    try:
        fd = os.pidfd_open(handle.pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        # The pidfd pins the process that had the PID at open time: check THAT one, signal it.
        if not handle.alive() or not check(handle.pid):
            return False
        try:
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            return False  # it exited after the check
        return True
    finally:
        os.close(fd)
