"""A failure while training: recorded, requeued while requeue.max_failures allows, then stopped.

Runs the real trainer in-process; the Slurm client is a fake (never the real cluster's
``scontrol requeue`` for a made-up job id).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import StopAtStep

import train.loop.trainer
import train.session
from train.checkpoint import CheckpointManager, verify_checkpoint
from train.env import DistEnv
from train.history import RunHistory
from train.spec.config import RequeueConfig, TrainConfig
from train.stop import BUDGET_EXHAUSTED_EXIT_CODE, request_requeue
from train.stop.claims import attempt_name

CONFIG = TrainConfig.model_validate(
    {
        "model": "tinycnn",
        "width": 4,
        "data": {"kind": "synthetic", "train_size": 128, "test_size": 32},
        "epochs": 2,
        "batch_size": 32,
        "strategy": "single",
        "deterministic": True,
        "num_threads": 1,
        "checkpoint": {"interval_steps": 2},
    }
)


class FakeClient:
    def __init__(self) -> None:
        self.requeued: list[str] = []

    def requeue(self, job_id: str) -> None:
        self.requeued.append(job_id)


ORIGINAL_TRAIN_STEP = train.loop.trainer._Loop.train_step


def _fail_at(monkeypatch: pytest.MonkeyPatch, step: int | None) -> None:
    original = ORIGINAL_TRAIN_STEP

    def train_step(self: Any, order: Any) -> None:
        if step is not None and self.step == step:
            raise RuntimeError(f"injected failure at step {step}")
        original(self, order)

    monkeypatch.setattr(train.loop.trainer._Loop, "train_step", train_step)


def test_failures_requeue_until_the_budget_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = FakeClient()
    monkeypatch.setattr(train.session, "request_requeue", partial(request_requeue, client=client))
    env = DistEnv.from_env({"SLURM_JOB_ID": "123456"})
    requeue = RequeueConfig(max_failures=1)

    reference = tmp_path / "ref"
    train.loop.trainer.run_training(CONFIG, DistEnv.from_env({}), reference)
    ref_digest = verify_checkpoint(reference / "checkpoints" / "step-8")["digest"]

    run = tmp_path / "run"
    _fail_at(monkeypatch, 3)
    first = train.loop.trainer.run_training(CONFIG, env, run, requeue=requeue)
    assert (first.stopped, first.exit_code, first.steps) == ("failure", 1, 3)
    assert client.requeued == ["123456"]

    _fail_at(monkeypatch, 5)  # the requeued run resumes from step 2 and fails again
    second = train.loop.trainer.run_training(CONFIG, env, run, requeue=requeue, resume=True)
    assert second.resumed_from == run / "checkpoints" / "step-2"
    assert second.exit_code == BUDGET_EXHAUSTED_EXIT_CODE and client.requeued == ["123456"]

    history = RunHistory(run)
    events = [e["event"] for e in history.events()]
    assert events == ["start", "failure", "requeue", "resume", "failure", "budget_exhausted"]
    assert "injected failure at step 3" in history.events()[1]["error"]
    # round 2 item 3: the traceback reaches the record: the signature names where it was raised
    assert " @ test_session_failure.py:" in history.events()[1]["signature"]
    assert "failed 2x" in history.summary() and "max_failures=1" in history.summary()

    # a later manual resume (budget raised) finishes with the uninterrupted run's parameters
    _fail_at(monkeypatch, None)
    last = train.loop.trainer.run_training(
        CONFIG, env, run, requeue=RequeueConfig(max_failures=5), resume=True
    )
    assert last.exit_code == 0 and last.resumed_from == run / "checkpoints" / "step-4"
    newest = CheckpointManager(run / "checkpoints", rank=1, world_size=1).latest_valid()
    assert newest is not None and verify_checkpoint(newest)["digest"] == ref_digest


@pytest.mark.parametrize(("ended", "code"), [("hang", 0), ("failure", 1)])
def test_a_stop_after_the_attempt_was_ended_elsewhere_records_and_saves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ended: str, code: int
) -> None:
    # a hang watcher (or the first failing rank) recorded this attempt's end and requeued the
    # job; Slurm's TERM at that requeue (srun ending the step) reaches this rank at a step
    # boundary: it is the end already recorded, not a stop of its own
    client = FakeClient()
    monkeypatch.setattr(train.session, "request_requeue", partial(request_requeue, client=client))
    env = DistEnv.from_env({"SLURM_JOB_ID": "77"})
    run = tmp_path / "run"
    claimed = (
        run / "hangs" / attempt_name("77", env.attempt) / "claimed"
        if ended == "hang"
        else run / ".failures" / f"77-{env.attempt}"
    )
    guard = StopAtStep(3)
    original = guard.should_stop

    def should_stop(reduce: Any) -> bool:
        stop = original(reduce)
        if stop:  # the claim lands while the step ran, the signal after it
            claimed.parent.mkdir(parents=True, exist_ok=True)
            claimed.write_text("")
        return stop

    guard.should_stop = should_stop  # type: ignore[method-assign]
    # No hang watcher: the claim written here is a stand-in for another node's, and this run's
    # own watcher, on seeing it, would do what it must at a real one (freeze this rank, then
    # SIGKILL it: here the pytest worker itself, seen once when the machine was loaded enough
    # for the watcher's look to come before the run's end).
    requeue = RequeueConfig(hang_watchdog=False)
    result = train.loop.trainer.run_training(CONFIG, env, run, guard=guard, requeue=requeue)
    assert (result.stopped, result.exit_code) == (ended, code)
    assert [e["event"] for e in RunHistory(run).events()] == ["start"]
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-2"]
    assert client.requeued == []
