"""Environments that slow a job's ranks down (tests/hooks/sitecustomize.py): its saves, or its
steps (a sleep after each: a run lasts long enough for what a test does to it without burning
the CPUs that the other test workers share; the parameters are those of a run without it)."""

from __future__ import annotations

import os
from pathlib import Path

HOOKS = Path(__file__).resolve().parents[1] / "hooks"
REPO = Path(__file__).resolve().parents[2]


def _hooks(**variables: str) -> dict[str, str]:
    path = os.pathsep.join([str(HOOKS), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**variables, "PYTHONPATH": path.rstrip(os.pathsep)}


def slow_saves(seconds: float) -> dict[str, str]:
    """Variables for a job whose ranks sleep ``seconds`` in each phase of every save."""
    return _hooks(TRAIN_CKPT_TEST_DELAY_S=str(seconds))


def slow_steps(seconds: float, pace: Path | None = None) -> dict[str, str]:
    """Variables for a job whose ranks sleep ``seconds`` after every optimizer step; with
    ``pace`` (created here) only while that file exists: remove it and the run speeds up."""
    if pace is None:
        return _hooks(TRAIN_TEST_STEP_S=str(seconds))
    pace.touch()
    return _hooks(TRAIN_TEST_STEP_S=str(seconds), TRAIN_TEST_PACE_FILE=str(pace))
