"""A sweep bigger than the cluster's MaxArraySize, on the real local cluster (issue 18).

The local cluster's MaxArraySize is 1001: 1500 points become two arrays (1001 + 499), the second
waiting on the first (``afterany``), both throttled to ``max_parallel``; ONE run that ``status``
shows as 1500 tasks and ``cancel`` removes whole. The tasks are submitted held
(``launch.sbatch_args: {hold: true}``) so nothing of the 1500 ever runs on the shared machine;
one tiny job runs to COMPLETED to show the sbatch path (no submitit executor) still starts tasks.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.client import SlurmClient
from cluster.models import ClusterLimits

REPO = Path(__file__).resolve().parents[2]
POINTS = 1500

pytestmark = pytest.mark.integration


def jobs(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _spec(tmp_path: Path, points: int, *, hold: bool) -> Path:
    values = ", ".join(str(i) for i in range(points))
    path = tmp_path / "big.yaml"
    path.write_text(
        "name: big-sweep\n"
        "resources: {partition: debug, nodes: 1, ntasks_per_node: 1, cpus_per_task: 1, time: 5}\n"
        'entrypoint: {command: ["true"]}\n'
        + ("launch: {sbatch_args: {hold: true}}\n" if hold else "")
        + f"sweep:\n  max_parallel: 2\n  grid:\n    requeue.max_failures: [{values}]\n"
    )
    return path


@pytest.fixture
def submitted(env: dict[str, str], tmp_path: Path, slurm_client: SlurmClient) -> Iterator[dict]:
    """The 1500-point sweep, submitted held; whatever is left of it is cancelled afterwards."""
    proc = jobs(env, "submit", str(_spec(tmp_path, POINTS, hold=True)), "--json")
    assert proc.returncode == 0, proc.stderr
    sub = json.loads(proc.stdout)
    record = json.loads((Path(sub["run_dir"]) / "run.json").read_text())
    yield {**sub, "record": record}
    leftover = record.get("array_job_ids") or [sub["job_id"]]
    slurm_client.cancel(list(reversed(leftover)), no_requeue=True)


@pytest.mark.release_sensitive("array job ids and task states in squeue and sacct")
def test_big_sweep_is_split_shown_and_cancelled_as_one_run(
    env: dict[str, str], submitted: dict, slurm_client: SlurmClient
) -> None:
    limit = slurm_client.limits().max_array_size
    assert limit < POINTS, "the local cluster's MaxArraySize is 1001"
    record = submitted["record"]
    arrays = record["array_job_ids"]
    assert len(arrays) == -(-POINTS // limit) == 2 and record["array_chunk"] == limit
    ids = submitted["job_ids"]
    assert len(ids) == POINTS and len(set(ids)) == POINTS
    assert ids[limit - 1] == f"{arrays[0]}_{limit - 1}" and ids[limit] == f"{arrays[1]}_0"

    # What Slurm holds: each array within MaxArraySize, throttled, the second after the first.
    first, second = (slurm_client.show_job(a) for a in arrays)
    assert first["ArrayTaskThrottle"] == second["ArrayTaskThrottle"] == "2"
    assert first["ArrayTaskId"] == f"0-{limit - 1}%2"
    assert second["ArrayTaskId"] == f"0-{POINTS - limit - 1}%2"
    assert second["Dependency"].startswith(f"afterany:{arrays[0]}")

    # status: one run, all 1500 tasks, found by its run id and by either array's task id.
    for query in (submitted["run_id"], f"{arrays[1]}_7", arrays[0]):
        proc = jobs(env, "status", query, "--json")
        assert proc.returncode == 0, proc.stderr
        status = json.loads(proc.stdout)
        assert status["run_id"] == submitted["run_id"]
        assert len(status["tasks"]) == POINTS
        assert {t["state"] for t in status["tasks"]} == {"PENDING"}

    proc = jobs(env, "cancel", submitted["run_id"])
    assert proc.returncode == 0, proc.stderr
    assert all(a in proc.stdout for a in arrays)
    # All array jobs gone from the controller's queue (squeue lists only live jobs).
    left = [j for j, info in slurm_client.queue().items() if info.array_job_id in arrays]
    assert left == []
    final = slurm_client.job_states(arrays)
    assert final and all(info.state == "CANCELLED" for info in final.values())


def test_a_sweep_the_cluster_cannot_hold_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    """Preflight refuses, with one line and before sbatch, what the cluster cannot hold (here
    limits cached for this slurm.conf as MaxArraySize 10, MaxJobCount 100: 150 arrays needed)."""
    state = Path(env["SLURM_TRAIN_STATE_DIR"])
    state.mkdir(parents=True)
    stamp = SlurmClient(environ=env).conf_stamp()
    # every field a deciding read needs (an entry missing one is asked again: jobs/preflight.py)
    limits = ClusterLimits(max_array_size=10, max_job_count=100)
    cached = {"stamp": stamp, "at": 0, **dataclasses.asdict(limits)}
    (state / "cluster-limits.json").write_text(json.dumps(cached))
    proc = jobs(env, "submit", str(_spec(tmp_path, POINTS, hold=True)))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "1500 points need 150 arrays of at most 10" in proc.stderr
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # refused before anything was made


def test_one_tiny_job_runs_to_completion(tmp_path: Path, env: dict[str, str]) -> None:
    spec = tmp_path / "one.yaml"
    spec.write_text(
        "name: one\nresources: {partition: debug, nodes: 1, ntasks_per_node: 1, time: 5}\n"
        'entrypoint: {command: ["true"]}\n'
    )
    proc = jobs(env, "submit", str(spec), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPLETED" in proc.stdout
