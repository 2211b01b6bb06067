"""Hang watchdog: a stuck rank becomes a recorded, requeued interruption instead of a burned job.

Progress, per rank, node-local (torch-free, one ``os.pwrite`` of 32 bytes per beat): every rank
writes its last completed step, what it is doing (its *phase*), a pulse counter and the wall time
into ``NODE_DIR/rank-R`` (:class:`Heartbeat`), NODE_DIR being a folder of this node's memory
file system (``/dev/shm``, else the node's temporary folder; :func:`node_local_dir`), one per
run, attempt (``JOB-RESTART``) and node. Nothing per step reaches the shared run directory.

What counts as progress (:class:`Watchdog`):

- a completed optimizer step (``RunSession.progress``: the built-in trainer, and
  ``entrypoint.function`` code calling ``ctx.progress(step)``): phase ``train``;
- a declared *busy* phase (``RunSession.busy(what)``, ``ctx.busy(what)``): the built-in trainer
  declares ``eval`` (every evaluation), ``save`` (checkpoint saves, the wait for an asynchronous
  one and rank 0's collection of the other ranks' parts); every rank starts in ``start``
  (restoring a checkpoint, a first ``torch.compile``, the first step) until its first step;
- a pulse (:meth:`Watchdog.pulse`): each phase of a checkpoint save
  (``train.checkpoint.manager.SAVE_PHASE_HOOKS``), whatever thread saves;
- waiting for the other ranks is not work (:meth:`Watchdog.waiting`: phase ``wait``): the
  all-reduce that ends an evaluation, the barrier after a stop's save, rank 0's collection of
  the other ranks' checkpoint files. A rank may wait only as long as it may be silent in
  ``train``, so a peer that froze while this rank evaluates or saves is a hang within the
  timeout, not after the busy allowance;
- for an ``entrypoint.command``: what its training processes write (``wchar`` of
  ``/proc/PID/io``), launcher agents such as torchrun's excluded
  (:func:`train.command.processes.written_bytes`): its supervisor beats when that grows.

How long a rank may be silent (:func:`allowance`): in ``train`` and ``wait``, the hang timeout T
(``requeue.hang_timeout_s``, or by default :func:`auto_timeout`: ``max(HANG_FLOOR_S, 20 x the
mean step, 3 x the longest pause between two steps that no busy phase explains)``); in a busy
phase ``max(T, BUSY_FLOOR_S)``; a command's ranks ``T`` with a default of
``max(COMMAND_FLOOR_S, 3 x the longest silence)``.

Watcher: ONE process per node (``python -m train.hang``: :mod:`train.hang.watcher`, no torch),
started by the node's first local rank (a command's supervisor: at the command's first write)
in its own session (a ``kill -STOP`` of the rank or its process group does not freeze it),
stepped back for the ranks' processes (``train/hang/__main__.py``, issue 46). It reads its
node's heartbeats (node-local) every poll (T/10, 0.2-5 s) and, every :data:`SUMMARY_S`,
publishes one small summary of its node (``RUN_DIR/.progress/ATTEMPT/nodes/NODE.json``: each
local rank's step, phase, silence, allowance and process state, and a sequence number) and looks
whether a hang was claimed (one ``stat``; every quarter of the timeout when that is shorter, at
least 1 s apart). That is the whole cost on the shared file system while nothing is wrong: one
file written and one looked at per node every 10 s (with the default timeout), whatever the
number of ranks. A node whose ranks are silent past their allowance but judged "not a hang" (a
peer elsewhere still works, or is busy) publishes every quarter of a short timeout instead (>= 1
s), so that a peer whose ranks fall silent later has this node's word at once, not a summary
period later.

When a local rank is silent past its allowance (for a command: every local rank), the watcher
publishes at once, reads every node's summary and waits (at most ``SUMMARY_S + 3`` s) until
each node published again; a node that does not is *silent* (its watcher is frozen with the
node). A local rank whose process is stopped past the timeout needs no other node's word (it
is a hang and its own suspect): that watcher judges at once on the summaries it has. The
decision is :func:`train.hang.evidence.judge` (pure): a hang when a node is silent, a rank's
process is stopped (state ``T``), or ranks are past their allowance while no rank is
busy within its own; the suspects are the silent nodes, the stopped ranks, else the ranks that
have not reached the step their peers wait at (the others are its victims), else none. Then:

1. the first watcher to claim ``hangs/ATTEMPT/claimed`` (an exclusive create) decides; every
   watcher that sees the claim (or reached the verdict itself) asks its local ranks for their
   Python stacks (``faulthandler`` on :data:`DUMP_SIGNAL`, written node-locally and copied to
   ``RUN_DIR/hangs/ATTEMPT/rank-R.stacks``; a stopped rank cannot dump: its state ``T`` is
   recorded; a command's processes are described instead), stops them (SIGSTOP) and writes
   ``hangs/ATTEMPT/rank-R.json`` (step, phase, silence, state, node);
2. the claimant calls :func:`train.stop.act.request_requeue` with kind ``hang`` and the
   suspects' nodes (``suspects=``; none when the evidence names none): the ``hang`` event,
   the ``requeue.max_hangs`` budget, ``scontrol requeue``, the quarantine of those nodes;
3. every watcher then ends its local ranks (SIGKILL); Slurm restarts the requeued job and it
   resumes from the newest valid checkpoint like any interruption.

Each rank also writes ``RUN_DIR/.progress/ATTEMPT/rank-R.json`` once (its pid and node: for
people and tests). Not covered: a job whose every node freezes at once, and a node that
freezes alone while nothing waits for it (its ranks then hold the job only at the next
collective, which is when the others notice).
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
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from train.runfiles import (
    PROGRESS,
    make_dirs,
    node_local_parts,
    open_fd,
    open_text,
    private_dir,
    write_text,
)
from train.safepath import python_module_argv
from train.stop import attempt_name

if TYPE_CHECKING:
    from train.env import DistEnv
    from train.spec import RequeueConfig


__all__ = [
    "BUSY_FLOOR_S",
    "COMMAND_FLOOR_S",
    "DUMP_SIGNAL",
    "HANG_FLOOR_S",
    "PHASES",
    "SUMMARY_S",
    "Beat",
    "Heartbeat",
    "Watchdog",
    "allowance",
    "auto_timeout",
    "make_node_local_dir",
    "node_local_dir",
    "read_beats",
    "start_watchdog",
]

log = logging.getLogger(__name__)

#: Each rank dumps its Python stacks (all threads) on this signal; Slurm never sends it.
DUMP_SIGNAL = signal.SIGRTMIN + 3
#: The default timeout of a training step never goes below this.
HANG_FLOOR_S = 60.0
#: A declared busy phase (evaluation, checkpoint save, start-up and first step) may be silent
#: this long, or the timeout when that is longer.
BUSY_FLOOR_S = 1800.0
#: The default timeout of an ``entrypoint.command`` (its writes are sparser than steps).
COMMAND_FLOOR_S = 1800.0
#: Each node's watcher publishes its summary (and looks for a claimed hang) this often.
SUMMARY_S = 10.0
#: What a rank can be doing; a phase not in the list is reported as ``busy``. New phases go at
#: the end: a beat stores the index.
PHASES = ("train", "start", "eval", "save", "compile", "busy", "wait")
#: Phases in which a rank is not busy with work of its own: silent only for the timeout.
NOT_BUSY = ("train", "wait")
_BEAT = struct.Struct("<qdqq")  # step, wall time, phase, pulse counter


def _node_local_parts(
    run_dir: Path, attempt: str, node: str, root: Path | None
) -> tuple[Path, tuple[str, str, str]]:
    if root is None:
        shm = Path("/dev/shm")
        root = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return root, (*node_local_parts(run_dir, attempt), node)


def node_local_dir(run_dir: Path, attempt: str, node: str, root: Path | None = None) -> Path:
    """This node's heartbeat folder for one attempt of one run: in ``/dev/shm`` (memory) when
    there is one, else the node's temporary folder; never in the shared run directory."""
    top, parts = _node_local_parts(run_dir, attempt, node, root)
    return top.joinpath(*parts)


