"""DistEnv.from_env table tests: Slurm, torchrun, single, and inconsistent values."""

from __future__ import annotations

import logging
import socket

import pytest
import torch

from train.device import resolve_device
from train.env import DistEnv, master_port_for_job, verify_master_port
from train.errors import DeviceError, EnvError

# What srun exported to the tasks of `sbatch -N2 --ntasks-per-node=1 --gres=gpu:2` on the local
# cluster (recorded; batch-level variables are inherited, SLURM_STEP_* are the step's).
SLURM_2x1 = {
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
}
SLURM_1x2 = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "1",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_STEP_NODELIST": "gpu-a07",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURM_RESTART_COUNT": "3",
    "SLURM_CPUS_PER_TASK": "4",
}
TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_RUN_ID": "none",
}
# What a shell that ran a single-process job before exports: must not leak into srun tasks.
STALE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            SLURM_2x1,
            dict(
                rank=1,
                local_rank=0,
                world_size=2,
                local_world_size=1,
                node_rank=1,
                num_nodes=2,
                master_addr="n1",
                master_port=21234,
                job_id="1234",
                restart_count=0,
                launcher="slurm",
            ),
        ),
        (
            SLURM_1x2,
            dict(
                rank=1,
                local_rank=1,
                world_size=2,
                local_world_size=2,
                node_rank=0,
                num_nodes=1,
                master_addr="gpu-a07",
                master_port=20077,
                restart_count=3,
                gpus_on_node=2,
                cpus_per_task=4,
                launcher="slurm",
            ),
        ),
        (
            TORCHRUN,
            dict(
                rank=3,
                local_rank=1,
                world_size=4,
                local_world_size=2,
                node_rank=1,
                num_nodes=2,
                master_addr="10.0.0.5",
                master_port=29400,
                restart_count=2,
                launcher="torchrun",
            ),
        ),
        (
            {**SLURM_2x1, **TORCHRUN},  # srun torchrun ...: torchrun's numbering, Slurm's job
            dict(rank=3, world_size=4, launcher="torchrun", job_id="1234"),
        ),
        (
            # srun python -m train from a shell with stale torchrun variables: Slurm's win.
            {**SLURM_2x1, **STALE},
            dict(rank=1, world_size=2, launcher="slurm", master_addr="n1"),
        ),
        ({}, dict(rank=0, world_size=1, launcher="single", master_addr="127.0.0.1")),
        (
            # The batch shell of a one-task job (no srun): a single process that knows its job.
            {
                "SLURM_JOB_ID": "9",
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "1",
                "SLURM_RESTART_COUNT": "1",
            },
            dict(rank=0, world_size=1, launcher="single", job_id="9", restart_count=1),
        ),
    ],
)
def test_from_env(environ: dict[str, str], expected: dict[str, object]) -> None:
    env = DistEnv.from_env(environ)
    for key, value in expected.items():
        assert getattr(env, key) == value, key
    assert env.is_main == (env.rank == 0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # --ntasks=3 with --nodes=2 --ntasks-per-node=2
        ({"SLURM_NTASKS": "3", "SLURM_NTASKS_PER_NODE": "2"}, r"--ntasks-per-node=2"),
        # the node list and the node count disagree
        ({"SLURM_STEP_NUM_NODES": "3", "SLURM_NNODES": "3"}, r"--nodes"),
        # 2 tasks per node but only 1 GPU per node
        (
            {
                "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                "SLURM_STEP_NUM_TASKS": "4",
                "SLURM_NTASKS": "4",
                "SLURM_NTASKS_PER_NODE": "2",
                "SLURM_GPUS_ON_NODE": "1",
                "SLURM_PROCID": "3",
                "SLURM_LOCALID": "1",
            },
            r"set --ntasks-per-node=1 \(one task per GPU\) or --gpus-per-node=2",
        ),
        # 2 tasks per node sharing 4 GPUs
        (
            {
                "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                "SLURM_STEP_NUM_TASKS": "4",
                "SLURM_NTASKS": "4",
                "SLURM_NTASKS_PER_NODE": "2",
                "SLURM_GPUS_PER_NODE": "gpu:4",
            },
            r"--ntasks-per-node=4",
        ),
        # 4 tasks per node that all see the same 2 GPUs
        (
            {
                "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                "SLURM_STEP_NUM_TASKS": "8",
                "SLURM_NTASKS": "8",
                "SLURM_NTASKS_PER_NODE": "4",
                "CUDA_VISIBLE_DEVICES": "0,1",
            },
            r"CUDA_VISIBLE_DEVICES lists 2 GPU\(s\): set --ntasks-per-node=2",
        ),
        # local id outside the tasks of this node
        ({"SLURM_LOCALID": "1"}, r"local rank 1 .* --ntasks-per-node"),
        ({"SLURM_PROCID": "x"}, r"SLURM_PROCID='x' is not an integer"),
    ],
)
def test_inconsistent_slurm_values_name_the_sbatch_option(
    changes: dict[str, str], message: str
) -> None:
    with pytest.raises(EnvError, match=message):
        DistEnv.from_env({**SLURM_2x1, **changes})


