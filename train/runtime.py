"""Process-wide setup for a training process: torch threads/determinism and the process group.

:func:`setup_runtime` creates the process group when the world has more than one process
(checking first that the derived MASTER_PORT is free) and returns a :class:`Runtime` with the
few collectives the trainer and user code need: ``all_reduce_max`` for the stop flag (over a
gloo group, so it never waits on a CUDA stream), ``barrier`` and ``broadcast_object``.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.abc
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from train.device import DeviceInfo
from train.env import DistEnv, verify_master_port
from train.spec import TrainConfig

__all__ = [
    "Runtime",
    "StopPoll",
    "configure_torch",
    "precision_context",
    "setup_runtime",
]

log = logging.getLogger(__name__)


def configure_torch(config: TrainConfig, env: DistEnv) -> None:
    """Threads (``num_threads``, else SLURM_CPUS_PER_TASK) and deterministic algorithms."""
    threads = config.num_threads or env.cpus_per_task
    if threads:
        torch.set_num_threads(threads)
    if config.deterministic:
        # cuBLAS needs this for deterministic matmuls; harmless on CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        deterministic_algorithms(compiles=config.compile)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


_INDUCTOR_CONFIG = "torch._inductor.config"


def deterministic_algorithms(*, compiles: bool) -> None:
    """``torch.use_deterministic_algorithms(True)`` without its import of the compiler.

    The public call imports ``torch._inductor.config`` to set its ``deterministic`` flag: as long
    as ``import torch`` itself (1.7-2.4 s on these machines) at every start of every rank, for a
    run that never compiles. Here torch's own flag is set directly; the compiler's flag is set
    now when the run compiles (``train.compile``) or the compiler is already imported, else the
    moment anything (a user's function calling ``torch.compile``) imports its config.
    """
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if compiles or _INDUCTOR_CONFIG in sys.modules or set_flag is None:
        # (a torch without that private setter: the public call, import and all)
        torch.use_deterministic_algorithms(True)
        return
    set_flag(True, warn_only=False)
    if not any(isinstance(f, _DeterministicInductor) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeterministicInductor())


class _DeterministicInductor(importlib.abc.MetaPathFinder):
    """Sets ``torch._inductor.config.deterministic`` once that module is imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _INDUCTOR_CONFIG:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, run = spec.loader, spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            module.deterministic = torch.are_deterministic_algorithms_enabled()  # type: ignore[attr-defined]

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class Runtime:
    """The process group (if any) and the collectives used at step boundaries."""

    def __init__(self, env: DistEnv, owns_group: bool, ctrl_group: Any = None) -> None:
        self.env = env
        self.owns_group = owns_group
        self.ctrl_group = ctrl_group
        self._flag = torch.zeros(1, dtype=torch.int32)
        # Two buffers for the lagged stop flag: one in flight, one read.
        self._lagged = [torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)]
        self._lag_index = 0
        self._pending: Any = None

    @property
    def distributed(self) -> bool:
        """Whether collectives go over a process group."""
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _drain(self) -> None:
        """Finish the in-flight lagged reduce before any other collective on the group."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None

    def lagged_max(self, value: int) -> int:
        """MAX over ranks of the value each rank passed at its PREVIOUS call.

        The reduce of this call's value runs in the background while training goes on, so a
        stop check costs no round trip. Every rank calls it at the same steps (:class:`StopPoll`),
        so every rank sees the same answer at the same step: the ranks still agree, one check
        after the signal. The first call (and the first after another collective drained the
        one in flight) returns 0; a rank's flag stays set, so it is sent again.
        """
        if not self.distributed:
            return value
        in_flight = self._pending is not None
        self._drain()
        previous = int(self._lagged[self._lag_index].item()) if in_flight else 0
        self._lag_index ^= 1
        buf = self._lagged[self._lag_index]
        buf.fill_(value)
        self._pending = dist.all_reduce(
            buf, op=dist.ReduceOp.MAX, group=self.ctrl_group, async_op=True
        )
        return previous

    def all_reduce_max(self, value: int) -> int:
        """MAX of an int over ranks (CPU tensor, reused: no per-step allocation)."""
        if not self.distributed:
            return value
        self._drain()
        self._flag.fill_(value)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.ctrl_group)
        return int(self._flag.item())

    def barrier(self) -> None:
        """All ranks meet (over the CPU group)."""
        if self.distributed:
            self._drain()
            dist.barrier(group=self.ctrl_group)

    def broadcast_object(self, objects: list[Any]) -> None:
        """Rank 0's picklable objects to every rank, in place."""
        if self.distributed:
            self._drain()
            dist.broadcast_object_list(objects, src=0, group=self.ctrl_group)

    def close(self) -> None:
        """Destroy the process group if this runtime created it."""
        if self.owns_group and dist.is_initialized():
            self._drain()
            dist.destroy_process_group()