def make_node_local_dir(run_dir: Path, attempt: str, node: str, root: Path | None = None) -> Path:
    """:func:`node_local_dir`, made private: every folder below the (world-writable) root is
    created ``0700`` or proven this user's, walked without following a link
    (:func:`train.runfiles.private_dir`). A folder another user planted there (to forge or hide
    heartbeats, or to have a clean-up delete theirs) is refused in one line
    (:class:`train.runfiles.NotOursError`)."""
    top, parts = _node_local_parts(run_dir, attempt, node, root)
    return private_dir(top, *parts)


@dataclass(frozen=True)
class Beat:
    """One rank's newest heartbeat: its last completed step (-1: none yet), what it does now,
    how many pulses it gave and when it last wrote (wall clock of its node)."""

    rank: int
    step: int
    time: float
    phase: str = "train"
    pulses: int = 0


def _phase_code(name: str) -> int:
    return PHASES.index(name) if name in PHASES else PHASES.index("busy")


class Heartbeat:
    """A rank's node-local progress file: each write is one 32-byte ``pwrite`` (no fsync)."""

    def __init__(self, directory: Path, rank: int, meta: dict[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        write_text(directory / f"rank-{rank}.json", json.dumps(meta))
        self.path = directory / f"rank-{rank}"
        self._fd: int | None = open_fd(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)

    def write(self, step: int, phase: str = "train", pulses: int = 0) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, _BEAT.pack(step, time.time(), _phase_code(phase), pulses), 0)

    def beat(self, step: int) -> None:
        """A completed step (phase ``train``)."""
        self.write(step)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_beat(path: Path, rank: int) -> Beat | None:
    """A rank's heartbeat, None when missing, short or foreign."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_BEAT.size)
    except OSError:
        return None
    if len(raw) != _BEAT.size:
        return None
    step, t, phase, pulses = _BEAT.unpack(raw)
    name = PHASES[phase] if 0 <= phase < len(PHASES) else "busy"
    return Beat(rank, step, t, name, pulses)


def read_beats(directory: Path, ranks: Any) -> dict[int, Beat]:
    """The heartbeats of ``ranks`` (an iterable, or a count: 0..N-1) found in ``directory``."""
    wanted = range(ranks) if isinstance(ranks, int) else ranks
    beats: dict[int, Beat] = {}
    for rank in wanted:
        beat = read_beat(directory / f"rank-{rank}", rank)
        if beat is not None:
            beats[rank] = beat
    return beats


def auto_timeout(
    mean_step_s: float | None, longest_gap_s: float, floor: float = HANG_FLOOR_S
) -> float:
    """The default hang timeout from the measured step time, never below ``floor``."""
    return max(floor, 20.0 * (mean_step_s or 0.0), 3.0 * longest_gap_s)


def allowance(phase: str, timeout: float, *, command: bool = False) -> float:
    """How long a rank in ``phase`` may be silent: the timeout while it trains or waits for its
    peers (or runs a command), ``max(timeout, BUSY_FLOOR_S)`` in a declared busy phase."""
    if command or phase in NOT_BUSY:
        return timeout
    return max(timeout, BUSY_FLOOR_S)


# ------------------------------------------------------------------------------ rank side


class Watchdog:
    """In a rank: the node-local heartbeat, the stack-dump handler and, on the node's first local
    rank, the node's watcher process."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        world_size: int,
        job_id: str | None,
        restart_count: int,
        timeout_s: float | None,
        budgets: Mapping[str, Any],
        poll_s: float | None = None,
        node: str | None = None,
        local_rank: int = 0,
        local_world_size: int = 1,
        command_pid: int | None = None,
        local_root: Path | None = None,
        summary_s: float | None = None,
        in_place: int = 0,
        in_place_supervised: bool = False,
    ) -> None:
        attempt = attempt_name(job_id, f"{restart_count}.{in_place}" if in_place else restart_count)
        node = node or socket.gethostname().split(".")[0]
        self.local_dir = make_node_local_dir(run_dir, attempt, node, local_root)
        meta = {"rank": rank, "pid": os.getpid(), "node": node, "command_pid": command_pid}
        # once per rank and attempt in the shared run directory: who ran where
        shared = make_dirs(run_dir, PROGRESS, attempt)  # never through a planted link
        write_text(shared / f"rank-{rank}.json", json.dumps(meta))
        self.heartbeat = Heartbeat(self.local_dir, rank, meta)
        self._lock = threading.Lock()
        self._step, self._phase, self._pulses = -1, "start", 0
        self._write()
        self.stacks_path = self.local_dir / f"rank-{rank}.stacks"
        self._stacks: IO[str] | None = open_text(self.stacks_path, "w")
        faulthandler.register(DUMP_SIGNAL, file=self._stacks, all_threads=True, chain=False)
        self._watcher: subprocess.Popen[bytes] | None = None
        if local_rank != 0:
            return
        cmd = python_module_argv(
            "train.hang",  # the watcher, stepped back for the ranks (train/hang/__main__.py)
            "--run-dir", str(run_dir), "--attempt", attempt, "--node", node,
            "--local-dir", str(self.local_dir), "--world-size", str(world_size),
            "--local-world-size", str(local_world_size), "--pid", str(os.getpid()),
            "--budgets", json.dumps(dict(budgets)), "--job-id", job_id or "",
            "--restart-count", str(restart_count), "--in-place", str(in_place),
        )  # fmt: skip
        if command_pid is not None:
            cmd += ["--command"]
        if in_place_supervised:
            cmd += ["--in-place-supervised"]
        if timeout_s:
            cmd += ["--timeout", str(timeout_s)]
        if poll_s:
            cmd += ["--poll", str(poll_s)]
        if summary_s:
            cmd += ["--summary", str(summary_s)]
        # Own session: a signal to the rank's process group does not reach the watcher.
        self._watcher = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)

    def _write(self) -> None:
        self.heartbeat.write(self._step, self._phase, self._pulses)

    def beat(self, step: int) -> None:
        """A completed step (a progress listener of :class:`train.session.RunSession`)."""
        with self._lock:
            self._step, self._phase = step, "train"
            self._write()

    def pulse(self, *_: object) -> None:
        """Work goes on within the current phase (a phase of a checkpoint save): any thread."""
        with self._lock:
            self._pulses += 1
            self._write()

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Declare ``what`` (``eval``, ``save``, ...) for the time of the block: the rank may be
        silent for :func:`allowance` of a busy phase; then back to the phase it was in."""
        with self._lock:
            before, self._phase = self._phase, what
            self._write()
        try:
            yield
        finally:
            with self._lock:
                self._phase = before if self._phase == what else self._phase
                self._write()

    @contextlib.contextmanager
    def waiting(self, within: tuple[str, ...] | None = None) -> Iterator[None]:
        """Waiting for the other ranks for the time of the block (phase ``wait``: silent only
        for the timeout); then back to the phase it was in. ``within``: only when the rank is
        in one of these phases now (a background save's wait leaves training's phase alone)."""
        with self._lock:
            switch = within is None or self._phase in within
            if switch:
                before, self._phase = self._phase, "wait"
                self._write()
        try:
            yield
        finally:
            if switch:
                with self._lock:
                    self._phase = before if self._phase == "wait" else self._phase
                    self._write()

    @property
    def phase(self) -> str:
        return self._phase

    def close(self) -> None:
        """The run ended on its own: stop the watcher, remove this rank's node-local files."""
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
        self.heartbeat.close()
        rank = self.heartbeat.path.name
        for name in (rank, f"{rank}.json", f"{rank}.stacks"):
            with contextlib.suppress(OSError):
                (self.local_dir / name).unlink()


