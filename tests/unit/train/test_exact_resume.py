"""Exact resume: a run interrupted and resumed (twice, at any step, mid-epoch) ends bitwise equal
to the same run uninterrupted (the manifest digest), on CPU with deterministic settings.

Against the real trainer (``train.loop.trainer.run_training`` / ``python -m train``):
- 1 process, in-process, stopped through the real stop path (guard -> save -> barrier ->
  request_requeue) at epoch ends, mid-epoch and at interval-checkpoint steps, sync and async;
- 2-rank gloo DDP on 127.0.0.1 (torchrun-style variables), the stop requested on one rank only
  so the ranks must agree through the all-reduce;
- ``python -m train`` SIGKILLed while a checkpoint is being written, then ``--resume``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import free_port, start_ranks, stop_after_worker, torchrun_env

from train.checkpoint import CheckpointManager, verify_checkpoint
from train.env import DistEnv
from train.history import RunHistory
from train.loop.trainer import run_training
from train.spec.config import TrainConfig
from train.stop import REQUEUE_EXIT_CODE
from train.stop.signals import PreemptionGuard

REPO = Path(__file__).resolve().parents[3]

# 256 images, global batch 32 in 2 micro-steps: 8 optimizer steps per epoch with 1 or 2 ranks.
TRAIN: dict[str, Any] = {
    "model": "tinycnn",
    "width": 4,
    "data": {"kind": "synthetic", "train_size": 256, "test_size": 64},
    "epochs": 3,
    "batch_size": 32,
    "grad_accum": 2,
    "deterministic": True,
    "num_threads": 1,
    "checkpoint": {"interval_steps": 5, "keep_last": 2},
    "log_interval": 4,
    "optimizer": {"lr": 0.05},
    # check for the stop flag at every step: the tests stop at exact steps (StopPoll: below)
    "stop_check_s": 0.0,
}
TOTAL_STEPS = 24


def _config(strategy: str, async_save: bool = False, **extra: Any) -> TrainConfig:
    data = json.loads(json.dumps(TRAIN))
    data["strategy"] = strategy
    data["checkpoint"]["async"] = async_save
    return TrainConfig.model_validate({**data, **extra})


def _final_digest(run_dir: Path) -> tuple[int, str]:
    cm = CheckpointManager(run_dir / "checkpoints", rank=1, world_size=2)  # rank 1: read only
    path = cm.latest_valid()
    assert path is not None, f"no valid checkpoint in {run_dir}"
    manifest = verify_checkpoint(path)
    return int(manifest["step"]), str(manifest["digest"])


class StopAfter(PreemptionGuard):
    """The real guard, with the stop request raised at a chosen step instead of by a signal."""

    def __init__(self, steps: int | None) -> None:
        super().__init__()
        self.left = steps

    def should_stop(self, all_reduce_max: Any) -> bool:
        if self.left is not None:
            self.left -= 1
            if self.left == 0:
                self.trigger("USR2")
        return super().should_stop(all_reduce_max)


# -- one process, in-process ------------------------------------------------------------------
@pytest.fixture(scope="module")
def single_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[int, str]]:
    out = {}
    for async_save in (False, True):
        run_dir = tmp_path_factory.mktemp(f"ref-async{int(async_save)}")
        result = run_training(_config("single", async_save), DistEnv.from_env({}), run_dir)
        assert result.exit_code == 0 and result.steps == TOTAL_STEPS
        out[async_save] = _final_digest(run_dir)
    assert out[False] == out[True]  # async saving does not change training
    return out


@pytest.mark.parametrize(
    ("stops", "async_save"),
    [
        ((3, 8), False),  # mid-epoch, then exactly at an epoch end
        ((5, 13), True),  # at an interval checkpoint (saved twice -> kept once), mid-epoch
        ((1, 23), False),  # right after the start, one step before the end
    ],
)
def test_single_process_interrupted_twice(
    tmp_path: Path,
    single_reference: dict[bool, tuple[int, str]],
    stops: tuple[int, int],
    async_save: bool,
) -> None:
    config, env = _config("single", async_save), DistEnv.from_env({})
    previous = 0
    for stop in (*stops, None):
        guard = StopAfter(stop - previous if stop is not None else None)
        result = run_training(config, env, tmp_path, guard=guard, resume=previous > 0 or None)
        if previous:
            # resumed from the checkpoint written at the stop: no completed step lost
            assert result.resumed_from == tmp_path / "checkpoints" / f"step-{previous}"
        if stop is not None:
            assert result.exit_code == REQUEUE_EXIT_CODE and result.steps == stop
            assert result.stopped == "signal"
            previous = stop
        else:
            assert result.exit_code == 0 and result.steps == TOTAL_STEPS
    assert _final_digest(tmp_path) == single_reference[async_save]
    history = RunHistory(tmp_path)
    stop = ["signal", "checkpoint", "preempted", "requeue", "resume"]
    assert [e["event"] for e in history.events()] == ["start", *stop, *stop, "complete"]
    assert history.events()[1]["signal"] == "SIGUSR2"
    assert history.to_dict()["preemptions"] == 2 and history.to_dict()["complete"]
    assert history.summary() == (
        f"preempted 2x, resumed at step {stops[1]}, complete at step {TOTAL_STEPS}"
    )


# -- two ranks, gloo DDP, one process each ----------------------------------------------------
def _run_two_ranks(
    config: TrainConfig,
    run_dir: Path,
    stop_after: int,
    stop_rank: int,
    resume: bool,
    min_step_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Two ranks (processes forked from a server that imported torch once: start_ranks) with
    torchrun's variables and nothing of Slurm in their environment."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("result-*.json"):
        old.unlink()
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_RESTART_COUNT", "SLURM_STEP_ID")
    }
    environ.update(torchrun_env(0, 2, free_port()), OMP_NUM_THREADS="1")
    cfg_json = config.model_dump_json(by_alias=False)
    args = (cfg_json, str(run_dir), stop_after, stop_rank, resume, min_step_s)
    start_ranks(stop_after_worker, args, 2, environ)
    return [json.loads((run_dir / f"result-{rank}.json").read_text()) for rank in range(2)]


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    run_dir = tmp_path_factory.mktemp("ref-ddp")
    results = _run_two_ranks(_config("ddp"), run_dir, 0, 0, False)
    assert [r["steps"] for r in results] == [TOTAL_STEPS, TOTAL_STEPS]
    return _final_digest(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stops", "stop_rank", "async_save"),
    [
        ((6, 12), 1, False),  # only rank 1 is signalled: rank 0 learns it from the all-reduce
        ((8, 17), 0, True),
    ],
)
def test_two_rank_ddp_interrupted_twice(
    tmp_path: Path,
    ddp_reference: tuple[int, str],
    stops: tuple[int, int],
    stop_rank: int,
    async_save: bool,
) -> None:
    config = _config("ddp", async_save)
    previous = 0
    for planned in (*stops, None):
        # With several ranks the stop flag's reduce overlaps the next step (Runtime.lagged_max):
        # every rank stops one step after the signal, all at the same step.
        stop = planned + 1 if planned is not None else None
        results = _run_two_ranks(
            config, tmp_path, planned - previous if planned else 0, stop_rank, previous > 0
        )
        expected_steps = stop if stop is not None else TOTAL_STEPS
        assert [r["steps"] for r in results] == [expected_steps] * 2
        if previous:
            assert {r["resumed_from"] for r in results} == {
                str(tmp_path / "checkpoints" / f"step-{previous}")
            }
        # rank 0 returns the requeue code, the others 0 (srun reports the highest)
        want = [REQUEUE_EXIT_CODE, 0] if stop is not None else [0, 0]
        assert [r["exit_code"] for r in results] == want
        previous = stop or previous
    step, digest = _final_digest(tmp_path)
    assert (step, digest) == ddp_reference
    manifest = verify_checkpoint(tmp_path / "checkpoints" / f"step-{TOTAL_STEPS}")
    assert manifest["world_size"] == 2 and set(manifest["files"]) == {
        "shared.pt",
        "rank-0.pt",
        "rank-1.pt",
    }


# -- python -m train killed while writing a checkpoint ----------------------------------------
def test_cli_sigkill_during_checkpoint_then_resume(
    tmp_path: Path, single_reference: dict[bool, tuple[int, str]]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"train": {**TRAIN, "strategy": "single"}}))
    run_dir = tmp_path / "run"
    # the step-10 save holds 60 s once its shared file is written (tests/hooks/sitecustomize.py),
    # so the kill lands in that save; the saves before it are not slowed down
    target = run_dir / "checkpoints" / ".step-10.tmp" / "shared.pt"
    hooks = REPO / "tests" / "hooks"
    env = {
        **os.environ,
        "PYTHONPATH": f"{hooks}{os.pathsep}{REPO}",
        "TRAIN_CKPT_TEST_DELAY_S": "60",
        "TRAIN_CKPT_TEST_DELAY_WHEN": str(target),
    }
    for var in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_RESTART_COUNT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    argv = [sys.executable, "-m", "train", "--config", str(spec), "--run-dir", str(run_dir)]
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not target.exists():
            assert proc.poll() is None, f"train exited early: {proc.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "the step-10 save never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    ckpt = CheckpointManager(run_dir / "checkpoints", rank=1, world_size=1)
    # step 8 (the end of epoch 1: its evaluation is a new best, kept for keep_best) is the newest
    # complete one; the interrupted step-10 save is never loaded
    assert ckpt.latest_valid() == run_dir / "checkpoints" / "step-8"

    env.pop("TRAIN_CKPT_TEST_DELAY_S")
    env.pop("TRAIN_CKPT_TEST_DELAY_WHEN")
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [*argv, "--resume"], env=env, cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _final_digest(run_dir) == single_reference[False]
    events = [e["event"] for e in RunHistory(run_dir).events()]
    assert events == ["start", "resume", "complete"]
    assert RunHistory(run_dir).events()[1]["step"] == 8


@pytest.mark.slow
def test_two_rank_ddp_checking_every_k_steps_stops_together(
    tmp_path: Path, ddp_reference: tuple[int, str]
) -> None:
    """The default stop polling (every k steps after calibration, k agreed over ranks): a signal
    on rank 1 only stops both ranks at the same step, and the resumed run is still exact."""
    config = _config("ddp", stop_check_s=0.05)
    # The 12th check comes after the calibration at step 10, so k > 1 is in effect: checks at
    # steps 1..10, 10+k, 10+2k (the signal), and the stop at the next, 10+3k, before step 24
    # only while k <= 4. k is the number of steps in 0.05 s, so each step takes at least 12.5 ms
    # here (k <= 4; k = 2 on an idle machine): on a fast one, 24 steps once ended first.
    results = _run_two_ranks(config, tmp_path, 12, 1, False, min_step_s=0.0125)
    steps = {r["steps"] for r in results}
    assert len(steps) == 1, results
    stopped_at = steps.pop()
    assert 12 <= stopped_at < TOTAL_STEPS
    assert [r["exit_code"] for r in results] == [REQUEUE_EXIT_CODE, 0]
    done = _run_two_ranks(config, tmp_path, 0, 0, True)
    assert [r["steps"] for r in done] == [TOTAL_STEPS] * 2
    assert {r["resumed_from"] for r in done} == {
        str(tmp_path / "checkpoints" / f"step-{stopped_at}")
    }
    assert _final_digest(tmp_path) == ddp_reference
