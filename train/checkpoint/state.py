"""State helpers for checkpoints: model digests, ``module.`` prefixes, RNG states, CPU snapshots.

Everything stored in a checkpoint must load with ``torch.load(..., weights_only=True)``: tensors
and primitive containers only. Python's and numpy's RNG states are therefore converted to
tensors and tuples here, and :func:`make_weights_only_safe` rejects (with the key path) anything
that would make a checkpoint unloadable later, at save time rather than at resume time.
These names are re-exported by :mod:`train.checkpoint.manager`.
"""

from __future__ import annotations

import random
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optimizer

from train.checkpoint.digest import state_digest
from train.errors import CheckpointError

try:  # numpy is a dependency, but keep the RNG helpers usable without it
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]

__all__ = [
    "Snapshotter",
    "capture_rng_state",
    "load_model_state",
    "make_weights_only_safe",
    "model_digest",
    "model_state_dict",
    "restore_rng_state",
    "snapshot_to_cpu",
    "strip_module_prefix",
]

_PREFIX = "module."


def strip_module_prefix(state_dict: Mapping[str, Any]) -> OrderedDict[str, Any]:
    """Remove the ``module.`` prefix DataParallel/DDP put on every key (repeatedly, if nested).

    Only strips when *every* key has the prefix, so a model that really has a submodule named
    ``module`` keeps its keys.
    """
    out: OrderedDict[str, Any] = OrderedDict(state_dict)
    while out and all(k.startswith(_PREFIX) for k in out):
        out = OrderedDict((k[len(_PREFIX) :], v) for k, v in out.items())
    return out


def _unwrap(model: nn.Module) -> nn.Module:
    # DDP and DataParallel both keep the real model in `.module`; unwrap nested wrappers too.
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) and isinstance(
        getattr(model, "module", None), nn.Module
    ):
        model = model.module
    return model


def model_state_dict(model: nn.Module) -> OrderedDict[str, Any]:
    """The model's state dict without any ``module.`` prefix (the form checkpoints store)."""
    return strip_module_prefix(_unwrap(model).state_dict())


def load_model_state(model: nn.Module, state_dict: Mapping[str, Any], strict: bool = True) -> None:
    """Load a state dict saved with or without ``module.`` into a bare or wrapped model.

    The classic failure this avoids: a DataParallel/DDP checkpoint (``module.conv1.weight``)
    that does not load into the bare model (``conv1.weight``), and the reverse.
    """
    target = _unwrap(model)
    clean = strip_module_prefix(state_dict)
    try:
        target.load_state_dict(clean, strict=strict)
    except RuntimeError as exc:
        raise CheckpointError(
            f"checkpoint model state does not fit this model (different model or width?): {exc}"
        ) from exc


def model_digest(model: nn.Module | Mapping[str, Any]) -> str:
    """:func:`state_digest` of a model (bare or wrapped) or of a state dict (with or without
    ``module.``): the value recorded as ``digest`` in every checkpoint manifest."""
    if isinstance(model, nn.Module):
        return state_digest(model_state_dict(model))
    return state_digest(strip_module_prefix(model))


