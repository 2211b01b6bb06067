"""Bench hook (``bench/bench_goodput.py``): pads the built-in trainer's steps to a fixed time.

With ``BENCH_STEP_S`` set and this folder on ``PYTHONPATH``, every
``train.loop.trainer._Loop.train_step`` is padded with a sleep to that many seconds (the
same workload as the other rows, ``bench/goodput_work.py``), and rank 0 appends the step to
``RUN_DIR/progress.jsonl`` as the other rows do. Nothing of the project is imported at start-up:
the hook waits for ``train.loop.trainer`` to be imported (as ``tests/hooks/sitecustomize.py``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time
from types import ModuleType
from typing import Any

_STEP_S = os.environ.get("BENCH_STEP_S")
_TARGET = "train.loop.trainer"


def _pad(module: ModuleType, seconds: float) -> None:
    trainer = module._Loop  # the built-in loop (train/loop/trainer.py)
    step = trainer.train_step

    def train_step(self: Any, order: Any) -> None:
        t0 = time.perf_counter()
        step(self, order)
        time.sleep(max(0.0, seconds - (time.perf_counter() - t0)))
        if self.env.is_main:
            line = {"time": time.time(), "attempt": self.env.restart_count, "step": self.step}
            with open(self.metrics.path.parent / "progress.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")

    trainer.train_step = train_step


class _PadWhenImported(importlib.abc.MetaPathFinder):
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
            _pad(module, float(_STEP_S or 0))

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _STEP_S:
    sys.meta_path.insert(0, _PadWhenImported())
