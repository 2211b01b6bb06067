"""Issue 46: the requeue hold as users meet it, in ``jobs status`` (from the one squeue)."""

from __future__ import annotations

import time

from cluster import parse
from cluster.models import JobInfo
from jobs.statusview import held


def test_squeue_start_time_of_a_held_job() -> None:
    # recorded on the local 22.05 cluster: a pending job held until its begin time
    line = "7007|wrap|PENDING|BeginTime||debug|0:00|0|1|2026-11-27T20:34:29|\n"
    info = parse.parse_squeue(line)["7007"]
    at = time.mktime(time.strptime("2026-11-27T20:34:29", "%Y-%m-%dT%H:%M:%S"))
    assert info.start_at == at and info.restarts == 1
    # a running job's StartTime is when it started, not a hold; older recordings lack it
    running = parse.parse_squeue("8|wrap|RUNNING|None|n1|debug|0:03|0|0|2026-11-27T20:30:00|\n")
    assert running["8"].start_at is None
    assert parse.parse_squeue("40|wrap|PENDING|BeginTime||debug|0:00|0|2|\n")["40"].start_at is None


def test_status_says_a_requeued_job_is_held_until_when() -> None:
    at = time.mktime(time.strptime("2026-11-27T20:34:29", "%Y-%m-%dT%H:%M:%S"))
    info = JobInfo("7", "PENDING", reason="BeginTime", restarts=1, start_at=at)
    assert held(info, now=at - 130) == (
        "held by Slurm until 20:34:29 (BeginTime: requeue hold), about 130 s"
    )
    assert held(JobInfo("7", "PENDING", reason="Priority", restarts=1, start_at=at)) == ""
    assert held(JobInfo("7", "RUNNING", restarts=1)) == ""
