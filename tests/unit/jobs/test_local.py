"""--executor local: a detached supervisor runs the ranks with torchrun-style variables."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.monitor import task_states
from jobs.records import find_run

pytestmark = pytest.mark.slow  # each rank imports torch (python -m train)

SPEC = """name: local-demo
resources: {nodes: 1, ntasks_per_node: 2, time: 5}
entrypoint:
  command: [sh, -c, 'echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK via $MASTER_ADDR"; %s']
"""


def _no_client() -> object:
    raise AssertionError("a local run never asks Slurm")


def test_local_run_follows_to_completed_with_per_rank_logs(tmp_path: Path) -> None:
    spec = tmp_path / "local.yaml"
    spec.write_text(SPEC % "true")
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local", "--follow"], out) == 0
    job_id = out.getvalue().splitlines()[0]
    assert job_id.startswith("local-")
    assert f"{job_id}: COMPLETED" in out.getvalue()
    logs = io.StringIO()
    assert main(["logs", job_id, "--rank", "1"], logs) == 0
    assert "rank 1 of 2 local 1 via 127.0.0.1" in logs.getvalue()


def test_local_run_cancel(tmp_path: Path) -> None:
    spec = tmp_path / "local.yaml"
    spec.write_text(SPEC % "sleep 60")
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local"], out) == 0
    job_id = out.getvalue().strip()
    record = find_run(job_id)
    deadline = time.monotonic() + 60
    while task_states(record, _no_client)[job_id].state != "RUNNING":  # type: ignore[arg-type]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelled = io.StringIO()
    assert main(["cancel", job_id], cancelled) == 0
    assert f"cancelled {job_id}" in cancelled.getvalue()
    while task_states(record, _no_client)[job_id].state != "CANCELLED":  # type: ignore[arg-type]
        assert time.monotonic() < deadline
        time.sleep(0.2)
