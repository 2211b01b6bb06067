"""Recover in place on the real local cluster (issue 26): a crash costs a new step in the same
allocation, not a trip through the queue; failures are sorted by cause.

- ``kill -9`` of rank 1 of a 2-node DDP run (the CIFAR example): the job restarts its step in
  place from the last valid checkpoint, under the same job id, never PENDING (no requeue, no
  BeginTime hold), and ends COMPLETED with exactly the parameters of the same run left alone.
- A command that fails with an ImportError fails once, with its cause on one line: not retried.
- A real gloo collective time-out (rank 1 late to the first all-reduce of a plain DDP script)
  is an infrastructure failure: restarted in place, and the run completes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from byo_helpers import ByoRun, environ, open_run
from test_cluster_hang import _submit, _wait

from cluster.client import SlurmClient
from train.history import RunHistory

pytestmark = pytest.mark.integration


def _rank_pid(job: str, rank: int) -> int | None:
    """The training process of ``rank`` of ``job`` (its environment says so: every node of the
    local cluster is this host), not its hang watcher."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = environ(int(entry.name))
        if env.get("SLURM_JOB_ID") != job or env.get("SLURM_PROCID") != str(rank):
            continue
        with contextlib.suppress(OSError):
            cmd = (entry / "cmdline").read_bytes()
            if b"submitit.core._submit" in cmd:
                return int(entry.name)
    return None


def _digest(run_dir: Path) -> str:
    import json

    steps = sorted(
        (p for p in (run_dir / "checkpoints").glob("step-*") if p.name[5:].isdigit()),
        key=lambda p: int(p.name[5:]),
    )
    return str(json.loads((steps[-1] / "manifest.json").read_text())["digest"])


@pytest.mark.long(85)
def test_a_killed_rank_restarts_in_place_same_job_never_pending_and_exact(
    env: dict[str, str], slurm_client: SlurmClient
) -> None:
    job, run_dir = _submit(env, name="inplace-it")
    ref_job, ref_dir = _submit(env, name="inplace-ref")
    states: set[str] = set()
    try:
        _wait(lambda: (run_dir / "checkpoints" / "step-20").is_dir(), 300, "a checkpoint")
        pid = _wait(lambda: _rank_pid(job, 1), 30, "rank 1's process")
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            state = slurm_client.show_job(job).get("JobState", "")
            states.add(state)
            if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
                break
            time.sleep(0.5)
        ref = slurm_client.wait_for(ref_job, timeout=400)
    finally:
        for j in (job, ref_job):
            if slurm_client.show_job(j).get("JobState") not in {"COMPLETED", "FAILED"}:
                slurm_client.cancel([j], no_requeue=True)
    events = RunHistory(run_dir).events()
    names = [e["event"] for e in events]
    assert slurm_client.show_job(job).get("JobState") == "COMPLETED", (states, names)
    assert ref.state == "COMPLETED", ref
    assert "PENDING" not in states and "REQUEUED" not in states, states
    assert slurm_client.show_job(job).get("Restarts") == "0"  # never through the queue
    assert "requeue" not in names and "preempted" not in names, names
    restart = next(e for e in events if e["event"] == "restart_in_place")
    assert restart["time"] > killed_at and restart["job_id"] == job, restart
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["failure_class"] == "infra", failure  # a rank killed from outside
    resumed = [e for e in events if e["event"] == "resume" and e.get("in_place") == 1]
    assert resumed, names
    assert names[-1] == "complete", names
    assert "restarted in place 1x" in RunHistory(run_dir).summary()
    assert _digest(run_dir) == _digest(ref_dir)  # bitwise the undisturbed run's parameters


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


def _command_spec(name: str, argv: list[str], nodes: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {"partition": "debug", "nodes": nodes, "cpus_per_task": 1, "time": "00:10:00"},
        "environment": {"variables": {"OMP_NUM_THREADS": "1"}},
        "entrypoint": {"command": argv},
    }


def test_an_import_error_fails_once_with_its_cause(run: ByoRun) -> None:
    run.submit(_command_spec("inplace-import", ["python", "-c", "import no_such_module_26"]))
    assert run.wait_final(timeout=180) == "FAILED"
    names = [e["event"] for e in run.events()]
    assert names.count("failure") == 1, names
    assert "restart_in_place" not in names and "requeue" not in names, names
    failure = next(e for e in run.events() if e["event"] == "failure")
    assert failure["failure_class"] == "user", failure
    stopped = next(e for e in run.events() if e["event"] == "budget_exhausted")
    assert stopped["reason"].startswith("not retried: an error in the code"), stopped
    status = run.status()
    assert "no_such_module_26" in str(status), status


TIMEOUT_SCRIPT = """\
import datetime, os, sys, time
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
if rank == 1 and os.environ.get("SLURM_TRAIN_IN_PLACE") == "0":
    time.sleep(60)  # late to the first collective: rank 0's all_reduce times out (gloo)
x = torch.ones(1)
dist.all_reduce(x)
print("all-reduce ok", x.item(), flush=True)
dist.destroy_process_group()
"""


def test_a_collective_time_out_is_retried_in_place(run: ByoRun) -> None:
    script = run.tmp / "late_rank.py"
    script.write_text(TIMEOUT_SCRIPT)
    run.submit(_command_spec("inplace-gloo", ["python", str(script)], nodes=2))
    assert run.wait_final(timeout=300) == "COMPLETED", run.log()
    events = run.events()
    names = [e["event"] for e in events]
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["failure_class"] == "infra", failure
    assert "restart_in_place" in names and "requeue" not in names, names
    assert run.client.show_job(run.job_id).get("Restarts") == "0"
    assert names[-1] == "complete", names
