"""How one model is spread over devices and processes: ddp, dp, pipeline, single.

Every strategy keeps the *bare* model (``Strategy.model``: same parameter objects, no ``module.``
prefix) for the optimizer and checkpoints, so a checkpoint written under one strategy loads under
any other, and exposes the module to call (``Strategy.module``) plus ``no_sync`` for gradient
accumulation.

- ``ddp``: DistributedDataParallel, one process per device; optional SyncBatchNorm (CUDA) or
  :class:`GlobalBatchNorm` (the same maths over gloo, so CPU runs can use it too).
- ``dp``: ``nn.DataParallel`` in one process over all local GPUs (on CPU it calls the model).
- ``pipeline``: the model cut into stages over the local devices, each batch split into
  micro-batches issued in wavefront order so CUDA stages overlap; activations move between devices.
  On CPU the stages all live on the CPU (two of them), which exercises the same code path.
- ``single``: the model on one device.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from train.device import DeviceInfo
from train.env import DistEnv
from train.loop.models import split_stages
from train.loop.nocompile import compiler_imported, disable_on_demand

__all__ = [
    "GlobalBatchNorm",
    "Pipeline",
    "Strategy",
    "build_strategy",
    "convert_global_batchnorm",
    "eager_ddp",
]


class _AllReduceSum(torch.autograd.Function):
    """A differentiable sum over ranks: its backward sums the gradients over ranks as well.

    The maths of ``torch.distributed.nn.functional.all_reduce``, which torch >= 2.13 deprecates
    (a FutureWarning on every call) in favour of a private module; this works on every torch.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _AllReduceSum.apply(grad)
        return out


class GlobalBatchNorm(nn.BatchNorm2d):
    """BatchNorm with statistics over the whole (all-rank) batch, on any device/backend.

    torch's SyncBatchNorm refuses CPU tensors; this computes per-channel sum, sum of squares and
    count locally, all-reduces them with a differentiable sum (:class:`_AllReduceSum`: its
    backward all-reduces the gradients, which is what the global statistics need) and
    normalises with the global mean and biased variance, as BatchNorm does in training.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        if dist.get_world_size() == 1:
            return super().forward(x)
        c = x.shape[1]
        count = torch.full((1,), x.numel() / c, dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum(dim=(0, 2, 3)), (x * x).sum(dim=(0, 2, 3)), count])
        stats = _AllReduceSum.apply(stats)
        n = stats[-1]
        mean = stats[:c] / n
        var = (stats[c : 2 * c] / n - mean * mean).clamp_min(0.0)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                assert self.running_var is not None and self.num_batches_tracked is not None
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None else 0.1
                self.running_mean.lerp_(mean.detach(), m)
                self.running_var.lerp_(var.detach() * n / (n - 1).clamp_min(1.0), m)
        y = (x - mean[None, :, None, None]) * torch.rsqrt(var + self.eps)[None, :, None, None]
        if self.affine:
            y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        return y


def convert_global_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every ``BatchNorm2d`` by :class:`GlobalBatchNorm`, keeping parameters/buffers."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, GlobalBatchNorm):
            new = GlobalBatchNorm(
                child.num_features,
                child.eps,
                child.momentum,
                child.affine,
                child.track_running_stats,
            )
            new.load_state_dict(child.state_dict())
            new.to(next(iter(child.buffers()), torch.empty(0)).device)
            setattr(module, name, new)
        else:
            convert_global_batchnorm(child)
    return module


class Pipeline(nn.Module):
    """Stages on devices; a batch is split in ``chunks`` micro-batches (GPipe-style schedule)."""

    def __init__(
        self, stages: Sequence[nn.Module], devices: Sequence[torch.device], chunks: int
    ) -> None:
        super().__init__()
        if len(stages) != len(devices):
            raise ValueError(f"{len(stages)} stages but {len(devices)} devices")
        self.stages = nn.ModuleList(
            stage.to(dev) for stage, dev in zip(stages, devices, strict=True)
        )
        self.devices = list(devices)
        self.chunks = chunks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts = list(x.tensor_split(min(self.chunks, x.shape[0])))
        n_stages = len(self.stages)
        # Clock t runs stage s on micro-batch t - s: on CUDA the launches are asynchronous, so
        # stage s works on micro-batch c while stage s+1 works on c-1.
        for clock in range(len(acts) + n_stages - 1):
            for s in range(n_stages - 1, -1, -1):
                c = clock - s
                if 0 <= c < len(acts):
                    acts[c] = self.stages[s](acts[c].to(self.devices[s], non_blocking=True))
        return torch.cat(acts)


class Strategy:
    """A model placed on devices: call ``module``, optimise ``model``'s parameters."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        module: nn.Module,
        input_device: torch.device,
        output_device: torch.device,
    ) -> None:
        self.name = name
        self.model = model
        self.module = module
        self.input_device = input_device
        self.output_device = output_device

    @contextlib.contextmanager
    def no_sync(self, skip: bool) -> Iterator[None]:
        """Within it, DDP does not all-reduce gradients (non-final accumulation micro-steps)."""
        if skip and isinstance(self.module, nn.parallel.DistributedDataParallel):
            with self.module.no_sync():
                yield
        else:
            yield

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(x)
        return out

    @property
    def eval_module(self) -> nn.Module:
        """What evaluation calls: DDP's bare model (no collectives, ranks may run different
        numbers of eval batches); the wrapper otherwise (dp gathers, pipeline spans devices)."""
        if isinstance(self.module, nn.parallel.DistributedDataParallel):
            return self.model
        return self.module

    def train(self, mode: bool = True) -> None:
        """Switch the (shared) modules to training or evaluation mode."""
        self.module.train(mode)

    def release(self) -> None:
        """Drop a DDP wrapper (``model`` stays): call it before the process group is destroyed.
        DDP's reducer then lets go of the group, whose last reference is torch's own, released
        without the GIL. Released by the reducer last, the group is destroyed with the GIL held
        while a gloo worker thread may wait for it: a rank stuck at its exit (torch 2.13,
        README: End a DDP script)."""
        if isinstance(self.module, nn.parallel.DistributedDataParallel):
            self.module = self.model

    def describe(self) -> dict[str, Any]:
        """A short description for the log / metrics header."""
        return {
            "strategy": self.name,
            "input_device": str(self.input_device),
            "output_device": str(self.output_device),
            "wrapper": type(self.module).__name__,
        }


