"""jobs on the real local Slurm cluster: submit, follow, status, logs, cancel, sweeps, preflight.

Needs ``python -m cluster up`` (the ``slurm_env`` fixture brings it up or skips) and train's
``train.cli.main``. Jobs are kept tiny (a few steps of tinycnn on synthetic data).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cifar.yaml"
SMALL = [
    "--set",
    "train.max_steps=4",
    "--set",
    "train.data.train_size=512",
    "--set",
    "train.data.test_size=64",
    "--set",
    "train.width=8",
    "--set",
    "train.batch_size=32",
    "--set",
    "resources.time=10",
]

pytestmark = pytest.mark.integration


@pytest.fixture
def env(slurm_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    e = dict(slurm_env)
    e["SLURM_TRAIN_STATE_DIR"] = str(tmp_path / "state")
    e["SLURM_TRAIN_RUNS_DIR"] = str(tmp_path / "runs")
    return e


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


def scancel(env: dict[str, str], *job_ids: str) -> None:
    """Cleanup that sticks: train's guard would requeue a job that scancel's SIGTERM reaches."""
    for job_id in job_ids:
        subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "Requeue=0"],
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )
    subprocess.run(["scancel", *job_ids], env=env, capture_output=True, timeout=30, check=False)


def status(env: dict[str, str], run: str) -> dict[str, object]:
    proc = jobs(env, "status", run, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(proc.stdout)
    return data


def wait_state(env: dict[str, str], run: str, wanted: set[str], timeout: float = 300) -> list[str]:
    deadline = time.monotonic() + timeout
    states: list[str] = []
    while time.monotonic() < deadline:
        tasks = status(env, run)["tasks"]
        assert isinstance(tasks, list)
        states = [t["state"] for t in tasks]
        if states and all(s in wanted for s in states):
            return states
        time.sleep(2)
    raise AssertionError(f"{run}: states {states}, wanted {wanted}")


def test_example_follows_to_completed_with_status_and_logs(env: dict[str, str]) -> None:
    proc = jobs(env, "submit", str(EXAMPLE), *SMALL, "--follow", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    job_id = proc.stdout.splitlines()[0].strip()
    assert job_id.isdigit()
    assert "COMPLETED" in proc.stdout
    data = status(env, job_id)
    assert data["job_id"] == job_id
    tasks = data["tasks"]
    assert isinstance(tasks, list) and tasks[0]["state"] == "COMPLETED"
    assert "complete at step 4" in tasks[0]["history"]
    logs0 = jobs(env, "logs", job_id)
    assert logs0.returncode == 0 and logs0.stdout.strip()
    logs1 = jobs(env, "logs", job_id, "--rank", "1")
    assert logs1.returncode == 0 and logs1.stdout.strip()
    assert logs0.stdout != logs1.stdout
    text = jobs(env, "status", job_id)
    assert "COMPLETED" in text.stdout and "nodes n[1-2]" in text.stdout
    listed = jobs(env, "list")
    assert job_id in listed.stdout


def test_cancel_a_running_job(env: dict[str, str]) -> None:
    proc = jobs(env, "submit", str(EXAMPLE), *SMALL, "--set", "train.max_steps=100000")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    try:
        wait_state(env, job_id, {"RUNNING"})
        cancelled = jobs(env, "cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        assert f"cancelled {job_id}" in cancelled.stdout
        assert wait_state(env, job_id, {"CANCELLED"}) == ["CANCELLED"]
        # train's guard sees scancel's SIGTERM and asks for a requeue: it must not bring the
        # job back.
        time.sleep(15)
        assert [t["state"] for t in status(env, job_id)["tasks"]] == ["CANCELLED"]  # type: ignore[union-attr]
        shown = subprocess.run(
            ["scontrol", "show", "job", job_id, "--oneliner"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        assert "Restarts=0" in shown or not shown
    finally:
        scancel(env, job_id)


def test_sweep_of_four_is_one_array_job(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        "name: sweep4\n"
        "resources: {partition: debug, nodes: 1, ntasks_per_node: 1, cpus_per_task: 1, time: 10}\n"
        "train:\n  model: tinycnn\n  width: 8\n  max_steps: 3\n  batch_size: 32\n"
        "  data: {kind: synthetic, train_size: 256, test_size: 32}\n"
        "sweep:\n  max_parallel: 2\n  grid:\n"
        "    train.optimizer.lr: [0.1, 0.05]\n    train.seed: [1, 2]\n"
    )
    proc = jobs(env, "submit", str(spec), "--json", "--follow", timeout=400)
    first = proc.stdout.splitlines()[0]
    sub = json.loads(first)
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        base = sub["job_id"]
        assert sub["job_ids"] == [f"{base}_{i}" for i in range(4)]
        shown = subprocess.run(
            ["scontrol", "show", "job", f"{base}_0", "--oneliner"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert f"ArrayJobId={base}" in shown.stdout or shown.returncode != 0  # may be purged
        data = status(env, sub["run_id"])
        tasks = data["tasks"]
        assert isinstance(tasks, list)
        assert [t["state"] for t in tasks] == ["COMPLETED"] * 4
        assert [t["values"] for t in tasks] == [
            {"train.optimizer.lr": 0.1, "train.seed": 1},
            {"train.optimizer.lr": 0.1, "train.seed": 2},
            {"train.optimizer.lr": 0.05, "train.seed": 1},
            {"train.optimizer.lr": 0.05, "train.seed": 2},
        ]
        run_dir = Path(sub["run_dir"])
        resolved = (run_dir / "tasks" / "2" / "resolved.yaml").read_text()
        assert "lr: 0.05" in resolved and "seed: 1" in resolved
    finally:
        scancel(env, sub["job_id"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "resources.partition=nosuch",
            "--set resources.partition=nosuch: resources.partition: partition 'nosuch' does not "
            "exist on this cluster (available: ",
        ),
        (
            "resources.time=3-00:00:00",
            "--set resources.time=3-00:00:00: resources.time: 3-00:00:00 is over partition debug's "
            "MaxTime ",
        ),
    ],
)
def test_preflight_fails_before_sbatch(
    env: dict[str, str], tmp_path: Path, override: str, expected: str
) -> None:
    proc = jobs(env, "submit", str(EXAMPLE), "--set", override)
    assert proc.returncode == 2
    assert proc.stderr.startswith(expected), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted
    assert jobs(env, "list").stdout == ""


def test_hostile_run_directory_is_quoted_for_sbatch(env: dict[str, str], tmp_path: Path) -> None:
    runs = tmp_path / "runs $(touch CANARY) `touch CANARY` it's"
    proc = jobs(
        env, "submit", str(EXAMPLE), *SMALL, "--runs-dir", str(runs), "--follow", timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not list(tmp_path.rglob("CANARY")) and not (REPO / "CANARY").exists()
    run_dirs = list(runs.iterdir())
    assert len(run_dirs) == 1 and list((run_dirs[0] / "slurm").glob("*_0_log.out"))


def test_local_executor_runs_without_slurm(env: dict[str, str]) -> None:
    proc = jobs(env, "submit", str(EXAMPLE), *SMALL, "--executor", "local", "--follow", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    job_id = proc.stdout.splitlines()[0].strip()
    assert job_id.startswith("local-")
    data = status(env, job_id)
    tasks = data["tasks"]
    assert isinstance(tasks, list) and tasks[0]["state"] == "COMPLETED"
    assert jobs(env, "logs", job_id, "--rank", "1").stdout.strip()


def test_preemption_shows_in_status(env: dict[str, str]) -> None:
    """A higher-priority job preempts ours: train's guard (not submitit's) handles the signal,
    requeues, and `status` reads the history from events.jsonl."""
    proc = jobs(env, "submit", str(EXAMPLE), *SMALL, "--set", "train.max_steps=100000")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    urgent = ""
    try:
        wait_state(env, job_id, {"RUNNING"})
        run_dir = Path(str(status(env, job_id)["run_dir"]))
        deadline = time.monotonic() + 120
        while '"start"' not in _read(run_dir / "events.jsonl"):  # the guard is installed
            assert time.monotonic() < deadline, "training never started"
            time.sleep(1)
        urgent = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-p",
                "urgent",
                "-w",
                "n1",
                "-N1",
                "-c2",
                "--time=1",
                "--output=/dev/null",
                "--wrap",
                "sleep 1",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        deadline = time.monotonic() + 120
        history = ""
        while "preempted 1x" not in history:
            assert time.monotonic() < deadline, f"no preemption recorded: {history!r}"
            time.sleep(2)
            tasks = status(env, job_id)["tasks"]
            assert isinstance(tasks, list)
            history = tasks[0]["history"]
        assert "resumed" not in history  # requeued, waiting (BeginTime), not released here
        log = _read(run_dir / "slurm" / f"{job_id}_0_log.out")
        assert "Job not requeued" not in log  # submitit did not act on the signal
    finally:
        scancel(env, job_id, *([urgent] if urgent else []))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
