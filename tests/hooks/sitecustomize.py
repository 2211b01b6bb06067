"""Test hook for processes the tests start (a Slurm job's ranks, a child process): with
``TRAIN_CKPT_TEST_DELAY_S`` set and this folder on ``PYTHONPATH`` (tests/integration/
slow_saves.py), every phase of a checkpoint save sleeps that long, so that a stop or a kill
lands in the middle of a save. The product only offers the hook (train.checkpoint.manager
``SAVE_PHASE_HOOKS``); the delay is the test's.

Python imports ``sitecustomize`` at start-up; this one imports nothing of the project then: it
waits for ``train.checkpoint.manager`` to be imported (torch comes with it) and adds the hook.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from types import ModuleType
from typing import Any

_DELAY = os.environ.get("TRAIN_CKPT_TEST_DELAY_S")
_TARGET = "train.checkpoint.manager"


class _AddHookWhenImported(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            seconds = float(_DELAY or 0)
            module.SAVE_PHASE_HOOKS.append(lambda phase: time.sleep(seconds))

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _DELAY:
    sys.meta_path.insert(0, _AddHookWhenImported())
