"""Fixtures shared by the integration tests (the cluster itself: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def env(slurm_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The cluster's environment with this test's own run and state directories: runs, the
    run index and the state cache never meet another test's."""
    return {
        **slurm_env,
        "SLURM_TRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "SLURM_TRAIN_STATE_DIR": str(tmp_path / "state"),
    }