def capture_rng_state() -> dict[str, Any]:
    """RNG states of python ``random``, numpy's global generator, torch CPU and CUDA devices.

    Returned as tensors/tuples so ``torch.load(weights_only=True)`` reads them back.
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": (int(version), torch.tensor(internal, dtype=torch.int64), gauss),
        "torch": torch.get_rng_state(),
    }
    if np is not None:
        # legacy=True always gives the 5-tuple form
        kind, keys, pos, has_gauss, cached = cast(tuple[Any, ...], np.random.get_state(legacy=True))
        state["numpy"] = (
            str(kind),
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (missing parts are left alone)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((int(version), tuple(int(x) for x in internal.tolist()), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].to(torch.uint8))
    if "numpy" in state and np is not None:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:  # a different GPU count: restore what maps, the rest keep their seeds
            for i, s in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)


def snapshot_to_cpu(obj: Any, _memo: dict[int, Any] | None = None) -> Any:
    """Deep copy of a nested state with every tensor cloned to CPU memory.

    Used by asynchronous saves: after this returns, training may change its tensors while the
    copy is written in the background. Tensors shared between entries are cloned once.
    """
    memo = {} if _memo is None else _memo
    if isinstance(obj, torch.Tensor):
        key = id(obj)
        if key not in memo:
            t = obj.detach()
            memo[key] = t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
        return memo[key]
    if isinstance(obj, Mapping):
        items = [(k, snapshot_to_cpu(v, memo)) for k, v in obj.items()]
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if isinstance(obj, list):
        return [snapshot_to_cpu(v, memo) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(snapshot_to_cpu(v, memo) for v in obj)
    return obj


_PRIMITIVES = (str, int, float, bool, bytes, type(None), torch.Size, torch.dtype, torch.device)


def make_weights_only_safe(obj: Any, where: str = "state") -> Any:
    """Return ``obj`` with numpy values converted; raise naming the key path for anything that
    ``torch.load(weights_only=True)`` would refuse (which would make the checkpoint unloadable).
    """
    if isinstance(obj, (torch.Tensor, *_PRIMITIVES)):
        return obj
    if np is not None:
        if isinstance(obj, np.ndarray):
            return torch.from_numpy(obj.copy())
        if isinstance(obj, np.generic):
            return obj.item()
    if isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            if not isinstance(k, str | int | float | bool | type(None)):
                raise CheckpointError(
                    f"{where}: key {k!r} of type {type(k).__name__} cannot be "
                    "stored (use str or int keys)"
                )
            items.append((k, make_weights_only_safe(v, f"{where}[{k!r}]")))
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if isinstance(obj, list):
        return [make_weights_only_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(make_weights_only_safe(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise CheckpointError(
        f"{where}: a {type(obj).__name__} cannot be stored in a checkpoint (only tensors, numbers, "
        "strings and dict/list/tuple of them load with torch.load(weights_only=True)); "
        "convert it with .state_dict(), .tolist() or torch.tensor()"
    )


class Snapshotter:
    """Host copies of a nested state for asynchronous saves, taken without stopping training.

    :meth:`begin` is the only part of an asynchronous save on the training path:

    - CPU state (copy-on-write): nothing is copied there. The background thread copies every
      tensor (:meth:`finish`) while global module-forward and optimizer-step pre-hooks make
      the next forward pass (of any module) / ``optimizer.step()`` wait until the copy is done,
      so training changes nothing before it is copied. An in-place change made some other way
      (``p.add_()`` outside a step) is caught by the tensors' version counters: the save then
      fails with a CheckpointError, never a checkpoint mixing two steps. Call
      :meth:`wait_copied` before changing tensors directly.
    - CUDA state, or a model compiled in place (hooks would be traced): :meth:`begin` copies
      into pinned host buffers with non-blocking copies (the copy is only issued there) and
      the background thread waits for them.

    Buffers are reused from save to save (same shapes and dtypes: no allocation, no page
    faults); a set is reused only after the save that used it is written (one save in flight).
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._event: Any = None
        self._copied = threading.Event()
        self._copied.set()
        self._pending: tuple[Any, list[tuple[torch.Tensor, int]]] | None = None
        self._staged: Any = None
        self._hooks: list[Any] = []

    def _copy(self, t: torch.Tensor, index: int) -> torch.Tensor:
        t = t.detach()
        if t.layout != torch.strided:
            return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
        on_gpu = t.device.type == "cuda"
        buf = self._buffers[index] if index < len(self._buffers) else None
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=on_gpu)
            if index < len(self._buffers):
                self._buffers[index] = buf
            else:
                self._buffers.append(buf)
        buf.copy_(t, non_blocking=on_gpu)
        return buf

    def take(self, obj: Any) -> Any:
        """A copy of ``obj`` whose tensors live in this snapshotter's host buffers."""
        memo: dict[int, torch.Tensor] = {}
        count = 0
        on_gpu = False

        def walk(o: Any) -> Any:
            nonlocal count, on_gpu
            if isinstance(o, torch.Tensor):
                if id(o) not in memo:
                    on_gpu = on_gpu or o.device.type == "cuda"
                    memo[id(o)] = self._copy(o, count)
                    count += 1
                return memo[id(o)]
            if isinstance(o, Mapping):
                items = [(k, walk(v)) for k, v in o.items()]
                return OrderedDict(items) if isinstance(o, OrderedDict) else dict(items)
            if isinstance(o, list):
                return [walk(v) for v in o]
            if isinstance(o, tuple) and not hasattr(o, "_fields"):
                return tuple(walk(v) for v in o)
            return o

        out = walk(obj)
        del self._buffers[count:]
        self._event = None
        if on_gpu:
            self._event = torch.cuda.Event()
            self._event.record()
        return out

    # -- copy-on-write -----------------------------------------------------------------------
    def begin(self, obj: Any, model: nn.Module) -> None:
        """Start a snapshot of ``obj`` (on the training path); :meth:`finish` completes it."""
        tensors = _tensors(obj)
        deferrable = (
            all(t.device.type == "cpu" for t in tensors)
            and getattr(model, "_compiled_call_impl", None) is None
            and hasattr(_optimizer, "register_optimizer_step_pre_hook")
        )
        if not deferrable:
            self._pending, self._staged = None, self.take(obj)
            return
        self._guard()
        self._copied.clear()
        self._pending = (obj, [(t, t._version) for t in tensors])
        self._staged = None

    def finish(self) -> Any:
        """The snapshot (background thread): copy now if deferred, wait for device copies."""
        if self._pending is not None:
            obj, versions = self._pending
            self._pending = None
            try:
                self._staged = self.take(obj)
                changed = sum(t._version != v for t, v in versions)
            finally:
                self._copied.set()
            if changed:
                raise CheckpointError(
                    f"{changed} tensor(s) of the state changed in place before the asynchronous "
                    "save copied them (outside a forward pass or optimizer.step()); this "
                    "checkpoint is not written. Call wait_copied() before changing them."
                )
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        staged, self._staged = self._staged, None
        return staged

    def wait_copied(self) -> None:
        """Block until the state of the save in flight is copied (training may change it)."""
        self._copied.wait()

    def _guard(self) -> None:
        # Global hooks: wrappers (DDP, DataParallel, a pipeline of stages) may call the model's
        # submodules without the model's own forward; every module call waits instead.
        # The hooks hold this snapshotter weakly: a manager never closed is still freed (with
        # its buffers), leaving a hook that does nothing.
        if not self._hooks:
            ref = weakref.ref(self)

            def hold(*args: Any, **kwargs: Any) -> None:
                snap = ref()
                if snap is not None and not snap._copied.is_set():
                    snap._copied.wait()

            self._hooks.append(_module.register_module_forward_pre_hook(hold))
            self._hooks.append(_optimizer.register_optimizer_step_pre_hook(hold))

    def close(self) -> None:
        """Remove the hooks (the manager is done saving)."""
        self._copied.set()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def _tensors(obj: Any) -> list[torch.Tensor]:
    out: dict[int, torch.Tensor] = {}

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            out.setdefault(id(o), o)
        elif isinstance(o, Mapping):
            for v in o.values():
                walk(v)
        elif isinstance(o, list | tuple):
            for v in o:
                walk(v)

    walk(obj)
    return list(out.values())