@functools.cache
def _no_buffer_sync() -> dict[str, Any]:
    """DDP's keyword for "do not broadcast buffers before every forward", on every torch.

    With global batch statistics every rank's BatchNorm buffers are already equal, so rank 0's
    copy need not be broadcast each step. torch >= 2.13 calls that ``forward_sync_buffers=False``
    (and warns on ``broadcast_buffers``); it still syncs once at construction, which changes
    nothing here (every rank starts from the same seed or checkpoint). Older torch only has
    ``broadcast_buffers=False``.
    """
    params = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in params:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


_DDP_MODE_WITHOUT_DYNAMO = "ddp_optimizer"  # torch._dynamo.config.optimize_ddp's default (True)


def eager_ddp(model: nn.Module, **kwargs: Any) -> nn.parallel.DistributedDataParallel:
    """``DistributedDataParallel(model, **kwargs)`` without importing ``torch._dynamo``.

    torch's DDP imports the compiler twice over for a run that never compiles: its constructor
    reads ``torch._dynamo.utils.get_optimize_ddp_mode()`` (the compiler's config, whose default
    picks the C++ reducer), and its forward enters a context wrapped by ``torch._disable_dynamo``,
    which imports it on the first call. That import costs about as much CPU as ``import torch``
    itself, in every rank of every start and restart (``bench``: requeued start -> first step).
    While ``torch._dynamo`` has never been imported nobody can have changed that config, so the
    answer is its default: the constructor is given it by a stand-in module that leaves
    ``sys.modules`` at the moment it answers (before any collective), and the forward's context
    gets its answer up front (:func:`train.loop.nocompile.disable_on_demand`). With
    ``torch._dynamo`` already imported (a compiled model, a user's import), or on a torch whose
    DDP reads something else of the compiler, this is torch's plain constructor: every rank
    takes the same path, so their collectives match.
    """
    ddp = nn.parallel.DistributedDataParallel
    inside = getattr(ddp, "_inside_ddp_forward", None)
    if compiler_imported() or inside is None:
        return ddp(model, **kwargs)
    stub = types.ModuleType("torch._dynamo")

    def optimize_ddp_mode() -> str:
        if sys.modules.get("torch._dynamo") is stub:
            del sys.modules["torch._dynamo"]
        return _DDP_MODE_WITHOUT_DYNAMO

    stub.utils = types.SimpleNamespace(get_optimize_ddp_mode=optimize_ddp_mode)  # type: ignore[attr-defined]
    sys.modules["torch._dynamo"] = stub
    try:
        wrapped = ddp(model, **kwargs)
    except AttributeError:
        if sys.modules.get("torch._dynamo") is not stub:
            raise
        # torch asked the stand-in something else, first thing: before any collective
        del sys.modules["torch._dynamo"]
        return ddp(model, **kwargs)
    finally:
        if sys.modules.get("torch._dynamo") is stub:
            del sys.modules["torch._dynamo"]
    disable_on_demand(inspect.unwrap(inside), recursive=False)
    return wrapped


def build_strategy(
    name: str,
    model: nn.Module,
    devices: DeviceInfo,
    env: DistEnv,
    *,
    sync_batchnorm: bool = False,
    pipeline_chunks: int = 4,
    pipeline_stages: int | None = None,
) -> Strategy:
    """Place ``model`` for strategy ``name`` (ddp/dp/pipeline/single) on ``devices``."""
    dev = devices.device
    if name in ("single", "ddp"):
        if name == "ddp" and sync_batchnorm and env.world_size > 1:
            if devices.cuda:
                model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            else:
                model = convert_global_batchnorm(model)
        model.to(dev)
        if name == "ddp" and env.world_size > 1:
            wrapped: nn.Module = eager_ddp(
                model,
                device_ids=[dev] if devices.cuda else None,
                **_no_buffer_sync() if sync_batchnorm else {},
            )
            return Strategy(name, model, wrapped, dev, dev)
        return Strategy(name, model, model, dev, dev)
    if name == "dp":
        model.to(dev)
        dp_ids: list[int | torch.device] | None = list(devices.devices) if devices.cuda else None
        return Strategy(name, model, nn.DataParallel(model, device_ids=dp_ids), dev, dev)
    if name == "pipeline":
        if not isinstance(model, nn.Sequential):
            raise TypeError("the pipeline strategy needs an nn.Sequential model")
        if devices.cuda:
            n = pipeline_stages or len(devices.devices)
            stage_devices = [devices.devices[i % len(devices.devices)] for i in range(n)]
        else:
            n = pipeline_stages or 2
            stage_devices = [dev] * n
        stages = split_stages(model, n)
        stage_devices = stage_devices[: len(stages)]
        pipe = Pipeline(stages, stage_devices, pipeline_chunks)
        return Strategy(name, model, pipe, stage_devices[0], stage_devices[-1])
    raise ValueError(f"unknown strategy {name!r}: use ddp, dp, pipeline or single")
