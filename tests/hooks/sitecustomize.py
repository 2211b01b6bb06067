"""Test hooks for processes the tests start (a Slurm job's ranks, a child process), with this
folder on ``PYTHONPATH`` (tests/integration/slow_saves.py):

- ``TRAIN_CKPT_TEST_DELAY_S``: every phase of a checkpoint save sleeps that long, so that a stop
  or a kill lands in the middle of a save. The product only offers the hook
  (train.checkpoint.manager ``SAVE_PHASE_HOOKS``); the delay is the test's. With
  ``TRAIN_CKPT_TEST_DELAY_WHEN`` (a path) only the phases that end while that path exists sleep:
  the one save a test kills, not every save before it.
- ``TRAIN_EVAL_TEST_DELAY_S``: every evaluation (``train.loop.metrics.evaluate``) sleeps that long
  first: an evaluation on a test set far bigger than the example's, without its CPU cost.
- ``TRAIN_TEST_STEP_S``: every optimizer step of the built-in trainer sleeps that long after it
  is done (the parameters are those of a run without the sleep): a run that lasts long enough
  for what a test does to it, without burning the CPUs the other tests share. With
  ``TRAIN_TEST_PACE_FILE`` (a path) only while that file exists: a test removes it once it has
  done what it does, and the rest of the run goes at full speed.

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
_SAVE_DELAY_WHEN = os.environ.get("TRAIN_CKPT_TEST_DELAY_WHEN")
_EVAL_DELAY = os.environ.get("TRAIN_EVAL_TEST_DELAY_S")
_STEP_S = os.environ.get("TRAIN_TEST_STEP_S")
_PACE_FILE = os.environ.get("TRAIN_TEST_PACE_FILE")


def _slow_saves(module: ModuleType) -> None:
    seconds = float(_SAVE_DELAY or 0)

    def delay(phase: str) -> None:
        if _SAVE_DELAY_WHEN is None or os.path.exists(_SAVE_DELAY_WHEN):
            time.sleep(seconds)

    module.SAVE_PHASE_HOOKS.append(delay)


def _slow_evaluations(module: ModuleType) -> None:
    seconds = float(_EVAL_DELAY or 0)
    evaluate = module.evaluate

    @functools.wraps(evaluate)
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return evaluate(*args, **kwargs)

    module.evaluate = slow


def _slow_steps(module: ModuleType) -> None:
    seconds = float(_STEP_S or 0)
    step = module._Loop.train_step

    @functools.wraps(step)
    def train_step(self: Any, order: Any) -> None:
        step(self, order)
        if _PACE_FILE is None or os.path.exists(_PACE_FILE):
            time.sleep(seconds)

    module._Loop.train_step = train_step


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
    sys.meta_path.insert(0, _HookWhenImported("train.loop.metrics", _slow_evaluations))
if _STEP_S:
    sys.meta_path.insert(0, _HookWhenImported("train.loop.trainer", _slow_steps))


# With TRAIN_TEST_SAMPLES_DIR set (tests/integration/test_reshape_cluster.py): every rank of the
# built-in trainer appends, per optimizer step, the training-set indices it computed to
# DIR/samples-RESTART-RANK.jsonl (the product offers train.loop.trainer.BATCH_HOOKS; the file
# and its place are the test's).
_SAMPLES = os.environ.get("TRAIN_TEST_SAMPLES_DIR")


def _record_samples(module: ModuleType) -> None:
    import json

    attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
    rank = os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))
    out = os.path.join(str(_SAMPLES), f"samples-{attempt}-{rank}.jsonl")

    def record(step: int, epoch: int, indices: Any) -> None:
        line = json.dumps({"step": step, "epoch": epoch, "ids": indices.tolist()})
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    module.BATCH_HOOKS.append(record)


if _SAMPLES:
    sys.meta_path.insert(0, _HookWhenImported("train.loop.trainer", _record_samples))