def test_multi_task_batch_shell_without_srun_is_an_error() -> None:
    environ = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    with pytest.raises(EnvError, match="srun python -m train"):
        DistEnv.from_env(environ)


def test_strategy_layout_checks() -> None:
    one_task_two_gpus = DistEnv(gpus_on_node=2)
    with pytest.raises(EnvError, match=r"--ntasks-per-node=2 .*strategy: dp"):
        one_task_two_gpus.check_strategy("ddp")
    one_task_two_gpus.check_strategy("dp")
    with pytest.raises(EnvError, match="--nodes=1 --ntasks-per-node=1"):
        DistEnv.from_env(SLURM_2x1).check_strategy("pipeline")


def test_export_sets_torchrun_variables() -> None:
    env = DistEnv.from_env(SLURM_2x1)
    out: dict[str, str] = {}
    env.export(out)
    assert out["RANK"] == "1" and out["WORLD_SIZE"] == "2" and out["LOCAL_RANK"] == "0"
    assert out["MASTER_ADDR"] == "n1" and out["MASTER_PORT"] == "21234"
    assert DistEnv.from_env(out).rank == 1  # the exported view reads back the same


def test_master_port_is_deterministic_and_below_ephemeral_range() -> None:
    ports = {master_port_for_job(str(j)) for j in range(100_000, 100_050)}
    assert len(ports) == 50
    assert all(20000 <= p < 32768 for p in ports)
    assert master_port_for_job(None) == 29500
    # an explicit MASTER_PORT wins
    assert DistEnv.from_env({**SLURM_2x1, "MASTER_PORT": "4242"}).master_port == 4242


def test_busy_master_port_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        env = DistEnv(
            rank=0, world_size=2, local_world_size=2, master_port=port, job_id="7", launcher="slurm"
        )
        with pytest.raises(EnvError, match=rf"MASTER_PORT {port} .* already in use"):
            verify_master_port(env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")
def test_gpus_without_cuda(caplog: pytest.LogCaptureFixture) -> None:
    env = DistEnv.from_env({**SLURM_1x2, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    with pytest.raises(DeviceError, match=r"train\.allow_cpu_fallback: true"):
        resolve_device(env, "ddp", allow_cpu_fallback=False)
    with caplog.at_level(logging.WARNING):
        info = resolve_device(env, "ddp", allow_cpu_fallback=True)
    assert info.device == torch.device("cpu") and info.backend == "gloo"
    lines = [r for r in caplog.records if "CUDA is not available" in r.getMessage()]
    assert len(lines) == 1 and "falling back to CPU" in lines[0].getMessage()


def test_cpu_devices_for_every_strategy() -> None:
    for strategy in ("ddp", "dp", "pipeline", "single"):
        info = resolve_device(DistEnv(), strategy, allow_cpu_fallback=False)
        if not torch.cuda.is_available():
            assert info.devices == (torch.device("cpu"),) and info.backend == "gloo"


def test_one_visible_gpu_per_task_is_fine() -> None:
    # --gpus-per-task=1 / gpu binding: each task sees exactly its own GPU as device 0.
    environ = {**SLURM_1x2, "CUDA_VISIBLE_DEVICES": "1"}
    del environ["SLURM_GPUS_ON_NODE"]
    env = DistEnv.from_env(environ)
    assert env.visible_devices == ("1",) and env.local_world_size == 2


def test_node_name_is_the_slurm_node_not_the_host() -> None:
    """The hang watchdog names the node a rank ran on; the dev cluster's nodes share one host."""
    assert DistEnv.from_env(SLURM_2x1).node_name == "n2"
    assert DistEnv.from_env(SLURM_1x2).node_name == "gpu-a07"
    assert DistEnv.from_env(TORCHRUN).node_name is None
