"""What submitit runs inside the allocation: :class:`TrainLaunch` (picklable, torch-free),
pickled inside submitit's own ``DelayedSubmission`` by ``jobs submit``.

Each srun task (``python -P -u -m jobs.taskstart ... -- -u -m submitit.core._submit
RUN_DIR/slurm``: :mod:`jobs.taskstart` starts a command that can start first, then runs
submitit's module in the same interpreter) unpickles it and calls it. It takes the signals back
from submitit (whose own handlers would requeue or exit on their own terms) into train's early-
signal store (:mod:`train.stop.signals`, stdlib only, imported when the task starts), then
imports ``train.cli`` and runs ``train.cli.main`` in-process. A stop signal that arrives before
training starts is kept in that store and train's preemption guard takes it over when it is
installed (no re-sending, no polling thread). The job's exit status is train's exit code.
submitit's log lines reach the rank's log once (:func:`quiet_submitit_logging`).

``python -P -m jobs.launch --after-step`` is what the batch script asks after each step
(:func:`after_step`; the loop is :func:`jobs.executor.in_place_loop`).
"""

from __future__ import annotations

import os
import pickle
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from train.spec import RequeueConfig


def quiet_submitit_logging() -> None:
    """Each submitit line once in the rank's log (issue 45).

    submitit's logger writes to two handlers of its own, INFO and up to stdout and WARNING and
    up to stderr, which the batch script joins into one log (``stderr_to_stdout``): a warning
    showed twice. And it propagates to the root logger, where train's handler (train.logsetup)
    writes every line again. From here on: its stdout handler only, no propagation."""
    import logging

    log = logging.getLogger("submitit")
    log.propagate = False
    streams = [h for h in log.handlers if isinstance(h, logging.StreamHandler)]
    if len(streams) > 1:  # submitit's pair (submitit_out, submitit_err): keep the first
        for handler in streams[1:]:
            log.removeHandler(handler)
        streams[0].setLevel(logging.DEBUG)


def release_submitit_signals(names: tuple[str, ...] = ("USR2", "TERM")) -> None:
    """Replace submitit's handlers (requeue on USR2, ignore TERM) with train's early-signal
    store until train's guard installs its own handlers."""
    from train.stop import install_early  # torch-free; loaded inside the allocation only

    install_early(names)


@dataclass(frozen=True)
class TrainLaunch:
    """Run ``python -m train --config CONFIG --run-dir RUN_DIR [extra...]`` in this process.

    ``signal_name`` is the spec's requeue signal (USR2 by default); it is released from
    submitit as well as USR2 and TERM. ``resolved`` (JSON) is the task's validated spec when
    it was not written at submission (big sweeps): the task writes ``config`` from it first.
    ``command`` (with its ``stop_signal``): the spec's ``entrypoint.command`` when it can start
    before the spec is read again (:func:`command_first`): the task starts it first
    (:mod:`train.command.prestart`), waits asleep behind its start, and its supervisor takes
    it over.
    """

    config: str
    run_dir: str
    signal_name: str = "USR2"
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    resolved: str = ""
    command: tuple[str, ...] = ()
    stop_signal: str = "auto"

    def materialize(self) -> None:
        """Write ``config`` from ``resolved`` unless it exists (every rank may race: atomic)."""
        path = Path(self.config)
        if not self.resolved or path.exists():
            return
        import json

        from train.runfiles import atomic_write, make_dirs
        from train.spec import dump_spec  # the one writer the spec loader reads back

        make_dirs(path.parent)
        data = json.loads(self.resolved)
        atomic_write(path, dump_spec(data), durable=False)  # every rank may race: each whole

    def argv(self) -> list[str]:
        return ["--config", self.config, "--run-dir", self.run_dir, *self.extra_args]

    def __call__(self) -> int:
        release_submitit_signals(("USR2", "TERM", self.signal_name))
        if self.command and not self.extra_args:
            # the user's command first, before the spec models and the session (issue 46)
            from train.command import start_first, wait_behind

            started = start_first(
                self.command, Path(self.run_dir), self.signal_name, self.stop_signal
            )
            if started is not None:
                # our set-up waits behind the command's own start (a stop signal or its exit
                # ends the wait at once): it takes none of the cores the command starts on
                wait_behind(started)
        quiet_submitit_logging()
        # submitit requeues on its own only for checkpointable callables after a timeout; we are
        # not one (no .checkpoint), and train decides about requeues through its budgets.
        os.environ.setdefault("SLURM_TRAIN_RUN_DIR", self.run_dir)
        self.materialize()
        from train.startup import pause_collector

        pause_collector()  # until the run starts (train.startup says why)
        from train.cli import main  # torch is imported here, inside the allocation only

        try:
            code = int(main(self.argv()) or 0)
        finally:
            if self.command:
                from train.command import abandon_started_first

                abandon_started_first()  # the run did not take it: never unsupervised
        if code == 0:
            # Done (or requeued): a stop signal from now on (a preemption as the tasks exit) must
            # not kill the task while Python shuts down -- it restores SIG_DFL for its own
            # handlers then -- and turn a COMPLETED job into FAILED.
            for name in dict.fromkeys(("USR2", "TERM", self.signal_name)):
                sig = getattr(signal, f"SIG{name}", None)
                if sig is not None:
                    signal.signal(sig, signal.SIG_IGN)
        if code != 0:
            # SystemExit passes through submitit's `except Exception`: the task (and so the
            # Slurm job) ends with train's exit code instead of a generic failure.
            raise SystemExit(code)
        return code


