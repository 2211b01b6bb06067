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

``entrypoint: {command: [argv...]}``: the command runs as a child process with RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RUN_DIR and (when resuming)
TRAIN_RESUME_FROM exported; stop signals are forwarded to it; its exit code is returned.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from train.checkpoint import CheckpointManager, LoadedCheckpoint
from train.config import RunConfig
from train.env import DeviceInfo, DistEnv, resolve_device
from train.errors import EntrypointError
from train.preempt import (
    PreemptionGuard,
    RunHistory,
    describe_failure,
    pop_early_signals,
    request_requeue,
)
from train.runtime import Runtime, configure_torch, setup_runtime

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

    @property
    def device(self) -> torch.device:
        """This rank's device (``cuda:LOCAL_RANK`` or ``cpu``)."""
        return self.devices.device

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one that logs and writes shared files."""
        return self.env.is_main

    def load_resume(self) -> LoadedCheckpoint | None:
        """The checkpoint to resume from (``--resume``, or a Slurm restart), or None."""
        if self.resume_from is None:
            return None
        return self.checkpoints.load(self.resume_from)

    def should_stop(self) -> bool:
        """Call at every step boundary on every rank: True when any rank got a stop signal."""
        return self.guard.should_stop(self.runtime.all_reduce_max)

    def requeue(self, step: int) -> int:
        """After saving: wait for the save, meet at a barrier, requeue; returns the exit code."""
        self.checkpoints.wait()
        self.runtime.barrier()
        return request_requeue(
            self.env, self.run_dir, self.config.requeue, self.guard.reason, step=step
        )

    def barrier(self) -> None:
        """All ranks meet."""
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


def _run_command(argv: list[str], env: DistEnv, run_dir: Path, resume_from: Path | None) -> int:
    child_env = dict(os.environ)
    env.export(child_env)
    child_env["RUN_DIR"] = str(run_dir)
    if resume_from is not None:
        child_env["TRAIN_RESUME_FROM"] = str(resume_from)
    try:
        # No timeout: the command is the training run; Slurm's time limit bounds it.
        proc = subprocess.Popen(argv, env=child_env)
    except OSError as exc:
        raise EntrypointError(f"entrypoint.command {argv[0]!r}: {exc.strerror or exc}") from exc

    def forward(signum: int, frame: FrameType | None) -> None:
        proc.send_signal(signum)

    previous = {
        s: signal.signal(s, forward) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
    }
    # A stop signal that arrived while we were starting (held by install_early) goes on too.
    for signum in pop_early_signals():
        proc.send_signal(signum)
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def run_entrypoint(
    config: RunConfig, env: DistEnv, run_dir: Path, resume: bool | str | Path | None = None
) -> int:
    """Run ``config.entrypoint`` with train's environment handling; return the exit code."""
    entry = config.entrypoint
    if entry is None:
        raise EntrypointError("the spec has no entrypoint section")
    train = config.train
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = CheckpointManager.for_run(run_dir, train, rank=env.rank, world_size=env.world_size)
    want = resume if resume is not None else (True if env.restart_count > 0 else None)
    resume_from: Path | None = None
    if want is True:
        resume_from = ckpt.latest_valid()
    elif want not in (None, False):
        resume_from = Path(str(want))
    history = RunHistory(run_dir) if env.is_main else None
    if history is not None:
        history.append(
            "resume" if resume_from else "start",
            step=None,
            restart_count=env.restart_count,
            job_id=env.job_id,
            entrypoint=entry.function or entry.command,
        )
    if entry.command is not None:
        return _run_command(entry.command, env, run_dir, resume_from)
    assert entry.function is not None  # EntrypointConfig guarantees exactly one
    fn = load_function(entry.function)
    configure_torch(train, env)
    devices = resolve_device(env, train.strategy, train.allow_cpu_fallback)
    guard = PreemptionGuard(
        (config.requeue.signal, "TERM"),
        job_id=env.job_id,
        signal_delay_s=config.requeue.signal_delay_s,
        is_main=env.is_main,
    ).install()
    rt = setup_runtime(env, devices)
    try:
        ctx = TrainContext(env, devices, run_dir, ckpt, guard, config, rt, resume_from)
        try:
            code = fn(ctx)
        except Exception as exc:
            # As in the built-in trainer: recorded (by the first failing rank) and requeued
            # while requeue.max_failures allows; the requeued run resumes from a checkpoint.
            what = describe_failure(exc, f"{entry.function} failed")
            return request_requeue(env, run_dir, config.requeue, "failure", error=what)
        if history is not None and code in (None, 0) and not guard.requested:
            history.append(
                "complete", step=None, restart_count=env.restart_count, job_id=env.job_id
            )
        return int(code or 0)
    finally:
        ckpt.close()
        guard.uninstall()
        rt.close()
