"""python -m train on the real local Slurm cluster: 2 nodes x 1 task and 1 node x 2 tasks.

Both layouts train the synthetic CIFAR-shaped data (tiny CNN, 1 thread per rank) well above
chance (10%) on held-out data in well under a minute of CPU. The 1 x 2 job also asks for the
nodes' dummy GPUs (gres without CUDA): with ``allow_cpu_fallback`` train says so in one log line
and trains on CPU; without it, it stops with one error line and exit 2.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

TRAIN = {
    "model": "tinycnn",
    "width": 8,
    "data": {"kind": "synthetic", "train_size": 2048, "test_size": 512},
    "epochs": 3,
    "batch_size": 64,
    "num_threads": 1,
    "log_interval": 8,
    "optimizer": {"lr": 0.05},
    "checkpoint": {"interval_steps": 40, "keep_last": 2},
}


def _submit(
    client: object,
    tmp_path: Path,
    sbatch_args: list[str],
    train: dict,
    extra: str = "",
    *,
    real_gpu_site: bool = False,
) -> tuple[str, Path]:
    """``real_gpu_site``: hide the dev cluster's SLURM_TRAIN_DUMMY_GPUS (set by its TaskProlog)
    from the task, so its gres GPUs look like a real site's with a CPU-only torch."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "it", "resources": {"nodes": 1}, "train": train}))
    run_dir = tmp_path / "run"
    script = tmp_path / "job.sbatch"
    cmd = [sys.executable, "-m", "train", "--config", str(spec), "--run-dir", str(run_dir)]
    if real_gpu_site:
        cmd = ["env", "-u", "SLURM_TRAIN_DUMMY_GPUS", *cmd]
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        f"cd {shlex.quote(str(REPO))}\n"
        f"export PYTHONPATH={shlex.quote(str(REPO))}\n"
        f"srun --kill-on-bad-exit=1 {shlex.join(cmd)} {extra}\n"
    )
    args = ["--time=5", "--job-name=it-train", f"--output={tmp_path}/slurm-%j.out", *sbatch_args]
    job_id = client.submit(script, args=args)  # type: ignore[attr-defined]
    return job_id, run_dir


def _wait(client: object, job_id: str, timeout_s: float = 240.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = client.job_states([job_id]).get(job_id)  # type: ignore[attr-defined]
        if info is not None and info.terminal:
            return info
        time.sleep(2)
    client.cancel([job_id])  # type: ignore[attr-defined]
    pytest.fail(f"job {job_id} did not finish within {timeout_s:.0f} s")


def _log(tmp_path: Path, job_id: str) -> str:
    return (tmp_path / f"slurm-{job_id}.out").read_text(errors="replace")


def _check_trained(tmp_path: Path, job_id: str, run_dir: Path, world: int) -> None:
    out = _log(tmp_path, job_id)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals, out
    assert evals[-1]["test_accuracy"] > 0.5, (evals, out)  # chance is 0.10
    # Written by rank 0 only: one line per log interval, not one per rank.
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert len(steps) == len(set(steps))
    for rank in range(world):
        assert f"[rank {rank}]" in out
    assert f"{world} rank(s)" in out
    events = [json.loads(x)["event"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events == ["start", "complete"]
    assert (run_dir / "checkpoints").is_dir()


def test_two_nodes_one_task_each(slurm_client: object, tmp_path: Path) -> None:
    job_id, run_dir = _submit(slurm_client, tmp_path, ["--nodes=2", "--ntasks-per-node=1"], TRAIN)
    info = _wait(slurm_client, job_id)
    assert info.state == "COMPLETED", _log(tmp_path, job_id)  # type: ignore[attr-defined]
    _check_trained(tmp_path, job_id, run_dir, world=2)
    assert "via n1:" in _log(tmp_path, job_id)  # MASTER_ADDR = first host of the step


@pytest.mark.release_sensitive(
    "the GPU environment of a task (GRES per node; 24.11 changed it per task)"
)
def test_one_node_two_tasks_with_dummy_gpus(slurm_client: object, tmp_path: Path) -> None:
    train = {**TRAIN, "allow_cpu_fallback": True}
    args = ["--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2"]
    job_id, run_dir = _submit(slurm_client, tmp_path, args, train, real_gpu_site=True)
    info = _wait(slurm_client, job_id)
    out = _log(tmp_path, job_id)
    assert info.state == "COMPLETED", out  # type: ignore[attr-defined]
    _check_trained(tmp_path, job_id, run_dir, world=2)
    assert out.count("CUDA is not available") == 1 and "falling back to CPU" in out


def test_dummy_gpus_without_fallback_is_one_error_line(
    slurm_client: object, tmp_path: Path
) -> None:
    args = ["--nodes=1", "--ntasks-per-node=1", "--gres=gpu:1"]
    job_id, _ = _submit(slurm_client, tmp_path, args, TRAIN, real_gpu_site=True)
    info = _wait(slurm_client, job_id)
    out = _log(tmp_path, job_id)
    assert info.state == "FAILED" and info.exit_code == 2, out  # type: ignore[attr-defined]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "train.allow_cpu_fallback: true" in errors[0], out
