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


# -- the split is part of the checkpoint (issue 44.1) -------------------------------------------
def test_a_second_resume_after_a_reshape_keeps_the_split(tmp_path: Path) -> None:
    """2 ranks -> 1 ran each step as 2 micro-steps of 16; stopped again on 1 rank, the resume
    read the world-1 checkpoint and switched to 1 micro-step of 32 (a GPU run sized to fit
    went out of memory), its event silent. The split is in the checkpoint: 2 -> 1 -> 1 with
    BatchNorm ends bitwise equal to 2 -> 1 resumed once, and the micro-batch never doubles."""
    config = cfg(norm="batch", optimizer={"lr": 0.01})
    once = _reshaped_run(tmp_path / "once", config, 2, 1)
    run = tmp_path / "twice"
    first = run_attempt(config, run, 2, 0, stop_at=4)
    second = run_attempt(config, run, 1, 1, resume=True, stop_at=3)
    third = run_attempt(config, run, 1, 2, resume=True)
    stops = [first[0]["steps"], second[0]["steps"]]
    assert stops[0] == once["stopped"] and stops[0] < stops[1] < STEPS, stops
    assert [r["steps"] for r in third] == [STEPS]
    assert global_batches([first, second, third]) == global_batches(once["attempts"])
    a = final_params(run / "checkpoints" / f"step-{STEPS}")
    b = final_params(tmp_path / "once" / "checkpoints" / f"step-{STEPS}")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), max_abs_diff(a, b)
    resumes = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "resume"]
    assert [(e["grad_accum"], e["micro_batch"]) for e in resumes] == [(2, 16), (2, 16)]
    # the reshape says what it changed; the resume on the same shape and split is exact
    assert resumes[0]["exact"] is False and resumes[0]["was_world_size"] == 2
    assert resumes[1]["exact"] is True and "why" not in resumes[1]
    assert not {"was_grad_accum", "was_micro_batch", "was_world_size"} & resumes[1].keys()


def test_every_resume_says_what_it_changes(tmp_path: Path) -> None:
    """A resume on the same world size and split says exact: true; a split that had to change
    (3 -> 2 ranks: the kept micro-batch of 32 does not divide a rank's 48) names the old one."""
    config = cfg(batch_size=96, data={"train_size": 480, "test_size": 32, "augment": True})
    run_attempt(config, tmp_path, 3, 0, stop_at=2)
    run_attempt(config, tmp_path, 3, 1, resume=True, stop_at=2)
    run_attempt(config, tmp_path, 2, 2, resume=True, stop_at=2)
    resumes = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "resume"]
    same, smaller = resumes
    assert (same["exact"], same["grad_accum"], same["micro_batch"]) == (True, 1, 32)
    assert (smaller["grad_accum"], smaller["micro_batch"]) == (2, 24)
    assert (smaller["was_grad_accum"], smaller["was_micro_batch"]) == (1, 32)
    assert smaller["exact"] is False and "1 micro-step(s) of 32 became 2 of 24" in smaller["why"]


@pytest.mark.parametrize(
    ("batch", "world", "keep", "want"),
    [
        (32, 1, 16, (2, 16)),  # the checkpoint's micro-batch, whatever size it was written at
        (32, 2, 16, (1, 16)),
        (32, 4, 16, (1, 8)),  # a rank's share is smaller: never larger than the kept one
        (96, 2, 32, (2, 24)),  # does not divide 48: the fewest micro-steps no larger
        (32, 1, 32, (1, 32)),
    ],
)
def test_plan_split_keeps_the_checkpoints_micro_batch(
    batch: int, world: int, keep: int, want: tuple[int, int]
) -> None:
    split = plan_split(batch, world, 1, keep_micro=keep)
    assert (split.grad_accum, split.micro) == want and split.micro <= keep


def test_a_manifest_with_a_damaged_split_is_refused(tmp_path: Path) -> None:
    from train.checkpoint.manifest import check_manifest, written_split
    from train.errors import CheckpointError

    good = {
        "format": 2, "step": 1, "epoch": 0, "epoch_step": 1, "world_size": 2,
        "digest": "0" * 32, "files": {"shared.pt": {"size": 1, "xxh3_128": "0" * 32}},
    }  # fmt: skip
    assert written_split(good) is None  # an older checkpoint records none
    split = {"world_size": 2, "grad_accum": 1, "micro_batch": 16}
    assert written_split(check_manifest({**good, "split": split}, tmp_path)) == split
    for bad in (
        {**split, "micro_batch": 0},
        {"grad_accum": 1},
        [2, 1, 16],
        {**split, "world_size": "2"},
    ):
        with pytest.raises(CheckpointError, match=r"damaged manifest\.json: split is"):
            check_manifest({**good, "split": bad}, tmp_path)
