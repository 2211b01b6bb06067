"""Strategies and gradient accumulation compute the same update as one big batch (real gloo).

Why the models here are BatchNorm-free (``norm: none``): BatchNorm normalises with the
statistics of the batch it sees, so 2 ranks x B/2, k micro-batches of B/k, or pipeline chunks
see different statistics than one batch of B, and the updates legitimately differ. Without
normalisation layers the loss is a plain mean over samples and all of them must agree to float
rounding. The one BatchNorm test uses ``sync_batchnorm`` (global statistics over the ranks).

Data order: DistributedSampler gives rank r the samples ``perm[r::W]``, so the union of the
ranks' step-s batches is the single process's step-s batch; augmentation is drawn per rank, so
it is off where ranks are compared (grad accumulation draws per step and keeps it on).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from train.env import DistEnv
from train.loop.trainer import run_training
from train.spec.config import TrainConfig

# The spawned ranks import their entry function from the helper module next to this file.
sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import final_params, max_abs_diff, run_ranks

BASE = TrainConfig.model_validate(
    {
        "model": "tinycnn",
        "norm": "none",
        "width": 8,
        "data": {"train_size": 512, "test_size": 64, "augment": False},
        "batch_size": 32,
        "max_steps": 3,
        "optimizer": {"name": "sgd", "lr": 0.05, "schedule": "constant"},
        "deterministic": True,
        "num_threads": 1,
        "log_interval": 1,
        "checkpoint": {"interval_steps": 0},
    }
)


def cfg(**changes: object) -> TrainConfig:
    data = BASE.model_dump()
    for key, value in changes.items():
        node = data
        *path, last = key.split("__")
        for p in path:
            node = node[p]
        node[last] = value
    return TrainConfig.model_validate(data)


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def single(config: TrainConfig, run_dir: Path) -> dict[str, torch.Tensor]:
    result = run_training(config, DistEnv(), run_dir)
    assert result.exit_code == 0 and result.steps == config.max_steps
    assert result.checkpoint is not None
    return final_params(result.checkpoint)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    return single(cfg(strategy="single"), tmp_path_factory.mktemp("single"))


def test_params_actually_move(reference: dict[str, torch.Tensor], tmp_path: Path) -> None:
    # Guard against a vacuous comparison: 3 steps change the weights well beyond 1e-6.
    init = single(cfg(strategy="single", max_steps=1, optimizer__lr=1e-9), tmp_path)
    assert max_abs_diff(init, reference) > 1e-3


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_ddp_two_ranks_match_one_process(
    reference: dict[str, torch.Tensor], tmp_path: Path, grad_accum: int
) -> None:
    results = run_ranks(cfg(strategy="ddp", grad_accum=grad_accum), tmp_path, world=2)
    assert [r["steps"] for r in results] == [3, 3]
    # the DDP wrapper is gone before the session destroys the group (its reducer must not
    # hold the group's last reference: a rank could deadlock at its exit, README)
    assert [r["ddp_alive_at_destroy"] for r in results] == [[0], [0]]
    assert max_abs_diff(final_params(results[0]["checkpoint"]), reference) < 1e-6


def test_a_ctrl_c_that_escapes_the_run_releases_the_ddp_wrapper_first(tmp_path: Path) -> None:
    """A KeyboardInterrupt escapes run_training (no save, no record of it): the session still
    destroys the group, and the DDP wrapper must be gone by then on that path too."""
    results = run_ranks(cfg(strategy="ddp"), tmp_path, world=2, interrupt_at=2)
    assert [r.get("interrupted") for r in results] == [True, True]
    assert [r["ddp_alive_at_destroy"] for r in results] == [[0], [0]]


def test_grad_accum_matches_one_big_batch(tmp_path: Path) -> None:
    # Augmentation on: crops are drawn per optimizer step, so micro-splitting keeps them.
    big = single(cfg(strategy="single", data__augment=True), tmp_path / "k1")
    accum = single(cfg(strategy="single", data__augment=True, grad_accum=4), tmp_path / "k4")
    assert max_abs_diff(big, accum) < 1e-6


@pytest.mark.parametrize("strategy", ["dp", "pipeline"])
def test_dp_and_pipeline_match_single(
    reference: dict[str, torch.Tensor], tmp_path: Path, strategy: str
) -> None:
    params = single(cfg(strategy=strategy, pipeline_chunks=4), tmp_path)
    assert max_abs_diff(params, reference) < 1e-6


def test_ddp_sync_batchnorm_matches_one_process(tmp_path: Path) -> None:
    # With BatchNorm, only global statistics (SyncBatchNorm; GlobalBatchNorm on CPU) make
    # 2 x B/2 equal to one batch of B. The variance is computed as E[x^2] - E[x]^2 across
    # ranks, so the agreement is to about 1e-6 relative rather than bit-for-bit.
    bn = {"norm": "batch", "optimizer__lr": 0.01}
    ref = single(cfg(strategy="single", **bn), tmp_path / "single")
    results = run_ranks(cfg(strategy="ddp", sync_batchnorm=True, **bn), tmp_path / "ddp")
    assert max_abs_diff(final_params(results[0]["checkpoint"]), ref) < 1e-5
    # Without sync the per-rank statistics differ and so do the weights (the test can tell).
    plain = run_ranks(cfg(strategy="ddp", **bn), tmp_path / "plain")
    assert max_abs_diff(final_params(plain[0]["checkpoint"]), ref) > 1e-5
