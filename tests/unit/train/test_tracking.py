"""TensorBoard through requeues: read back with TensorBoard's own reader (issue 16)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator

from train.spec.config import TrainConfig
from train.tracking import Tracker, TrackingError


def _attempt(run: Path, first: int, last: int, resumed: int | None, tag: int, stop: str) -> None:
    """One attempt: train records for first..last, an eval every 5 steps, then ``stop``."""
    tr = Tracker(run, is_main=True, resumed_step=resumed, restart_count=tag)
    for step in range(first, last + 1):
        tr.record(
            {
                "kind": "train",
                "step": step,
                "loss": tag * 1000 + step,
                "lr": 0.1,
                "accuracy": 0.5,
                "images_per_s": 100.0,
                "step_time_s": 0.01,
            }
        )
        if step % 5 == 0:
            tr.record({"kind": "eval", "step": step, "test_accuracy": tag + step / 100})
    if stop:
        tr.event(stop, last)
    tr.close()


def _read(run: Path) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_preempted_twice_every_step_once_in_order(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # attempt 0 trains to 13, its last checkpoint is step 10: 11..13 are redone
    _attempt(run, 1, 13, None, 0, "preempted")
    # attempt 1 resumes from 10 and replays from 1 by mistake: steps <= 10 are not written again
    _attempt(run, 1, 22, 10, 1, "timeout")
    # attempt 2 resumes from 20, trains to the end
    _attempt(run, 21, 30, 20, 2, "")
    acc = _read(run)
    for tag in ("train/loss", "train/lr", "train/accuracy", "train/images_per_s"):
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == list(range(1, 31)), (tag, steps)
    loss = {e.step: e.value for e in acc.Scalars("train/loss")}
    # each step's value comes from the attempt whose work survived
    assert loss[10] == 10 and loss[11] == 1011 and loss[20] == 1020 and loss[21] == 2021
    evals = [e.step for e in acc.Scalars("test/accuracy")]
    assert evals == [5, 10, 15, 20, 25, 30]
    assert [e.step for e in acc.Scalars("run/resumed_from")] == [10, 20]


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    tr = Tracker(tmp_path, is_main=False)
    tr.record({"kind": "train", "step": 1, "loss": 1.0})
    tr.close()
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_missing_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="wandb package is not installed"):
        Tracker(tmp_path, is_main=True, wandb={"project": "x"})


def test_train_wandb_without_the_package_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank refuses the same way (a bad-input error: exit 2), before any set-up."""
    from cluster.errors import BadInputError
    from train.tracking import wandb_options

    cfg = _tiny_config(wandb={"project": "p", "mode": "offline"})
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(BadInputError, match=r"train\.wandb is set but the wandb package"):
        wandb_options(cfg)


def _tiny_config(**extra: object) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": "tinycnn",
            "width": 4,
            "strategy": "single",
            "data": {"kind": "synthetic", "train_size": 128, "test_size": 32},
            "epochs": 3,
            "batch_size": 32,
            "num_threads": 1,
            "checkpoint": {"interval_steps": 5, "keep_last": 5},
            "log_interval": 1,
            **extra,
        }
    )


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_offline_run_keeps_one_id_across_a_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real wandb package, offline: an interrupted and resumed run is ONE W&B run (same id,
    resumed), not a second run starting at step 0."""
    from train.env import DistEnv
    from train.loop.trainer import run_training

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    cfg = _tiny_config(wandb={"project": "slurm-train-test", "mode": "offline"})
    run = tmp_path / "run"
    run_training(cfg, DistEnv(), run, max_steps=7)
    run_id = (run / "wandb-id").read_text().strip()
    assert run_id.isalnum()
    second = run_training(cfg, DistEnv(), run, resume=True)
    assert second.resumed_from is not None
    assert (run / "wandb-id").read_text().strip() == run_id
    offline = sorted(p.name for p in (run / "wandb").glob("offline-run-*"))
    # wandb names the directory offline-run-TIME-ID, and adds -1 when both runs started in the
    # same second
    same_id = re.compile(rf"^offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?$")
    assert len(offline) == 2 and all(same_id.match(name) for name in offline), offline


def test_trainer_interrupted_and_resumed_writes_every_step_once(tmp_path: Path) -> None:
    """The real trainer: a run whose last checkpoint is older than its last logged steps (they
    are lost and redone) leaves each TensorBoard tag with every step once, in order."""
    import shutil

    from train.env import DistEnv
    from train.loop.trainer import run_training

    cfg = _tiny_config()
    run = tmp_path / "run"
    first = run_training(cfg, DistEnv(), run, max_steps=7)
    assert first.steps == 7
    for p in (run / "checkpoints").iterdir():  # as if killed before any save after step 5
        if p.name != "step-5":
            shutil.rmtree(p)
    second = run_training(cfg, DistEnv(), run, resume=True)
    assert second.resumed_from == run / "checkpoints" / "step-5" and second.steps == 12
    acc = _read(run)
    for tag in ("train/loss", "train/lr", "train/images_per_s"):
        assert [e.step for e in acc.Scalars(tag)] == list(range(1, 13)), tag
    assert [e.step for e in acc.Scalars("test/accuracy")] == [4, 8, 12]
    assert [e.step for e in acc.Scalars("run/resumed_from")] == [5]


USER_CODE = """
import torch


def main(ctx):
    start = 0
    if ctx.resume_from is not None:
        start = ctx.load_resume().step
    model = torch.nn.Linear(2, 1)
    for step in range(start + 1, 6):
        ctx.tracker.scalars(step, {"user/loss": 100.0 * ctx.env.restart_count + step})
        if step == 3:
            ctx.tracker.flush()
            ctx.checkpoints.save(step, {}, {}, epoch=0, epoch_step=step, model=model)
            ctx.checkpoints.wait()
    return 0
"""


def test_entrypoint_function_gets_the_same_tracker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """User code logs through ctx.tracker; resumed from its step-3 checkpoint, the steps it
    wrote after it (4, 5) are dropped and written again: each step once, in order."""
    import yaml

    from train.cli import main

    (tmp_path / "tracked_user_train.py").write_text(USER_CODE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "resources": {"nodes": 1},
                "train": {"model": "tinycnn", "data": {"kind": "synthetic"}},
                "entrypoint": {"function": "tracked_user_train:main"},
            }
        )
    )
    run = tmp_path / "r"
    assert main(["--config", str(spec), "--run-dir", str(run)]) == 0
    assert main(["--config", str(spec), "--run-dir", str(run), "--resume"]) == 0
    assert [e.step for e in _read(run).Scalars("user/loss")] == [1, 2, 3, 4, 5]
