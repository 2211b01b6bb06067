"""torch's compiler (``torch._dynamo``) left unimported in a run that never compiles.

Parts of torch that must step aside under ``torch.compile`` (an optimizer's methods, DDP's
forward) are wrapped by ``torch._disable_dynamo``, which imports the compiler on their first call
to build ``torch._dynamo.disable(fn)``: about as much CPU again as ``import torch``, in every rank
of every start and restart, for a wrapper that outside ``torch.compile`` just calls ``fn``.
:func:`disable_on_demand` gives such a wrapper its answer up front. Used by
:func:`train.loop.optim.eager` and :func:`train.loop.strategies.eager_ddp`.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["compiler_imported", "disable_on_demand"]

_COMPILER = "torch._dynamo"


def compiler_imported() -> bool:
    """Whether anything in this process has imported torch's compiler."""
    return _COMPILER in sys.modules


def disable_on_demand(fn: Any, *, recursive: bool) -> None:
    """Give ``fn`` (the function inside a ``torch._disable_dynamo(fn, recursive)`` wrapper) its
    cached answer up front: ``fn`` itself while the compiler has never been imported (nothing
    can be compiling), and from the first call after it has been, torch's own answer, built and
    cached then. A wrapper that already has its answer is left alone."""
    if getattr(fn, "__dynamo_disable", None) is not None:
        return

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if compiler_imported():
            compiler = sys.modules[_COMPILER]
            real = compiler.disable(fn, recursive=recursive, wrapping=False)
            setattr(fn, "__dynamo_disable", real)
            return real(*args, **kwargs)
        return fn(*args, **kwargs)

    setattr(fn, "__dynamo_disable", dispatch)
