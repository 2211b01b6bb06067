"""``jobs status`` shows the elapsed time of the whole run, every attempt, not only Slurm's
newest one (issue 29)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from cluster.models import JobInfo
from jobs.cli import main
from jobs.records import RunRecord, TaskRecord, append_index, save_record
from jobs.statusview import attempt_seconds, run_elapsed

# Three attempts: 300 s (5 s of start-up before its start event), 200 s, and the one running.
EVENTS: list[dict[str, Any]] = [
    {"event": "start", "time": 1000.0, "step": 0, "restart_count": 0, "startup": {"import": 5.0}},
    {"event": "checkpoint", "time": 1200.0, "step": 40, "restart_count": 0},
    {"event": "preempted", "time": 1295.0, "step": 50, "restart_count": 0},
    {
        "event": "resume",
        "time": 1500.0,
        "step": 50,
        "restart_count": 1,
        "startup": {"a": 2, "b": 3},
    },
    {"event": "timeout", "time": 1695.0, "step": 90, "restart_count": 1},
    {"event": "resume", "time": 2000.0, "step": 90, "restart_count": 2},
    {"event": "complete", "time": 2080.0, "step": 100, "restart_count": 2},
]


def test_attempt_seconds_from_the_events() -> None:
    assert attempt_seconds(EVENTS) == {0: 300.0, 1: 200.0, 2: 80.0}
    assert attempt_seconds([]) == {}


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        # Slurm's elapsed is its newest attempt's (restart 2): the earlier two are added
        (JobInfo("7", "RUNNING", elapsed_s=100, restarts=2), (600, 3)),
        # no restart count from Slurm (sacct): the newest attempt of the events is Slurm's
        (JobInfo("7", "COMPLETED", elapsed_s=100), (600, 3)),
        # a local run: Slurm says nothing, the events say everything
        (JobInfo("local-1", "COMPLETED", source="local"), (580, 3)),
        # a first attempt: Slurm's own figure
        (JobInfo("7", "RUNNING", elapsed_s=100, restarts=0), (100, 1)),
    ],
)
def test_run_elapsed_adds_the_earlier_attempts(info: JobInfo, expected: tuple[int, int]) -> None:
    assert run_elapsed(info, EVENTS) == expected


def test_an_earlier_run_in_the_same_directory_is_not_counted() -> None:
    earlier = [{"event": "start", "time": 10.0, "restart_count": 0}]
    earlier.append({"event": "complete", "time": 900.0, "restart_count": 0})
    info = JobInfo("8", "RUNNING", elapsed_s=100, restarts=2)
    assert run_elapsed(info, [*earlier, *EVENTS], since=990.0) == (600, 3)
    assert run_elapsed(info, [*earlier, *EVENTS])[0] != 600  # what the filter is for


def test_a_skewed_nodes_events_before_the_submission_are_kept_by_job_id() -> None:
    """A node whose clock is behind the controller's stamps this run's events before its
    submission: they are this run's (its job id), kept as the ledger keeps them; an earlier
    run's events in the same directory (another job id) are still left out."""
    earlier = [{"event": "start", "time": 10.0, "restart_count": 0, "job_id": "3"},
               {"event": "complete", "time": 400.0, "restart_count": 0, "job_id": "3"}]  # fmt: skip
    mine = [{**e, "job_id": "8"} for e in EVENTS]
    info = JobInfo("8", "RUNNING", elapsed_s=100, restarts=2)
    # submitted at 1200 by the controller's clock; the node's clock is 250 s behind
    assert run_elapsed(info, [*earlier, *mine], since=1250.0, job_ids=["8"]) == (600, 3)
    local = [{**e, "submission": "local-5"} for e in EVENTS]
    info = JobInfo("local-5", "COMPLETED", source="local")
    assert run_elapsed(info, [*earlier, *local], since=1250.0, job_ids=["local-5"]) == (580, 3)


def test_status_shows_the_whole_runs_elapsed_time(
    tmp_path: Path, stub_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    squeue = stub_slurm / "squeue"
    squeue.write_text("#!/bin/sh\necho '7|demo|RUNNING|None|n1|debug|1:40|0|2|'\n")
    squeue.chmod(0o755)
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    record = RunRecord(
        "r", "demo", str(run_dir), "slurm", job_id="7", submitted_at=1.0,
        tasks=[TaskRecord(0, str(run_dir))],
    )  # fmt: skip
    save_record(record)
    append_index(record)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS[:-1]))
    out = io.StringIO()
    assert main(["status", "r"], out) == 0
    assert "elapsed 00:10:00 over 3 attempts" in out.getvalue()
    out = io.StringIO()
    assert main(["status", "r", "--json"], out) == 0
    task = json.loads(out.getvalue())["tasks"][0]
    assert (task["elapsed_s"], task["run_elapsed_s"], task["attempts"]) == (100, 600, 3)