def start_watchdog(
    requeue: RequeueConfig, env: DistEnv, run_dir: Path, *, command_pid: int | None = None
) -> Watchdog | None:
    """The watchdog for this rank, or None when ``requeue.hang_watchdog`` is off.

    ``command_pid``: this rank supervises ``entrypoint.command`` (that child, in its own
    session): its progress is what its training processes write, the job hangs when NO rank's
    command wrote anything for the timeout (``requeue.hang_timeout_s``, default
    :data:`COMMAND_FLOOR_S`), and at a hang the watcher describes the command's processes
    (state, kernel wait channel, kernel stack where readable) instead of Python stacks and
    ends the command's process group with the rank."""
    if not requeue.hang_watchdog:
        return None
    return Watchdog(
        Path(run_dir),
        rank=env.rank,
        world_size=env.world_size,
        job_id=env.job_id,
        restart_count=env.restart_count,
        in_place=env.in_place,
        in_place_supervised=env.in_place_supervised,
        node=env.node_name,
        local_rank=env.local_rank,
        local_world_size=env.local_world_size,
        timeout_s=requeue.hang_timeout_s,
        # the whole requeue: section: the watcher decides with the run's budgets, all of them
        budgets=requeue.model_dump(mode="json"),
        command_pid=command_pid,
    )
