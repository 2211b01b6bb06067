"""A run directory belongs to one run, on the real cluster (issue 29): a second submission
naming a RUNNING or a PENDING job's directory exits 2 in one line and changes none of its
files; once the job is over the directory is free again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import slow_steps

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cifar.yaml"
FILES = ("spec.yaml", "resolved.yaml", "run.json", "sbatch.sh")

pytestmark = pytest.mark.integration


def jobs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def scancel(env: dict[str, str], job_id: str) -> None:
    for cmd in (["scontrol", "update", f"JobId={job_id}", "Requeue=0"], ["scancel", job_id]):
        subprocess.run(cmd, env=env, capture_output=True, timeout=30, check=False)


def state(env: dict[str, str], job_id: str) -> str:
    proc = jobs(env, "status", job_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["tasks"][0]["state"])


def wait_for(env: dict[str, str], job_id: str, wanted: set[str], timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    now = state(env, job_id)
    while now not in wanted and time.monotonic() < deadline:
        time.sleep(2)
        now = state(env, job_id)
    assert now in wanted, f"job {job_id} is {now}, not {wanted}"
    return now


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {n: (run_dir / n).read_bytes() for n in FILES if (run_dir / n).exists()}


def submit(env: dict[str, str], run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The example, tiny, trained in ``run_dir`` (train.run_dir), for as long as it is left."""
    sets = [f"train.run_dir={run_dir}", "train.max_steps=100000", "train.width=8"]
    sets += ["train.data.train_size=512", "train.data.test_size=64", "resources.time=10"]
    # each step sleeps 0.2 s (tests/hooks): running is all it has to do, without taking a core
    return jobs(
        {**env, **slow_steps(0.2)}, "submit", str(EXAMPLE), *(f"--set={s}" for s in sets), *args
    )


def test_a_running_or_pending_jobs_run_dir_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "shared"
    first = submit(env, run_dir)
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    submitted: list[str] = [job_id]
    try:
        wait_for(env, job_id, {"RUNNING"})
        before = snapshot(run_dir)
        assert set(before) == set(FILES)
        for executor in ("slurm", "local"):
            second = submit(env, run_dir, "--set=train.seed=7", "--executor", executor)
            assert second.returncode == 2, second.stderr
            assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
            assert f"job {job_id} is RUNNING" in second.stderr
            assert snapshot(run_dir) == before
        scancel(env, job_id)
        wait_for(env, job_id, {"CANCELLED"})
        # Over: the directory is free; a held job (PENDING) holds it in turn.
        held = submit(env, run_dir, "--set=launch.sbatch_args.hold=true")
        assert held.returncode == 0, held.stderr
        submitted.append(held.stdout.strip())
        wait_for(env, submitted[-1], {"PENDING"})
        again = submit(env, run_dir, "--set=train.seed=7")
        assert again.returncode == 2, again.stderr
        assert f"job {submitted[-1]} is PENDING" in again.stderr
    finally:
        for jid in submitted:
            scancel(env, jid)
