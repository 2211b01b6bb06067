"""A command entrypoint is told the world size its checkpoint was written at."""

from __future__ import annotations

from pathlib import Path

from train.command.processes import child_environ
from train.env import DistEnv


def test_command_gets_the_checkpoint_world_size_beside_resume_from(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints" / "step-7"
    env = child_environ({}, DistEnv(), tmp_path, ckpt, "USR2", checkpoint_world_size=2)
    assert (env["TRAIN_RESUME_FROM"], env["TRAIN_CHECKPOINT_WORLD_SIZE"]) == (str(ckpt), "2")
    assert env["WORLD_SIZE"] == "1"  # the size it runs at now: the command reshards 2 -> 1


def test_a_fresh_start_drops_an_inherited_checkpoint_world_size(tmp_path: Path) -> None:
    base = {"TRAIN_RESUME_FROM": "/old", "TRAIN_CHECKPOINT_WORLD_SIZE": "4"}
    env = child_environ(base, DistEnv(), tmp_path, None, "USR2", checkpoint_world_size=None)
    assert "TRAIN_RESUME_FROM" not in env and "TRAIN_CHECKPOINT_WORLD_SIZE" not in env
