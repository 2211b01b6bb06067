"""Run the user's own code with train's environment handling (the spec's ``entrypoint``).

``entrypoint: {function: "pkg.mod:fn"}``: ``fn(ctx: TrainContext)`` is called in this process
after the environment, device, process group, checkpoint manager and preemption guard are set
up; it returns an exit code (None = 0); an exception it raises is a failure, recorded and requeued
within ``requeue.max_failures`` like one of the built-in trainer. See
``examples/custom_train.py``::

    def main(ctx: TrainContext) -> int:
        model = ...to(ctx.device); state = ctx.load_resume()       # None on a fresh start
        for step in range(start, total):
            ...
            if ctx.should_stop():                                  # every rank, every step
                ctx.checkpoints.save(step, shared, rank, epoch=0, epoch_step=step, model=model)
                return ctx.requeue(step)                           # wait + barrier + requeue
        return 0

A checkpoint written at another world size (a run requeued on fewer nodes, or resumed with
another shape) is the function's to reshard: ``ctx.checkpoint_world_size`` says the size it was
written at (``examples/reshard_train.py`` reshards with ``torch.distributed.checkpoint``).

``entrypoint: {command: [argv...]}``: the command runs as a child process supervised by
:mod:`train.command.supervisor` (the torchrun variables, RUN_DIR, TRAIN_RESTART_COUNT,
TRAIN_RESUME_FROM and TRAIN_CHECKPOINT_WORLD_SIZE (the world size it was written at)
exported; the stop signal it listens for sent once; requeued after a preemption or time limit;
a non-zero exit without a stop is a failure with its exit code and stderr tail).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.env import DistEnv
from train.errors import EntrypointError
from train.report import last_reported_step
from train.session import RunSession
from train.spec import RunConfig
from train.stop import PreemptionGuard

if TYPE_CHECKING:  # torch is imported by the session when it sets torch up, never for a command
    import torch

    from train.checkpoint import CheckpointManager, LoadedCheckpoint
    from train.device import DeviceInfo
    from train.runtime import Runtime
    from train.tracking import Tracker

__all__ = ["TrainContext", "load_function", "run_entrypoint"]

log = logging.getLogger(__name__)


@dataclass
class TrainContext:
    """Everything user code needs to train like the built-in trainer does."""

    env: DistEnv
    devices: DeviceInfo
    run_dir: Path
    checkpoints: CheckpointManager
    guard: PreemptionGuard
    config: RunConfig
    runtime: Runtime
    resume_from: Path | None
    session: RunSession | None = None
    _tracker: Tracker | None = field(default=None, repr=False)

    @property
    def tracker(self) -> Tracker:
        """TensorBoard scalars in ``RUN_DIR/tensorboard`` on rank 0, as the built-in trainer
        writes them: ``tracker.scalars(step, {"loss": ...})`` (or ``tracker.writer``, the
        ``SummaryWriter``). Steps at or before the checkpoint resumed from are not written
        again, and what a killed attempt wrote after it is dropped. Call ``tracker.flush()``
        before each checkpoint; it is closed when the function returns."""
        if self._tracker is None:
            from train.tracking import Tracker, wandb_options

            step = None
            if self.resume_from is not None:
                from train.checkpoint import checkpoint_step

                step = checkpoint_step(self.resume_from)
            self._tracker = Tracker(
                self.run_dir,
                is_main=self.is_main,
                resumed_step=step,
                restart_count=self.env.restart_count,
                wandb=wandb_options(self.config.train),
            )
        return self._tracker

    @property
    def device(self) -> torch.device:
        """This rank's device (``cuda:LOCAL_RANK`` or ``cpu``)."""
        return self.devices.device

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one that logs and writes shared files."""
        return self.env.is_main

    @property
    def checkpoint_world_size(self) -> int | None:
        """The world size the checkpoint to resume from was written at (None on a fresh start):
        when it differs from ``env.world_size`` per-rank state must be resharded."""
        if self.session is not None:
            return self.session.checkpoint_world_size
        if self.resume_from is None:
            return None
        from train.checkpoint import read_manifest

        return int(read_manifest(self.resume_from)["world_size"])

    def load_resume(self) -> LoadedCheckpoint | None:
        """The checkpoint to resume from (``--resume``, or a Slurm restart), or None."""
        if self.resume_from is None:
            return None
        return self.checkpoints.load(self.resume_from)

    def should_stop(self) -> bool:
        """Call at every step boundary on every rank: True when any rank got a stop signal."""
        return self.guard.should_stop(self.runtime.all_reduce_max)

    def progress(self, step: int) -> None:
        """Say that step ``step`` completed on this rank (what a hang watchdog watches)."""
        if self.session is not None:
            self.session.progress(step)

    def busy(self, what: str) -> contextlib.AbstractContextManager[None]:
        """``with ctx.busy("eval"): ...``: work that is not a step and may last much longer
        than one (an evaluation, a save of your own): the hang watchdog allows it
        ``max(timeout, 30 min)`` instead of the step timeout. ``ctx.checkpoints.save`` reports
        each phase of a save by itself."""
        if self.session is None:
            return contextlib.nullcontext()
        return self.session.busy(what)

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        """``with ctx.waiting(): dist.all_reduce(...)``: waiting for the other ranks (a
        collective, a barrier) is not work of this rank: the hang watchdog allows the step
        timeout there, even inside ``ctx.busy(...)``, so a peer that froze is a hang in time."""
        if self.session is None:
            return contextlib.nullcontext()
        return self.session.waiting()

    def requeue(self, step: int) -> int:
        """After saving: wait for the save, meet at a barrier, requeue; returns the exit code."""
        if self.session is not None:
            return self.session.stop(step)
        from train.stop import request_requeue

        self.checkpoints.wait()
        self.runtime.barrier()
        return request_requeue(self.env, self.run_dir, self.config.requeue, "signal", step=step)

    def barrier(self) -> None:
        """All ranks meet (waiting for the others: :meth:`waiting`)."""
        with self.waiting():
            self.runtime.barrier()


def load_function(spec: str) -> Callable[[TrainContext], Any]:
    """Import ``"pkg.module:function"``; :class:`EntrypointError` with the reason otherwise."""
    module_name, _, attr = spec.partition(":")
    # Like `python -m`, the working directory is importable (examples/, the user's project).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntrypointError(
            f"entrypoint.function {spec!r}: cannot import {module_name!r} ({exc}); run from the "
            "directory that contains it or add it to PYTHONPATH"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EntrypointError(f"entrypoint.function {spec!r}: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EntrypointError(f"entrypoint.function {spec!r} is not callable")
    return obj


def run_entrypoint(
    config: RunConfig,
    env: DistEnv,
    run_dir: Path,
    resume: bool | str | Path | None = None,
    *,
    allow_config_change: bool = False,
) -> int:
    """Run ``config.entrypoint`` in a :class:`RunSession`; return the exit code."""
    entry = config.entrypoint
    if entry is None:
        raise EntrypointError("the spec has no entrypoint section")
    fn = load_function(entry.function) if entry.function is not None else None
    # A command: this guard only holds the job's signal and TERM while the run is set up;
    # train.command.supervisor then supervises the child (which signal it gets, requeue, failures).
    guard = PreemptionGuard((config.requeue.signal, "TERM")) if entry.command is not None else None
    first = False
    if entry.command is not None:
        from train.command import started_first

        first = started_first()  # the command started before us: its resume is decided
    session = RunSession(
        config.train,
        config.requeue,
        env,
        run_dir,
        resume=resume,
        guard=guard,
        allow_config_change=allow_config_change,
        process_group=entry.command is None,
        prestarted=first,
    )
    with session:
        progress: dict[str, Any] = {}
        if env.is_main and env.resumed and session.resume_from is None:
            # a restart with no checkpoint of ours: the command's own progress (train.report)
            # is what the no-progress stop compares (train.history.budget_counts)
            reported = last_reported_step(session.run_dir)
            if reported is not None:
                progress["reported_step"] = reported
        session.started(None, entrypoint=entry.function or entry.command, **progress)
        if entry.command is not None:
            from train.command import run_command as supervise_command

            return supervise_command(
                config,
                env,
                session.run_dir,
                session.resume_from,
                early=session.guard,
                checkpoint_world_size=session.checkpoint_world_size,
            )
        assert fn is not None  # EntrypointConfig guarantees exactly one
        ctx = TrainContext(
            env,
            session.devices,
            session.run_dir,
            session.ckpt,
            session.guard,
            config,
            session.rt,
            session.resume_from,
            session,
        )
        try:
            code = fn(ctx)
        except Exception as exc:
            # As in the built-in trainer: recorded (by the first failing rank) and requeued
            # while requeue.max_failures allows; the requeued run resumes from a checkpoint.
            return session.fail(exc, f"{entry.function} failed")
        finally:
            if ctx._tracker is not None:
                ctx._tracker.close()
        if code in (None, 0) and not session.guard.requested:
            session.complete(None)
        return int(code or 0)
