"""Resume on another world size (issue 27): the global batches do not depend on the world size.

A run stopped on N ranks and resumed on M computes the same global batches as a run at M
throughout (every sample of an epoch once), and, for a model without BatchNorm, the same
parameters up to the float reduction order. The resume event says what changed. At the same
world size resume stays bitwise exact (test_exact_resume.py, unchanged).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from train.errors import ConfigError
from train.history import read_jsonl
from train.loop.order import BatchSplit, epoch_batches, plan_split
from train.spec.config import TrainConfig

sys.path.insert(0, str(Path(__file__).parent))
from _reshape_helpers import global_batches, run_attempt
from _train_helpers import final_params, max_abs_diff

STEPS = 12  # 8 steps per epoch: the runs cross an epoch boundary
BASE = {
    "model": "tinycnn",
    "norm": "none",
    "width": 8,
    "data": {"train_size": 256, "test_size": 32, "augment": True},
    "batch_size": 32,
    "max_steps": STEPS,
    "optimizer": {"name": "sgd", "lr": 0.05, "schedule": "constant"},
    "deterministic": True,
    "num_threads": 1,
    "log_interval": 4,
    "stop_check_s": 0.0,
    "checkpoint": {"interval_steps": 0},
}


def cfg(**changes: object) -> TrainConfig:
    return TrainConfig.model_validate({**BASE, **changes})


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


# -- the order itself ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch", "world", "accum", "ref", "want"),
    [
        (32, 2, 1, None, (1, 16)),  # the plain split
        (32, 2, 2, 2, (2, 8)),  # the same shape: unchanged
        (32, 1, 1, 2, (2, 16)),  # 2 -> 1: the micro-batch stays, accumulation doubles
        (32, 1, 2, 2, (4, 8)),
        (32, 2, 1, 1, (1, 16)),  # 1 -> 2: the micro-batch halves
        (96, 2, 1, 3, (2, 24)),  # 3 -> 2: the fewest micro-steps no larger than 32
        (32, 4, 1, 8, (2, 4)),
    ],
)
def test_plan_split(
    batch: int, world: int, accum: int, ref: int | None, want: tuple[int, int]
) -> None:
    split = plan_split(batch, world, accum, ref)
    assert (split.grad_accum, split.micro) == want
    assert world * split.grad_accum * split.micro == batch


@pytest.mark.parametrize(("batch", "world", "accum", "ref"), [(30, 4, 1, None), (32, 3, 1, 4)])
def test_plan_split_refuses_what_does_not_divide(
    batch: int, world: int, accum: int, ref: int | None
) -> None:
    with pytest.raises(ConfigError, match=rf"train.batch_size {batch} .* {world}"):
        plan_split(batch, world, accum, ref)


def test_rank_slices_of_any_world_size_make_up_the_global_batch() -> None:
    batches = epoch_batches(256, seed=3, epoch=1, batch_size=32, steps=8)
    assert sorted(batches.flatten().tolist()) == sorted(set(batches.flatten().tolist()))
    for world in (1, 2, 4, 8):
        split = BatchSplit(32, world, 1, 32 // world)
        parts = [batches[:, split.rank_slice(r)] for r in range(world)]
        assert torch.equal(torch.cat(parts, dim=1), batches)
    assert not torch.equal(batches, epoch_batches(256, seed=3, epoch=2, batch_size=32, steps=8))


# -- stopped on N ranks, resumed on M -----------------------------------------------------------
def _reshaped_run(run_dir: Path, config: TrainConfig, before: int, after: int) -> dict:
    first = run_attempt(config, run_dir, before, 0, stop_at=4)
    stopped = first[0]["steps"]
    assert 0 < stopped < STEPS and first[0]["exit_code"] != 0
    second = run_attempt(config, run_dir, after, 1, resume=True)
    assert [r["steps"] for r in second] == [STEPS] * after
    resume = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resume"]
    assert len(resume) == 1
    return {"attempts": [first, second], "stopped": stopped, "resume": resume[0]}


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_resume_on_another_world_size_matches_that_size_throughout(
    tmp_path: Path, before: int, after: int
) -> None:
    config = cfg()
    reference = run_attempt(config, tmp_path / "ref", after, 0)
    assert [r["steps"] for r in reference] == [STEPS] * after
    run = _reshaped_run(tmp_path / "run", config, before, after)
    # the same global batches, each step computed once, every sample of an epoch once
    batches = global_batches(run["attempts"])
    assert batches == global_batches([reference])
    assert sorted(batches) == list(range(STEPS))
    first_epoch = [i for s in range(8) for i in batches[s]]
    assert sorted(first_epoch) == sorted(set(first_epoch)) and len(first_epoch) == 256
    # the parameters of the run at `after` ranks throughout, up to the reduction order
    final = tmp_path / "run" / "checkpoints" / f"step-{STEPS}"
    ref_final = tmp_path / "ref" / "checkpoints" / f"step-{STEPS}"
    assert max_abs_diff(final_params(final), final_params(ref_final)) < 1e-5
    event = run["resume"]
    assert event["step"] == run["stopped"]
    assert (event["world_size"], event["was_world_size"]) == (after, before)
    assert event["exact"] is False and "reduced in another order" in event["why"]
    # 2 -> 1 keeps the micro-batch of 16 (two micro-steps); 1 -> 2 keeps one micro-step
    assert (event["grad_accum"], event["micro_batch"]) == ((2, 16) if after == 1 else (1, 16))


def test_a_batchnorm_model_resumed_on_another_size_says_it_is_not_exact(tmp_path: Path) -> None:
    run = _reshaped_run(tmp_path, cfg(norm="batch", optimizer={"lr": 0.01}), 2, 1)
    event = run["resume"]
    assert event["exact"] is False and "BatchNorm" in event["why"]
    assert (event["world_size"], event["was_world_size"]) == (1, 2)


def test_first_start_records_the_shape(tmp_path: Path) -> None:
    run_attempt(cfg(max_steps=1), tmp_path, 2, 0)
    start = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "start"]
    assert [(e["world_size"], e["num_nodes"]) for e in start] == [(2, 1)]
