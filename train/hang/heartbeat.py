"""Hang watchdog: a stuck rank becomes a recorded, requeued interruption instead of a burned job.

Progress (torch-free, one ``os.pwrite`` of 16 bytes per optimizer step): every rank writes its
step and wall time into ``RUN_DIR/.progress/ATTEMPT/rank-R`` (:class:`Heartbeat`), ATTEMPT being
``JOB-RESTART``. What counts as progress is a completed optimizer step (``RunSession.progress``:
the built-in trainer and ``entrypoint.function`` code calling ``ctx.progress(step)``). An
``entrypoint.command``'s supervisor beats when the command's processes write anything (its
output, files, gloo's sockets), and its watcher works per job instead of per rank (see
:func:`start_watchdog`).

Watcher: each rank starts one small process (``python -m train.hang.watcher``, no torch) in its own
session, so a ``kill -STOP`` of the rank (or of its process group) does not freeze it. Once every
rank has reported a first step, the watcher polls the heartbeats; when no rank, or some rank,
has advanced for the hang timeout (``requeue.hang_timeout_s``, or by default
``max(HANG_FLOOR_S, 20 x the mean step time, 3 x the longest gap seen)``), every watcher:

1. asks its rank for its Python stacks (``faulthandler`` is registered on :data:`DUMP_SIGNAL` in
   each rank, writing into ``.progress/ATTEMPT/rank-R.stacks``, which the watcher copies to
   ``RUN_DIR/hangs/ATTEMPT/rank-R.stacks``; a rank stopped by SIGSTOP
   cannot dump: its process state ``T`` is recorded instead);
2. writes what it saw to ``RUN_DIR/hangs/ATTEMPT/rank-R.json`` (step, age of the last beat,
   process state, node);
3. the first watcher to claim ``hangs/ATTEMPT/claimed`` (an exclusive create) waits briefly for
   the others, names the stuck ranks (stopped processes, else those with the oldest step) and
   their nodes, and calls :func:`train.stop.act.request_requeue` with kind ``hang``: the ``hang``
   event, the ``requeue.max_hangs`` budget, ``scontrol requeue``;
4. every watcher then ends its rank (SIGKILL), which ends the step: Slurm restarts the requeued
   job and it resumes from the newest valid checkpoint like any interruption.

5. after a requeue, the claimant keeps the job off the stuck ranks' nodes (``ExcNodeList``
   through :meth:`cluster.client.SlurmClient.exclude_nodes`) while the partition keeps enough
   other usable nodes for it, and records a ``quarantine`` event (the nodes, or why not).

Not covered: a rank stuck before its first step (the watcher arms once every rank has made
one; torch's own rendezvous and collective time-outs apply there).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from train.runfiles import open_fd, open_text, write_text

__all__ = [
    "BUDGET_FIELDS",
    "COMMAND_FLOOR_S",
    "DUMP_SIGNAL",
    "HANG_FLOOR_S",
    "Beat",
    "Heartbeat",
    "Watchdog",
    "attempt_name",
    "auto_timeout",
    "hang_claimed",
    "proc_state",
    "read_beats",
    "start_watchdog",
    "stuck_ranks",
]

log = logging.getLogger(__name__)

#: Each rank dumps its Python stacks (all threads) on this signal; Slurm never sends it.
DUMP_SIGNAL = signal.SIGRTMIN + 3
#: The default timeout never goes below this (evaluations and checkpoints pause the steps).
HANG_FLOOR_S = 60.0
#: The same for an ``entrypoint.command``, whose progress is its output (sparser than steps).
COMMAND_FLOOR_S = 1800.0
_BEAT = struct.Struct("<qd")  # step, wall time
#: The fields of ``requeue:`` the watcher needs (passed to it as JSON).
BUDGET_FIELDS = ("max_preemptions", "max_timeouts", "max_failures", "max_hangs", "signal_delay_s")


def attempt_name(job_id: str | None, restart_count: int) -> str:
    return f"{job_id or 'local'}-{restart_count}"


def hang_claimed(run_dir: Path | str, job_id: str | None, restart_count: int) -> bool:
    """True once a watcher took charge of a hang in this attempt: it records and requeues; a
    rank that comes back to life afterwards (Slurm's SIGCONT at the requeue, a peer's 'connection
    closed') must not record a failure or a stop of its own."""
    return (Path(run_dir) / "hangs" / attempt_name(job_id, restart_count) / "claimed").exists()


@dataclass(frozen=True)
class Beat:
    """One rank's newest heartbeat: its last completed step and when (wall clock)."""

    rank: int
    step: int
    time: float


class Heartbeat:
    """A rank's progress file: ``beat(step)`` costs one 16-byte ``pwrite`` (no fsync)."""

    def __init__(self, directory: Path, rank: int, meta: dict[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        write_text(directory / f"rank-{rank}.json", json.dumps(meta))
        self.path = directory / f"rank-{rank}"
        self._fd: int | None = open_fd(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)

    def beat(self, step: int) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, _BEAT.pack(step, time.time()), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_beats(directory: Path, world_size: int) -> dict[int, Beat]:
    """The ranks that reported at least one step (a missing or short file: not yet)."""
    beats: dict[int, Beat] = {}
    for rank in range(world_size):
        try:
            with open(directory / f"rank-{rank}", "rb") as f:
                raw = f.read(_BEAT.size)
        except OSError:
            continue
        if len(raw) == _BEAT.size:
            step, t = _BEAT.unpack(raw)
            beats[rank] = Beat(rank, step, t)
    return beats


def auto_timeout(
    mean_step_s: float | None, longest_gap_s: float, floor: float = HANG_FLOOR_S
) -> float:
    """The default hang timeout from the measured step time, never below ``floor``."""
    return max(floor, 20.0 * (mean_step_s or 0.0), 3.0 * longest_gap_s)


def stuck_ranks(beats: dict[int, Beat], now: float, timeout: float) -> list[int]:
    """Ranks whose last step is older than ``timeout`` (empty: no hang).

    With DDP one stuck rank soon blocks every other in a collective, so all of them stall;
    which of them stopped *first* is decided later from their process states and steps.
    """
    return sorted(r for r, b in beats.items() if now - b.time > timeout)


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``T``: stopped), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


# ------------------------------------------------------------------------------ rank side


class Watchdog:
    """In a rank: the heartbeat, the stack-dump handler, and the watcher process it started."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        world_size: int,
        job_id: str | None,
        restart_count: int,
        timeout_s: float | None,
        budgets: dict[str, int],
        poll_s: float | None = None,
        node: str | None = None,
        command_pid: int | None = None,
    ) -> None:
        attempt = attempt_name(job_id, restart_count)
        self.progress_dir = run_dir / ".progress" / attempt
        node = node or socket.gethostname().split(".")[0]
        self.heartbeat = Heartbeat(
            self.progress_dir, rank, {"rank": rank, "pid": os.getpid(), "node": node}
        )
        # in the hidden progress folder: an attempt that ends without a hang (or is killed by
        # a preemption) leaves no RUN_DIR/hangs behind
        self.stacks_path = self.progress_dir / f"rank-{rank}.stacks"
        self._stacks: IO[str] | None = open_text(self.stacks_path, "w")
        faulthandler.register(DUMP_SIGNAL, file=self._stacks, all_threads=True, chain=False)
        cmd = [
            sys.executable, "-m", "train.hang.watcher",
            "--run-dir", str(run_dir), "--attempt", attempt, "--rank", str(rank),
            "--world-size", str(world_size), "--pid", str(os.getpid()),
            "--budgets", json.dumps(budgets), "--job-id", job_id or "",
            "--restart-count", str(restart_count),
        ]  # fmt: skip
        if command_pid is not None:  # see watch_command
            cmd += ["--command-pid", str(command_pid)]
        if timeout_s:
            cmd += ["--timeout", str(timeout_s)]
        if poll_s:
            cmd += ["--poll", str(poll_s)]
        # Own session: a signal to the rank's process group does not reach the watcher.
        self._watcher: subprocess.Popen[bytes] | None = subprocess.Popen(
            cmd, start_new_session=True, stdin=subprocess.DEVNULL
        )

    def beat(self, step: int) -> None:
        """A completed step (a progress listener of :class:`train.session.RunSession`)."""
        self.heartbeat.beat(step)

    def close(self) -> None:
        """The run ended on its own: stop the watcher, remove an unused stacks file."""
        if self._watcher is not None:
            with contextlib.suppress(OSError):
                self._watcher.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watcher.wait(timeout=5)
            self._watcher = None
        faulthandler.unregister(DUMP_SIGNAL)
        if self._stacks is not None:
            self._stacks.close()
            self._stacks = None
            with contextlib.suppress(OSError):
                if self.stacks_path.stat().st_size == 0:
                    self.stacks_path.unlink()
        self.heartbeat.close()


def start_watchdog(
    requeue: Any, env: Any, run_dir: Path, *, command_pid: int | None = None
) -> Watchdog | None:
    """The watchdog for this rank, or None when ``requeue.hang_watchdog`` is off.

    ``command_pid``: this rank supervises ``entrypoint.command`` (that child, in its own
    session): its progress is what it writes, the job hangs when NO rank's command wrote
    anything for the timeout (``requeue.hang_timeout_s``, default :data:`COMMAND_FLOOR_S`: a
    program's writes are sparser than steps), and at a hang the watcher records
    the command's processes (state, kernel wait channel, kernel stack where readable) instead
    of Python stacks and ends the command's process group with the rank."""
    if not getattr(requeue, "hang_watchdog", True):
        return None
    return Watchdog(
        Path(run_dir),
        rank=env.rank,
        world_size=env.world_size,
        job_id=env.job_id,
        restart_count=env.restart_count,
        node=env.node_name,
        timeout_s=getattr(requeue, "hang_timeout_s", None),
        budgets={k: int(getattr(requeue, k)) for k in BUDGET_FIELDS if hasattr(requeue, k)},
        command_pid=command_pid,
    )
