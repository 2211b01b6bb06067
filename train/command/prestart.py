"""The user's command started first (issue 46): before the spec models, the run session and the
supervisor are imported and set up, which the command does not wait for.

:mod:`jobs.taskstart` (before submitit loads) or :class:`jobs.launch.TrainLaunch` calls
:func:`start_first` as the task starts, with the command's argv as ``jobs submit`` resolved it
from the validated spec (a command that needs nothing of the allocation to be rendered: no
``${NAME}``, no torchrun; else nothing is started first and the supervisor starts it as before).
Only stdlib and the torch-free, pydantic-free modules of ``train`` are imported here: the
command's interpreter gets the cores while ours imports the rest, and this process steps back
once the command is started (its nice and, where its session is the task's own, the session's
autogroup: :func:`train.procfs.step_back`), so that what it does next never takes CPU from the
command's own start.

What the command is told must not change after it started, so it starts first only where the
run's resume decision is known without the spec: this run directory holds no checkpoint folder
entry of ours (``RUN_DIR/checkpoints`` missing or empty), so there is nothing for
``TRAIN_RESUME_FROM`` and nothing interrupted to clear. The session then takes that decision as
made (:func:`started_first`) instead of deciding again, and the supervisor supervises the
process already started (:func:`take_started_first`) instead of starting one: the stop, the
failures, the hang watch and the records are the supervisor's, as for a command it started
itself. A run that does not start (bad input, a refused run directory) stops it
(:func:`abandon_started_first`): it never trains unsupervised.

Our set-up then waits behind the command's own start (:func:`wait_behind`): this process sleeps,
using no CPU, until the command's start is over: its main thread wanted at most half a core
over the last two seconds (on a CPU or waiting for one: it trains on a GPU, waits or sleeps; a
start wants a whole one, also where it gets less, and a short wait for a peer is still the
start), at most :data:`WAIT_CAP_S`. A stop signal (Slurm's, held by the early-signal store) or
the command's exit ends the wait at once: the supervisor sets up then and acts on it as it
would have. The command's first write seen in
the wait is handed on (its first output, for the records), and the wait is the
``behind_command`` phase of the start's record.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from train.command.processes import (
    child_environ,
    resolve_argv,
    signum_of,
    spawn,
    step_back_for_command,
    wchar,
)
from train.env import DistEnv
from train.procfs import PROC
from train.runfiles import CHECKPOINTS
from train.startup import mark
from train.stop import early_signal_pending

__all__ = [
    "Prestarted",
    "abandon_started_first",
    "start_first",
    "started_first",
    "take_started_first",
    "wait_behind",
]

#: The longest our set-up waits behind a command started first (s): a command that keeps its
#: cores busy from its first instruction (CPU training) gets its supervisor after this.
WAIT_CAP_S = 8.0
#: How often the wait looks at the command (its CPU and its writes: small reads of its files).
WAIT_POLL_S = 0.05
#: The command's start is over when its main thread wanted at most ``QUIET_CPU`` of a core over
#: the last ``QUIET_WINDOW_S`` seconds: its time on a CPU plus its time waiting for one
#: (``/proc/PID/schedstat``; its CPU time alone where the kernel keeps no such count). An
#: interpreter's start wants a whole core (imports are CPU), also on a node whose cores are all
#: taken, where it gets less; a training step on a GPU, a sleep, a process stopped (``kill
#: -STOP``) or waiting for I/O want little or none; a rendezvous that waits a second for a late
#: peer is still the start.
QUIET_WINDOW_S = 2.0
QUIET_CPU = 0.5

log = logging.getLogger("train.command.supervisor")


@dataclass
class Prestarted:
    """A command started before the supervisor: its process, its argv (as run) and when."""

    proc: subprocess.Popen[bytes]
    argv: list[str]
    started_at: float
    taken: bool = False
    #: when :func:`wait_behind` first saw it write (its first output), if it did
    first_write_at: float | None = None
    #: :func:`wait_behind` waited for its start already (once per command)
    waited: bool = False


_STARTED: list[Prestarted] = []  # at most one per process (the task's command)


def can_prestart(run_dir: Path) -> bool:
    """Nothing of ours to resume from and nothing interrupted to clear in ``run_dir``."""
    try:
        return not any(True for _ in (run_dir / CHECKPOINTS).iterdir())
    except FileNotFoundError:
        return True
    except OSError:  # not a folder, not ours to read: the supervisor's full path says why
        return False


def start_first(
    command: Sequence[str],
    run_dir: Path,
    job_signal: str,
    stop_signal: str,
    environ: Mapping[str, str] = os.environ,
) -> Prestarted | None:
    """Start ``command`` now when :func:`can_prestart`; None (nothing started) otherwise, or
    when anything about it fails: the supervisor then starts it the usual way and says why.
    Once per process: a command already started first (by :mod:`jobs.taskstart`, before
    submitit loaded) is returned when it is this one (the same argv), else None."""
    if not command:
        return None
    if _STARTED:
        first = _STARTED[0]
        same = not first.taken and first.argv == resolve_argv(list(command))
        return first if same else None
    try:
        if not can_prestart(run_dir):
            return None
        env = DistEnv.from_env(environ)
        argv = resolve_argv(list(command))
        child_env = child_environ(dict(environ), env, run_dir, None, stop_signal)
        proc = spawn(argv, child_env, int(signum_of(job_signal)), stop_signal)
    except Exception as exc:  # bad environment, missing program: the full path reports it
        log.debug("the command was not started first: %s", exc)
        return None
    started = Prestarted(proc, argv, time.time())
    _STARTED.append(started)
    # the imports and the set-up of ours that follow wait for the CPU the command leaves
    step_back_for_command()
    return started


def _cpu_and_written(pid: int, proc: Path = PROC) -> tuple[float | None, int]:
    """The seconds ``pid``'s main thread spent on a CPU or waiting for one (``schedstat``;
    else the process's user + system CPU time) and the bytes it has written so far
    (``wchar``): three small reads of its own files, no scan of /proc; (None, 0) when it is
    gone."""
    base = proc / str(pid)
    try:
        on_cpu, waiting = (base / "schedstat").read_text().split()[:2]
        wanted: float | None = (int(on_cpu) + int(waiting)) / 1e9
    except (OSError, ValueError):
        wanted = None
    if wanted is None:
        try:
            fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
            wanted = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None, 0
    return wanted, wchar(pid, proc)


def wait_behind(
    started: Prestarted,
    cap_s: float = WAIT_CAP_S,
    poll_s: float = WAIT_POLL_S,
    pending: Callable[[], bool] = early_signal_pending,
    look: Callable[[int], tuple[float | None, int]] = _cpu_and_written,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Sleep until the command's own start is over; why it ended: ``"signal"`` (a stop signal
    is held), ``"exited"``, ``"quiet"`` (it wanted at most :data:`QUIET_CPU` of a core over
    the last :data:`QUIET_WINDOW_S`), ``"cap"``, or ``"waited"`` at once when it waited for this
    command before (once per command)."""
    if started.waited:
        return "waited"
    started.waited = True
    deadline = clock() + cap_s
    seen: collections.deque[tuple[float, float]] = collections.deque()  # (when, CPU seconds)
    written: int | None = None
    why = "cap"
    while True:
        if pending():
            why = "signal"
            break
        if started.proc.poll() is not None:
            why = "exited"
            break
        cpu, now_written = look(started.proc.pid)
        now = clock()
        if written is None:
            written = now_written
        elif now_written != written and started.first_write_at is None:
            started.first_write_at = time.time()
        if cpu is not None:
            seen.append((now, cpu))
            while len(seen) > 1 and now - seen[1][0] >= QUIET_WINDOW_S:
                seen.popleft()  # the oldest look that still spans the whole window stays
            then, before = seen[0]
            if now - then >= QUIET_WINDOW_S and cpu - before <= QUIET_CPU * (now - then):
                why = "quiet"
                break
        if now >= deadline:
            break
        time.sleep(poll_s)
    mark("behind_command")
    log.debug("set-up behind the command's start: %s", why)
    return why


def started_first() -> bool:
    """Whether a command was started first in this process (the resume decision made:
    nothing of ours to resume from)."""
    return bool(_STARTED)


def take_started_first(argv: Sequence[str]) -> Prestarted | None:
    """The command started first, for the supervisor of the same ``argv`` (once)."""
    for started in _STARTED:
        if not started.taken and started.argv == list(argv):
            started.taken = True
            return started
    return None


def abandon_started_first() -> None:
    """Stop a command started first that no supervisor took (the run failed to set up: bad
    input, a refused run directory): it must not train unsupervised."""
    from train.command.processes import stop_group

    for started in _STARTED:
        if not started.taken:
            started.taken = True
            log.warning("the run did not start: stopping the command started first")
            stop_group(started.proc)
            if started.proc.stderr is not None:
                started.proc.stderr.close()
