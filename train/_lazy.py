"""Public faces that cost nothing to import: a package lists what it exports and from which of
its modules, and each name is imported on first use (PEP 562). ``from train.checkpoint import
CheckpointManager`` imports torch; ``import train.checkpoint.digest`` does not."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str]
) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` (its ``globals()`` is ``namespace``):
    ``exports`` maps each public name to the module of the package that defines it
    (``"module:attr"`` where the face names it otherwise: ``"branches:current"``)."""

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attr or name)
        namespace[name] = value  # the next access is a plain attribute
        return value

    return __getattr__