def command_first(command: tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """The spec's ``entrypoint.command`` when the task may start it before the spec is read
    again: nothing in it that only the allocation tells (``${NAME}``, a torchrun launch told
    the nodes); else ``()`` (the supervisor starts it)."""
    from train.spec import launches_torchrun

    if not command or any("$" in arg for arg in command):
        return ()
    if launches_torchrun(list(command)) is not None:
        return ()
    return tuple(command)


def after_step(argv: list[str] | None = None) -> int:
    """``python -m jobs.launch --after-step FOLDER ...``: what the batch script does after a
    step (:func:`train.stop.step.after_step` for this task's run); prints ``restart`` or
    ``exit N`` (jobs.executor.in_place_loop). ``--run-dir``: the task's run directory, as the
    script names it (its spec ``RUN_DIR/resolved.yaml`` read only where the decision needs it);
    without it (a script rendered before it), the task's pickle in ``FOLDER`` says which."""
    import argparse
    import contextlib
    import sys

    p = argparse.ArgumentParser(prog="python -m jobs.launch")
    p.add_argument("--after-step", type=Path, required=True, metavar="FOLDER")
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument("--exit-code", type=int, required=True)
    p.add_argument("--in-place", type=int, default=0)
    p.add_argument("--job-id", default="")
    p.add_argument("--task", default="", help="ARRAYJOB_INDEX of an array task")
    p.add_argument("--restart-count", type=int, default=0)
    ns = p.parse_args(argv)
    code: int | None = ns.exit_code
    try:
        from train.runfiles import RESOLVED

        if ns.run_dir is not None:
            run_dir, config = ns.run_dir, ns.run_dir / RESOLVED
        else:
            launch = _task_launch(ns.after_step / f"{ns.task or ns.job_id}_submitted.pkl")
            run_dir, config = Path(launch.run_dir), Path(launch.config)
        from train.stop import after_step as decide_after_step

        def requeue() -> RequeueConfig:
            from train.spec import load_run_config

            return load_run_config(config).requeue

        code = decide_after_step(
            run_dir,
            requeue,
            job_id=ns.job_id or None,
            restart_count=ns.restart_count,
            in_place=ns.in_place,
            exit_code=ns.exit_code,
        )
    except Exception as exc:  # the batch script must go on: it ends with the step's own code
        print(f"jobs.launch: cannot decide after the step ({type(exc).__name__}: {exc})",
              file=sys.stderr)  # fmt: skip
    with contextlib.suppress(OSError):  # the batch script may be gone (a requeue ends it)
        print("restart" if code is None else f"exit {code}", flush=True)
    return 0


def _task_launch(path: Path) -> Any:
    """This task's :class:`TrainLaunch`, from the pickle jobs submit wrote (ours: refused when
    it holds anything else)."""
    with open(path, "rb") as f:
        envelope = pickle.load(f)  # noqa: S301 -- written by jobs submit into the run dir
    launch = getattr(envelope, "function", None)
    from jobs import launch as module  # the class the pickle names (this may run as __main__)

    if not isinstance(launch, module.TrainLaunch):
        raise TypeError(f"{path} does not hold a jobs.launch.TrainLaunch")
    return launch


if __name__ == "__main__":
    raise SystemExit(after_step())
