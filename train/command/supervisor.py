"""Supervise the user's own program (``entrypoint: {command: [...]}``) through Slurm's stops.

One supervisor per task (rank) runs the command as a child in its own session and:

- starts it with the job's requeue signal (``requeue.signal``, USR2 by default) IGNORED, because
  Slurm delivers that signal to every process of the step (:mod:`train.command.processes`): a
  script that
  handles no signal no longer dies of it, and a program that installs its own handler for it
  still gets it (from Slurm, once);
- on that signal (preemption or time limit), rank 0 asks Slurm which it is and records it in
  ``RUN_DIR/events.jsonl`` (its own budget), then the command gets the signal it listens for,
  ONCE (``entrypoint.stop_signal``: ``auto`` sends USR1 to a process that catches USR1, as
  Lightning's ``SLURMEnvironment`` does, else USR2, else TERM to one that catches TERM; ``none``
  or nothing caught: the command is stopped at once), and ``entrypoint.stop_grace_s`` seconds
  to save and exit;
- then rank 0 requeues the job (``scontrol requeue``), unless the command or Slurm already did
  (Lightning requeues itself: recorded with ``via: "command"``, not requeued twice);
- a command that exits non-zero without being stopped is a failure: recorded with its exit code
  or signal name and the last lines of its stderr, requeued within ``requeue.max_failures``.

The command finds where it was through its environment (see :func:`child_environ`): RUN_DIR,
TRAIN_RESTART_COUNT, TRAIN_RESUME_FROM (our newest valid checkpoint, when there is one),
TRAIN_CHECKPOINT_DIR, TRAIN_STOP_SIGNAL, the torchrun variables, and
PL_TRAINER_DEFAULT_ROOT_DIR=RUN_DIR so that Lightning keeps (and finds) its ``hpc_ckpt_N.ckpt``
in the run directory unless the script sets ``default_root_dir`` itself. ``python`` (any bare
name found beside the interpreter running this, e.g. ``torchrun``) means that interpreter's
environment: the one ``jobs`` was submitted from.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from train.command import selfrequeue
from train.command.launchers import TorchrunNode, expand_vars, torchrun_argv
from train.command.prestart import abandon_started_first, take_started_first
from train.command.processes import (
    StderrTail,
    child_environ,
    resolve_argv,
    shields,
    signal_group,
    signal_name,
    signum_of,
    spawn,
    step_back_for_command,
    stop_group,
    wait_exit,
    written_bytes,
)
from train.command.rootcause import read_reports, write_report
from train.command.stop import StopHandling
from train.env import DistEnv
from train.errors import EntrypointError
from train.hang import Watchdog, start_watchdog
from train.history import RunHistory, attempt_completed_at
from train.procfs import PROC
from train.runfiles import EVENTS_FILE
from train.spec import RunConfig
from train.stop import (
    BUDGET_EXHAUSTED_EXIT_CODE,
    REQUEUE_EXIT_CODE,
    exception_line,
    failure_claimed,
    pop_early_signals,
    request_requeue,
    root_report,
    rules_of,
    signature,
)

if TYPE_CHECKING:
    from cluster import Slurm

__all__ = ["run_command"]

log = logging.getLogger(__name__)

# How soon a stop is acted on: every rank forwards the command's signal within this of Slurm's,
# so a handler that runs collectives (Lightning's) meets the other ranks' handlers, not their
# all-reduce. A sleep between two waitpid(WNOHANG) calls: 50 cheap calls a second.
_POLL_S = 0.02
_LOOK_S = 1.0  # how often a watched command's writes are summed (a /proc scan)
_FIRST_LOOK_S = 0.2  # ... until its first write (the end of its start-up: first_output_at)
# how long a failed rank other than 0 waits for rank 0 to record the run complete
_COMPLETE_WAIT_S = 15.0
# A rank other than 0 whose command fell silent this long looks (then again every as long)
# whether rank 0 recorded the run complete: a command still there stop_grace_s after that is
# stopped (a gloo process can hang at its exit: README "End a DDP script"). A stat
# of events.jsonl, and a read only when it changed: nothing while the command writes, as a
# training command does all the time (gloo's sockets).
_QUIET_LOOK_S = 5.0


class CommandRun(StopHandling):
    """One task's supervision of the command (see the module docstring)."""

    #: after the command exited, how long a stop signal may take to reach us too
    stop_beat_s = 1.0

    def __init__(
        self,
        config: RunConfig,
        env: DistEnv,
        run_dir: Path,
        resume_from: Path | None,
        *,
        client: Slurm | None = None,
        proc_root: Path = PROC,
        early: Any = None,
        checkpoint_world_size: int | None = None,
    ) -> None:
        entry = config.entrypoint
        if entry is None or entry.command is None:
            raise EntrypointError("the spec has no entrypoint.command")
        self.config, self.env, self.run_dir, self.resume_from = config, env, run_dir, resume_from
        self.checkpoint_world_size = checkpoint_world_size
        self.argv = resolve_argv(entry.command)
        self.stop_signal = entry.stop_signal
        # the command must be gone before the time limit: Slurm's signal comes signal_delay_s
        # (or more) before it, and the requeue needs a few seconds
        limit = max(1.0, config.requeue.signal_delay_s - 10.0)
        self.grace_s = min(float(entry.stop_grace_s), limit)
        self.job_signal = int(signum_of(config.requeue.signal))
        self.client = client
        self.proc_root = proc_root
        self.history = RunHistory(run_dir) if env.is_main else None
        self.stops: list[tuple[int, float]] = []
        self._previous: dict[int, Any] = {}
        self.watchdog: Watchdog | None = None
        # a train.stop.signals.PreemptionGuard that held the stop signals while the run was set up
        self.early = early
        # events.jsonl as last read by _rank0_completed_at: (size, mtime_ns), the answer
        self._seen: tuple[tuple[int, int] | None, float | None] = (None, None)

    # -- signals ------------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stops.append((signum, time.time()))  # only remember: acted on in the main loop
        # at once: a command that gets Slurm's signal itself (Lightning's handler) must find
        # its `scontrol requeue` ours (train.command.selfrequeue)
        self._mark_stopping()

    def _install(self) -> None:
        for sig in dict.fromkeys((self.job_signal, int(signal.SIGTERM))):
            self._previous[sig] = signal.signal(sig, self._handle)
        self.stops.extend((int(s), time.time()) for s in pop_early_signals())
        held = self.early
        if held is not None and held.requested and held.signal_name:
            self.stops.append((int(signum_of(held.signal_name)), held.received_at or time.time()))

    def _uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def shielded(self) -> bool:
        """Whether the command starts with the job's signal ignored (:func:`shields`)."""
        return shields(self.job_signal, self.stop_signal)

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the command to its end; the task's exit code."""
        if self.history is not None:
            log.info("running %s", " ".join(self.argv))
        self._install()
        try:
            env = child_environ(
                os.environ,
                self.env,
                self.run_dir,
                self.resume_from,
                self.stop_signal,
                checkpoint_world_size=self.checkpoint_world_size,
            )
            state = env.get(selfrequeue.STATE_ENV)
            self.requeue_state = Path(state) if state else None
            argv = self.command_line(env)
            if argv != self.argv:
                log.info("as %s", " ".join(argv))
            # started before us (train.command.prestart): the same argv, told the same
            first = take_started_first(argv) if self.resume_from is None else None
            abandon_started_first()  # one that is not this command's must not run unsupervised
            if first is None and self.stops:
                # stopped while we were starting: nothing to run, only to requeue
                return self._after_stop(None, None)
            if first is not None:
                proc = first.proc
                if self.first_output_at is None:  # its first write, seen while we waited
                    self.first_output_at = first.first_write_at
                log.debug("the command started %.3f s before its supervisor",
                          time.time() - first.started_at)  # fmt: skip
            else:
                try:
                    proc = spawn(argv, env, self.job_signal, self.stop_signal)
                except OSError as exc:
                    raise EntrypointError(
                        f"entrypoint.command {self.argv[0]!r}: {exc.strerror or exc}"
                    ) from exc
            step_back_for_command()  # after the command's start: it never inherits it
            assert proc.stderr is not None
            tail = StderrTail(proc.stderr)
            try:
                return self._supervise(proc, tail)
            finally:
                if self.watchdog is not None:
                    self.watchdog.close()
                    self.watchdog = None
                if proc.poll() is None:
                    signal_group(proc.pid, signal.SIGKILL)
                    wait_exit(proc, 10)
                proc.stderr.close()
        finally:
            self._uninstall()
            selfrequeue.clear(self.requeue_state)

    def command_line(self, environ: Mapping[str, str]) -> list[str]:
        """The argv that runs: ``${NAME}`` expanded from the command's environment, and a
        torchrun launch told the allocation's nodes (:mod:`train.command.launchers`)."""
        env = self.env
        node = TorchrunNode(
            num_nodes=env.num_nodes,
            node_rank=env.node_rank,
            master_addr=env.master_addr,
            master_port=env.master_port,
            gpus_on_node=env.gpus_on_node,
        )
        return torchrun_argv(expand_vars(self.argv, environ), node)

    def _supervise(self, proc: subprocess.Popen[bytes], tail: StderrTail) -> int:
        written, beats, next_look = written_bytes(proc.pid), 0, 0.0
        watch = True  # until start_watchdog says the watchdog is off
        last_write = next_quiet_look = time.monotonic()
        lingers = not self.env.is_main and self.env.world_size > 1
        while True:
            code = proc.poll()
            if self.stops:
                return self._after_stop(proc, tail)
            if code is None:
                now = time.monotonic()
                if lingers and now >= next_quiet_look and now - last_write >= _QUIET_LOOK_S:
                    next_quiet_look = now + _QUIET_LOOK_S
                    done_at = self._rank0_completed_at()
                    if done_at is not None and time.time() - done_at >= self.grace_s:
                        return self._stop_lingering(proc, done_at)
                if (watch or lingers) and now >= next_look:
                    # progress of a command: its training processes wrote something (output,
                    # files, gloo's sockets), a launcher's own chatter not counted (torchrun's
                    # keep-alive): see README "Hangs of your own command". Scanned with the
                    # watchdog off too on ranks other than 0: their silence is when they look
                    # for rank 0's complete (above), never all run long
                    next_look = now + (_LOOK_S if beats else _FIRST_LOOK_S)
                    now_written = written_bytes(proc.pid)
                    if now_written != written:
                        written, beats, last_write = now_written, beats + 1, now
                        if self.first_output_at is None:
                            self.first_output_at = time.time()
                        if watch and self.watchdog is None:
                            # The watch starts with the command's first write: a command is
                            # watched only once it wrote (before, it starts: imports, the
                            # rendezvous), and the node's watcher process then does not take
                            # the cores from the command's own start (the import of torch)
                            self.watchdog = start_watchdog(
                                self.config.requeue, self.env, self.run_dir, command_pid=proc.pid
                            )
                            watch = self.watchdog is not None
                        if self.watchdog is not None:
                            self.watchdog.beat(beats)
                time.sleep(_POLL_S)
                continue
            if code != 0:
                exited_at = time.time()
                if self._reports_root():
                    # at once, before the beat below: the peers that fail after it (its
                    # cascade) find it when they decide (train.command.rootcause)
                    self._report(exited_at, code, tail.lines())
                # Slurm's signal reaches the command and us at the same moment: a command killed
                # by it (or by the TERM after it) was stopped, not failed
                if self._stop_arrives():
                    return self._after_stop(proc, tail)
                return self._failed(code, tail)
            # A command that saves on the stop signal exits 0 the moment it gets it, and may
            # be seen gone before our own copy of that signal is handled: it stopped, it did
            # not complete (recorded `complete`, the run would end with its work left). Rank 0
            # (the one that records) gives the signal the same beat before `complete`.
            if self.history is not None and self._stop_arrives():
                return self._after_stop(proc, tail)
            if self.history is not None:
                self._append("complete", exit_code=0)
            return 0

    def _stop_arrives(self) -> bool:
        """The command has exited: whether a stop signal reached us too, within
        :attr:`stop_beat_s` (the step's signal reaches every process of it within
        milliseconds)."""
        deadline = time.monotonic() + self.stop_beat_s
        while not self.stops and time.monotonic() < deadline:
            time.sleep(0.05)
        return bool(self.stops)

    def _rank0_completed_at(self) -> float | None:
        """When rank 0 recorded this attempt's run complete (None: not yet). Reads
        ``events.jsonl`` only when its size or time changed since the last look."""
        path = self.run_dir / EVENTS_FILE
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_size, st.st_mtime_ns)
        if key == self._seen[0]:
            return self._seen[1]
        at = attempt_completed_at(
            RunHistory(self.run_dir).events(),
            job_id=self.env.job_id,
            restart_count=self.env.restart_count,
            in_place=self.env.in_place,
        )
        self._seen = (key, at)
        return at

    def _stop_lingering(self, proc: subprocess.Popen[bytes], done_at: float) -> int:
        """Rank 0 completed the run ``grace_s`` or more ago and this rank's command, silent,
        is still there (hung at its exit): it is stopped, and the task ends as complete."""
        log.warning(
            "rank %d: the command is still running, silent, %.0f s after rank 0 completed the "
            "run: stopping it (the run is complete; a hang at its exit, e.g. gloo's process "
            "group destroyed by DDP's reducer)",
            self.env.rank, time.time() - done_at,
        )  # fmt: skip
        stop_group(proc)
        return 0

    def _completed_by_rank0(self) -> bool:
        """A rank other than 0 whose command failed: did rank 0's command complete the run
        (its ``complete`` event for this attempt, within :data:`_COMPLETE_WAIT_S`)? A failure
        another rank already claimed ends the wait at once."""
        if self.env.is_main or self.env.world_size <= 1:
            return False
        deadline = time.monotonic() + _COMPLETE_WAIT_S
        while True:
            if self._rank0_completed_at() is not None:
                return True
            if time.monotonic() >= deadline or failure_claimed(
                self.run_dir, self.env.job_id, self.env.attempt
            ):
                return False
            time.sleep(0.5)

    def _reports_root(self) -> bool:
        """Several ranks under Slurm: each failing rank reports, the decider picks the root."""
        return bool(self.env.job_id) and self.env.world_size > 1

    def _report(self, exited_at: float, code: int, lines: list[str]) -> None:
        env = self.env
        error = self._error(code, lines)
        # a shell that ran the command ends with 128+N for a signal N
        killed_by = (
            signal_name(-code if code < 0 else code - 128) if code < 0 or code > 128 else None
        )
        write_report(
            self.run_dir, env.job_id, env.attempt, env.rank, exited_at, error, lines, killed_by
        )

    @staticmethod
    def _error(code: int, lines: list[str]) -> str:
        """``command exited 1: <the exception line>``: the last ``...Error:`` line of its
        traceback, whole (not the last stderr line: a hint after it, cut mid-word), else its
        last line."""
        how = f"killed by {signal_name(-code)}" if code < 0 else f"exited {code}"
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
        shown = exception_line(lines) or last
        return f"command {how}" + (f": {shown}" if shown else "")

    def _root(self, error: str, details: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The failure to record: this rank's, or the root's when another rank failed first
        with more than the symptoms of a peer's death (this one is its cascade)."""
        if not self._reports_root():
            return error, details
        reports = read_reports(self.run_dir, self.env.job_id, self.env.attempt)
        root = root_report(reports, rules_of(self.config.requeue.failure_rules))
        if root is None or root.get("rank") == self.env.rank:
            return error, {**details, "root_rank": self.env.rank}
        log.warning("rank %d: %s, the cascade of rank %s's failure: %s",
                    self.env.rank, error, root.get("rank"), root.get("error"))  # fmt: skip
        tail = root.get("stderr_tail")
        root_error = str(root.get("error") or error)
        return root_error, {
            **details,
            "stderr_tail": [t for t in tail if isinstance(t, str)]
            if isinstance(tail, list)
            else [],
            "signature": signature([root_error, tail]),
            "root_rank": root.get("rank"),
            "cascade": {"rank": self.env.rank, "error": error[:300]},
        }

    def _failed(self, code: int, tail: StderrTail) -> int:
        lines = tail.lines()
        error = self._error(code, lines)
        if self._completed_by_rank0():
            # seen: Lightning's rank 1 aborting at exit ("terminate called without an active
            # exception") after rank 0 finished the run: requeued, the whole run trained again
            log.warning("%s after rank 0 completed the run: not a failure, not requeued", error)
            return 0
        log.error("%s (argv: %s)", error, " ".join(self.argv))
        details: dict[str, Any] = {"stderr_tail": lines, "signature": signature([error, lines])}
        details["signal" if code < 0 else "exit_code"] = signal_name(-code) if code < 0 else code
        error, details = self._root(error, details)
        result = _request_failure(self.env, self.run_dir, self.config, error, details)
        if result != 1:
            return result  # over budget, or "requeue me" outside Slurm
        # The task fails with the command's own status (a signal as 128+N, like a shell) unless
        # that would read as one of ours (75: requeue, 3: budget spent).
        own = 128 - code if code < 0 else code
        return own if own not in (REQUEUE_EXIT_CODE, BUDGET_EXHAUSTED_EXIT_CODE) else 1


def _request_failure(
    env: DistEnv, run_dir: Path, config: RunConfig, error: str, details: dict[str, Any]
) -> int:
    """Record the failure (first failing rank) and requeue within ``requeue.max_failures``."""
    return request_requeue(env, run_dir, config.requeue, "failure", error=error, details=details)


def run_command(
    config: RunConfig,
    env: DistEnv,
    run_dir: Path,
    resume_from: Path | None = None,
    *,
    early: Any = None,
    checkpoint_world_size: int | None = None,
) -> int:
    """Run ``config.entrypoint.command`` under supervision; return the task's exit code.

    ``early``: the run's :class:`train.stop.signals.PreemptionGuard` for the job's signal and TERM,
    installed while the run was set up; a stop it caught then is acted on at once.
    ``checkpoint_world_size``: the world size ``resume_from`` was written at
    (TRAIN_CHECKPOINT_WORLD_SIZE).
    """
    return CommandRun(
        config, env, run_dir, resume_from, early=early, checkpoint_world_size=checkpoint_world_size
    ).run()
