"""Test hooks for processes the tests start (a Slurm job's ranks, a child process), with this
folder on ``PYTHONPATH`` (tests/integration/slow_saves.py):

- ``TRAIN_CKPT_TEST_DELAY_S``: every phase of a checkpoint save sleeps that long, so that a stop
  or a kill lands in the middle of a save. The product only offers the hook
  (train.checkpoint.manager ``SAVE_PHASE_HOOKS``); the delay is the test's.
- ``TRAIN_EVAL_TEST_DELAY_S``: every evaluation (``train.metrics.evaluate``) sleeps that long
  first: an evaluation on a test set far bigger than the example's, without its CPU cost.

Python imports ``sitecustomize`` at start-up; this one imports nothing of the project then: it
waits for the module to be imported (torch comes with it) and hooks in.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

_SAVE_DELAY = os.environ.get("TRAIN_CKPT_TEST_DELAY_S")
_EVAL_DELAY = os.environ.get("TRAIN_EVAL_TEST_DELAY_S")


def _slow_saves(module: ModuleType) -> None:
    seconds = float(_SAVE_DELAY or 0)
    module.SAVE_PHASE_HOOKS.append(lambda phase: time.sleep(seconds))


def _slow_evaluations(module: ModuleType) -> None:
    seconds = float(_EVAL_DELAY or 0)
    evaluate = module.evaluate

    @functools.wraps(evaluate)
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return evaluate(*args, **kwargs)

    module.evaluate = slow


class _HookWhenImported(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, hook: Callable[[ModuleType], None]) -> None:
        self.target, self.hook = target, hook

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module
        hook = self.hook

        def exec_module(module: ModuleType) -> None:
            run(module)
            hook(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _SAVE_DELAY:
    sys.meta_path.insert(0, _HookWhenImported("train.checkpoint.manager", _slow_saves))
if _EVAL_DELAY:
    sys.meta_path.insert(0, _HookWhenImported("train.metrics", _slow_evaluations))
