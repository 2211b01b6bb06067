"""The environment that slows every checkpoint save of a job's ranks down (tests/hooks)."""

from __future__ import annotations

import os
from pathlib import Path

HOOKS = Path(__file__).resolve().parents[1] / "hooks"
REPO = Path(__file__).resolve().parents[2]


def slow_saves(seconds: float) -> dict[str, str]:
    """Variables for a job whose ranks sleep ``seconds`` in each phase of every save."""
    path = os.pathsep.join([str(HOOKS), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {"TRAIN_CKPT_TEST_DELAY_S": str(seconds), "PYTHONPATH": path.rstrip(os.pathsep)}
