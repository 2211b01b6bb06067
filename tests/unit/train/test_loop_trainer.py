"""run_training: checkpoints at the interval and the end, stop path, early signals, metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from train.env import DistEnv
from train.loop.trainer import WARMUP_STEPS, run_training
from train.spec.config import TrainConfig
from train.stop.signals import PreemptionGuard

CFG = TrainConfig.model_validate(
    {
        "model": "tinycnn",
        "width": 4,
        "data": {"train_size": 320, "test_size": 64},
        "batch_size": 32,
        "epochs": 2,
        "num_threads": 1,
        "log_interval": 5,
        "checkpoint": {"interval_steps": 4, "keep_last": 10},
    }
)


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_full_run_checkpoints_metrics_and_events(tmp_path: Path) -> None:
    result = run_training(CFG, DistEnv(), tmp_path)
    assert result.exit_code == 0 and result.stopped is None
    assert result.steps == 20 and result.epoch == 2  # 10 steps/epoch x 2 epochs
    names = sorted((tmp_path / "checkpoints").iterdir(), key=lambda p: int(p.name[5:]))
    # every 4 steps, and at the end of epoch 1 (step 10), whose evaluation was a new best
    assert [p.name for p in names] == [f"step-{s}" for s in (4, 8, 10, 12, 16, 20)]
    assert result.checkpoint == tmp_path / "checkpoints" / "step-20"
    records = _lines(tmp_path / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    assert [(r["step"], r["epoch"]) for r in evals] == [(10, 0), (20, 1)]  # every epoch end
    assert all(r["lr"] >= 0 and r["images_per_s"] > 0 for r in train)
    assert result.test_accuracy == evals[-1]["test_accuracy"]
    assert result.images_per_s is not None and result.images_per_s > 0
    assert [e["event"] for e in _lines(tmp_path / "events.jsonl")] == ["start", "complete"]
    # a checkpoint saved right after an evaluation carries its score (keep_best ranks by it)
    manifests = {p.name: json.loads((p / "manifest.json").read_text()) for p in names}
    assert manifests["step-10"]["metric"] == evals[0]["test_accuracy"]
    assert manifests["step-20"]["metric"] == evals[1]["test_accuracy"]
    assert manifests["step-8"]["metric"] is None


def test_keep_best_keeps_the_checkpoint_of_the_best_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Scripted scores (the best is the second of four), so the best is not simply the last.
    import train.loop.trainer

    scores = iter([0.5, 0.9, 0.3, 0.4])
    monkeypatch.setattr(train.loop.trainer, "evaluate", lambda *a, **k: (1.0, next(scores)))
    cfg = CFG.model_copy(
        update={
            "epochs": 4,
            "checkpoint": CFG.checkpoint.model_copy(update={"interval_steps": 3, "keep_last": 1}),
        }
    )
    run_training(cfg, DistEnv(), tmp_path)
    evals = [r for r in _lines(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert [(r["step"], r["test_accuracy"]) for r in evals] == [
        (10, 0.5),
        (20, 0.9),
        (30, 0.3),
        (40, 0.4),
    ]
    kept = sorted((tmp_path / "checkpoints").iterdir())
    assert [p.name for p in kept] == ["step-20", "step-40"]
    assert json.loads((kept[0] / "manifest.json").read_text())["metric"] == 0.9


def test_target_accuracy_finishes_early_and_stays_finished(tmp_path: Path) -> None:
    cfg = CFG.model_copy(update={"target_accuracy": 0.05})
    result = run_training(cfg, DistEnv(), tmp_path)
    assert result.exit_code == 0 and result.stopped is None
    assert result.steps == 10 and result.epoch == 1  # the first evaluation reached it
    assert result.test_accuracy is not None and result.test_accuracy >= 0.05
    events = _lines(tmp_path / "events.jsonl")
    assert [e["event"] for e in events] == ["start", "target", "complete"]
    assert events[1]["test_accuracy"] == result.test_accuracy and events[1]["step"] == 10
    # resuming a run that reached its target trains no further
    again = run_training(cfg, DistEnv(), tmp_path, resume=True)
    assert again.steps == 10 and again.exit_code == 0
    # an unreachable target changes nothing
    full = run_training(CFG.model_copy(update={"target_accuracy": 1.0}), DistEnv(), tmp_path / "b")
    assert full.steps == 20


def test_max_steps_truncates_without_changing_the_schedule(tmp_path: Path) -> None:
    short = run_training(CFG, DistEnv(), tmp_path / "a", max_steps=WARMUP_STEPS + 2)
    assert short.steps == WARMUP_STEPS + 2
    lr_short = _lines(tmp_path / "a" / "metrics.jsonl")[0]["lr"]
    run_training(CFG, DistEnv(), tmp_path / "b")
    lr_full = _lines(tmp_path / "b" / "metrics.jsonl")[0]["lr"]
    assert lr_short == lr_full  # step 5 of the same 20-step schedule


def test_stop_signal_saves_requeues_and_the_restart_resumes(tmp_path: Path) -> None:
    # A signal already pending when training starts stops it at the first step boundary.
    guard = PreemptionGuard(("USR2",))
    guard.trigger("USR2")
    result = run_training(CFG, DistEnv(), tmp_path, guard=guard)
    assert result.steps == 1 and result.stopped == "signal"
    assert result.exit_code == 75  # no Slurm job: the launcher/batch script requeues
    events = [e["event"] for e in _lines(tmp_path / "events.jsonl")]
    assert events[0] == "start" and "requeue" in events
    assert (tmp_path / "checkpoints" / "step-1" / "manifest.json").is_file()
    # The restarted run (as after a Slurm requeue: restart_count > 0) resumes from step 1.
    resumed = run_training(CFG, DistEnv(restart_count=1), tmp_path)
    assert resumed.resumed_from == tmp_path / "checkpoints" / "step-1"
    assert resumed.steps == 20 and resumed.exit_code == 0


def test_batch_not_divisible_by_world_times_accum(tmp_path: Path) -> None:
    from train.errors import ConfigError

    bad = CFG.model_copy(update={"batch_size": 30, "grad_accum": 4})
    with pytest.raises(ConfigError, match="not divisible"):
        run_training(bad, DistEnv(), tmp_path)


def test_channels_last_trains_like_the_default(tmp_path: Path) -> None:
    """The GPU-path memory format runs on CPU too and computes the same steps (up to rounding)."""
    cfg = CFG.model_copy(update={"channels_last": True})
    plain = run_training(CFG, DistEnv(), tmp_path / "nchw", max_steps=3)
    nhwc = run_training(cfg, DistEnv(), tmp_path / "nhwc", max_steps=3)
    assert nhwc.steps == plain.steps == 3
    assert abs(nhwc.loss - plain.loss) < 1e-3
