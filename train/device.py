"""Which device(s) this process trains on, and the collective backend that goes with them.

:func:`resolve_device` reads a :class:`train.env.DistEnv` and the strategy: nccl on the local
rank's GPU (or all visible GPUs for dp/pipeline), gloo on CPU when CUDA is missing and that is
allowed. torch is imported lazily, when a device is resolved.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from train.env import DUMMY_GPUS_ENV, DistEnv
from train.errors import DeviceError

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceInfo", "resolve_device"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceInfo:
    """The devices this process trains on and the matching collective backend."""

    device: torch.device
    devices: tuple[torch.device, ...]
    backend: str
    cuda: bool


def resolve_device(env: DistEnv, strategy: str, allow_cpu_fallback: bool) -> DeviceInfo:
    """Pick the device(s) and backend: nccl on CUDA, gloo on CPU.

    ddp/single: the local rank's GPU among the visible ones; dp/pipeline: all visible GPUs.
    Allocated GPUs without CUDA (dummy gres, CPU-only torch): one log line, then CPU when
    ``allow_cpu_fallback`` or on the local dev cluster (``env.dummy_gpus``), else
    :class:`DeviceError`.
    """
    import torch

    env.check_strategy(strategy)
    cuda = torch.cuda.is_available()
    allocated = env.gpus_on_node or (len(env.visible_devices) if env.visible_devices else 0)
    if not cuda:
        if allocated:
            msg = (
                f"{allocated} GPU(s) allocated on this node but CUDA is not available "
                f"(torch {torch.__version__}, cuda={torch.version.cuda})"
            )
            if not (allow_cpu_fallback or env.dummy_gpus):
                raise DeviceError(
                    f"{msg}: set train.allow_cpu_fallback: true to train on CPU, or run where "
                    "CUDA works"
                )
            if env.is_main and env.dummy_gpus:
                log.info("%s: training on CPU (dev cluster: %s=1, its GPUs are dummies)",
                         msg, DUMMY_GPUS_ENV)  # fmt: skip
            elif env.is_main:
                log.warning("%s: falling back to CPU (train.allow_cpu_fallback)", msg)
        cpu = torch.device("cpu")
        return DeviceInfo(cpu, (cpu,), "gloo", False)
    count = torch.cuda.device_count()
    if strategy in ("dp", "pipeline"):
        devices = tuple(torch.device("cuda", i) for i in range(count))
        return DeviceInfo(devices[0], devices, "nccl", True)
    # One visible GPU per task (--gpus-per-task / gpu-bind): it is cuda:0; otherwise the local rank.
    index = 0 if count == 1 else env.local_rank
    if index >= count:
        raise DeviceError(
            f"local rank {env.local_rank} has no GPU: only {count} visible; set "
            f"--ntasks-per-node={count} or --gpus-per-node={env.local_world_size}"
        )
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    return DeviceInfo(dev, (dev,), "nccl", True)