class StopPoll:
    """At which steps the ranks check for a stop signal (:meth:`Runtime.lagged_max`).

    Every step at first; once ``calibrate_steps`` steps have been timed (from ``start + skip``,
    past the first-touch costs), every ``k`` steps, ``k`` the number of steps in ``interval_s``
    by the slowest rank's clock, agreed once over ranks (MIN), so every rank checks at the same
    steps. A stop then follows the signal within about ``2 * interval_s``: the flag rides the
    next check's reduce, which is read at the check after (the lag keeps each check from being
    a blocking round trip). One process, or ``interval_s == 0``: every step.
    """

    def __init__(
        self,
        rt: Runtime,
        interval_s: float,
        start: int,
        *,
        skip: int = 5,
        calibrate_steps: int = 5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.rt, self.interval_s, self.clock = rt, interval_s, clock
        self.every = 1
        self._next = start
        adaptive = interval_s > 0 and rt.distributed
        self._mark_at = start + skip if adaptive else None
        self._calibrate_at = start + skip + calibrate_steps if adaptive else None
        self._mark = 0.0

    def due(self, step: int) -> bool:
        """Call after every step with the number of completed steps; True: check now."""
        if self._calibrate_at is not None:
            if step == self._mark_at:
                self._mark = self.clock()
            elif step == self._calibrate_at:
                assert self._mark_at is not None
                per_step = (self.clock() - self._mark) / (step - self._mark_at)
                mine = max(1, min(10_000, int(self.interval_s / max(per_step, 1e-9))))
                self.every = -self.rt.all_reduce_max(-mine)  # MIN over ranks
                self._calibrate_at = None
                log.debug("checking for stop signals every %d step(s)", self.every)
        if step >= self._next:
            self._next = step + self.every
            return True
        return False


def setup_runtime(env: DistEnv, devices: DeviceInfo, timeout_s: float = 1800.0) -> Runtime:
    """Create the process group for ``env`` (exporting the torchrun variables) if needed."""
    if not env.distributed:
        return Runtime(env, owns_group=False)
    if dist.is_initialized():
        return Runtime(env, owns_group=False, ctrl_group=_ctrl_group())
    verify_master_port(env)
    env.export(os.environ)
    kwargs: dict[str, Any] = {}
    if devices.cuda:
        kwargs["device_id"] = devices.device
    log.info(
        "joining process group: rank %d/%d via %s:%d (%s)",
        env.rank,
        env.world_size,
        env.master_addr,
        env.master_port,
        devices.backend,
    )
    dist.init_process_group(
        devices.backend,
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )
    return Runtime(env, owns_group=True, ctrl_group=_ctrl_group())


def _ctrl_group() -> Any:
    """The control plane's own gloo group (stop flag, barriers, broadcasts), for every backend.

    NCCL cannot reduce CPU tensors (and would sync the stream); and on gloo a separate group keeps
    the stop flag's in-flight reduce (Runtime.lagged_max) off the group that carries DDP's
    gradient reduces, so the two never interleave on one process group.
    """
    return dist.new_group(backend="gloo")


def precision_context(
    config: TrainConfig, devices: DeviceInfo
) -> tuple[Callable[[], contextlib.AbstractContextManager[Any]], torch.amp.GradScaler | None]:
    """Autocast factory and optional GradScaler for ``config.precision`` on this device."""
    if config.precision == "fp32":
        return contextlib.nullcontext, None
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float16
    if not devices.cuda and dtype == torch.float16:
        log.warning("precision fp16 needs CUDA; training in fp32 on %s", devices.device)
        return contextlib.nullcontext, None
    kind = devices.device.type
    scaler = torch.amp.GradScaler(kind) if dtype == torch.float16 else None
    return (lambda: torch.autocast(kind, dtype=dtype)), scaler
