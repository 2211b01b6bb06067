"""The local dev cluster's dummy GPUs (issue 19): CPU there, the clear refusal elsewhere.

The cluster's task prolog exports ``SLURM_TRAIN_DUMMY_GPUS=1`` into every task (its integration
test checks that); here: what ``train`` makes of it.
"""

from __future__ import annotations

import logging

import pytest
import torch

from cluster.local.config import DUMMY_GPUS_ENV as CLUSTER_EXPORTS
from train.device import resolve_device
from train.env import DUMMY_GPUS_ENV, DistEnv
from train.errors import DeviceError

# Rank 0 of a 2-node job with 2 (dummy) GPUs per node, as Slurm sets it on the local cluster.
SLURM_2x2 = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_GPUS_ON_NODE": "2",
}


def test_the_cluster_and_train_agree_on_the_name() -> None:
    assert CLUSTER_EXPORTS == DUMMY_GPUS_ENV


@pytest.mark.parametrize(
    ("value", "dummy"),
    [("1", True), (" 1\n", True), ("0", False), ("", False), ("yes", False), (None, False)],
)
def test_marker_is_read_once_into_distenv(value: str | None, dummy: bool) -> None:
    environ = dict(SLURM_2x2)
    if value is not None:
        environ[DUMMY_GPUS_ENV] = value
    assert DistEnv.from_env(environ).dummy_gpus is dummy


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA paths")
def test_dummy_gpus_train_on_cpu_with_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    env = DistEnv.from_env({**SLURM_2x2, DUMMY_GPUS_ENV: "1"})
    with caplog.at_level(logging.INFO):
        info = resolve_device(env, "ddp", allow_cpu_fallback=False)
    assert info.device == torch.device("cpu") and info.backend == "gloo"
    lines = [r for r in caplog.records if "CUDA is not available" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "dev cluster" in lines[0].getMessage()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA paths")
def test_a_real_gpu_cluster_keeps_the_refusal() -> None:
    env = DistEnv.from_env(SLURM_2x2)
    with pytest.raises(DeviceError, match=r"train\.allow_cpu_fallback: true"):
        resolve_device(env, "ddp", allow_cpu_fallback=False)
