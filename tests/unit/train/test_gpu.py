"""The GPU path: CUDA tensors, bf16 autocast, channels-last, nccl, checkpoints of CUDA state.

These run where torch sees a CUDA device and skip elsewhere with that reason (CI has none; on a
machine with a GPU: ``pytest -m gpu``). What they hold the GPU path to is what the CPU tests hold
the CPU path to:

- the device and backend: the local rank's GPU and nccl;
- a bf16 run on the GPU, stopped through the real stop path and resumed, ends bitwise equal to
  the same run left alone (deterministic algorithms, cuBLAS' fixed workspace), and bf16 is really
  on (its parameters differ from an fp32 run's);
- ``python -m train``'s whole session (RunSession, the checkpoint manager, the resume decision)
  on the GPU: a run and its ``--resume``;
- an nccl process group with the control plane's gloo group beside it, DDP's all-reduce of CUDA
  gradients under bf16 autocast; with two or more GPUs, the trainer's DDP over nccl interrupted
  and resumed bitwise (one GPU holds one nccl rank: NCCL refuses two ranks on one device).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import StopAtStep, free_port, run_ranks

from train.checkpoint import CheckpointManager, verify_checkpoint
from train.env import DistEnv
from train.loop.trainer import run_training
from train.spec.config import TrainConfig
from train.stop.decision import REQUEUE_EXIT_CODE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA device: the GPU path runs on a machine with one (pytest -m gpu)",
    ),
]

REPO = Path(__file__).resolve().parents[3]

# 512 images, batch 64: 8 steps an epoch, 16 in all; BatchNorm and convolutions on cuDNN.
GPU_TRAIN: dict[str, Any] = {
    "model": "tinycnn",
    "width": 8,
    "data": {"kind": "synthetic", "train_size": 512, "test_size": 128},
    "epochs": 2,
    "batch_size": 64,
    "deterministic": True,
    "precision": "bf16",
    "channels_last": True,
    "checkpoint": {"interval_steps": 5, "keep_last": 2},
    "log_interval": 4,
    "optimizer": {"lr": 0.05},
    "stop_check_s": 0.0,
}
TOTAL = 16


def _config(**extra: Any) -> TrainConfig:
    return TrainConfig.model_validate({**GPU_TRAIN, **extra})


def _digest(run_dir: Path) -> tuple[int, str]:
    path = CheckpointManager(run_dir / "checkpoints", rank=1, world_size=2).latest_valid()
    assert path is not None, f"no valid checkpoint in {run_dir}"
    manifest = verify_checkpoint(path)
    return int(manifest["step"]), str(manifest["digest"])


def test_the_device_is_the_local_gpu_and_the_backend_nccl() -> None:
    from train.device import resolve_device

    info = resolve_device(DistEnv.from_env({}), "single", allow_cpu_fallback=False)
    assert info.cuda and info.backend == "nccl"
    assert info.device == torch.device("cuda", 0)


def test_a_bf16_run_on_the_gpu_stopped_and_resumed_is_bitwise_the_run_left_alone(
    tmp_path: Path,
) -> None:
    env = DistEnv.from_env({})
    ref = run_training(_config(), env, tmp_path / "ref")
    assert ref.exit_code == 0 and ref.steps == TOTAL
    fp32 = run_training(_config(precision="fp32"), env, tmp_path / "fp32")
    assert fp32.exit_code == 0
    # bf16 autocast is on: the same run in fp32 ends elsewhere
    assert _digest(tmp_path / "fp32") != _digest(tmp_path / "ref")

    run = tmp_path / "run"
    first = run_training(_config(), env, run, guard=StopAtStep(6))
    assert first.exit_code == REQUEUE_EXIT_CODE and first.steps == 6
    second = run_training(_config(), env, run, guard=StopAtStep(5), resume=True)
    assert second.exit_code == REQUEUE_EXIT_CODE and second.steps == 11
    assert second.resumed_from == run / "checkpoints" / "step-6"
    last = run_training(_config(), env, run, resume=True)
    assert last.exit_code == 0 and last.steps == TOTAL
    assert _digest(run) == _digest(tmp_path / "ref")
    losses = [
        json.loads(line)["loss"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("kind") == "train"
    ]
    assert losses and all(loss == loss and abs(loss) < 1e6 for loss in losses)  # finite


def test_python_dash_m_train_runs_and_resumes_on_the_gpu(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    train = {**GPU_TRAIN, "max_steps": 6, "epochs": 1}
    spec.write_text(yaml.safe_dump({"name": "gpu", "resources": {"nodes": 1}, "train": train}))
    run = tmp_path / "run"
    base = [sys.executable, "-m", "train", "--config", str(spec), "--run-dir", str(run)]
    for argv in (base, [*base, "--set", "train.max_steps=10", "--allow-config-change", "--resume"]):
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "complete", "resume", "complete"]
    assert _digest(run)[0] == 10
    log = (run / "logs" / "rank-0.log").read_text()
    assert " on cuda" in log, log[-2000:]


NCCL_WORKER = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    from torch import nn
    sys.path.insert(0, sys.argv[1])
    from train.runtime import Runtime, _ctrl_group
    from train.env import DistEnv
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0,
                            world_size=1, device_id=dev)
    x = torch.full((4,), 2.0, device=dev)
    dist.all_reduce(x)
    assert x.device.type == "cuda" and x.tolist() == [2.0] * 4
    rt = Runtime(DistEnv.from_env({}), owns_group=True, ctrl_group=_ctrl_group())
    dist.barrier(group=rt.ctrl_group)  # the control plane's gloo group beside nccl
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = ddp(torch.randn(16, 32, device=dev))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.is_cuda and torch.isfinite(g).all() for g in grads)
    rt.close()
    assert not dist.is_initialized()
    print("NCCL-OK", torch.cuda.get_device_name(0), flush=True)
    """
)


def test_an_nccl_group_with_the_gloo_control_group_and_ddp_under_bf16() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NCCL_WORKER, str(REPO), str(free_port())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "NCCL-OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="one GPU holds one nccl rank: DDP over nccl needs two"
)
def test_ddp_over_nccl_stopped_on_one_rank_and_resumed_is_bitwise(tmp_path: Path) -> None:
    cfg = _config(strategy="ddp")
    ref = run_ranks(cfg, tmp_path / "ref")
    assert all(r["exit_code"] == 0 for r in ref)
    stopped = run_ranks(cfg, tmp_path / "run", stop_at=6, stop_rank=1)
    assert {r["steps"] for r in stopped} == {6}
    resumed = run_ranks(cfg, tmp_path / "run", resume=True)
    assert all(r["exit_code"] == 0 and r["steps"] == TOTAL for r in resumed)
    assert _digest(tmp_path / "run") == _digest(tmp_path / "ref")
