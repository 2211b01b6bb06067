"""Cached job states belong to a cluster and a submission, never to a bare job id (issue 29).

Slurm is played by a client that answers from a table (recorded states, the way
``SlurmClient.poll_states`` returns them); the real cluster's reused id cannot be made without
rebuilding it, so these are unit tests on recorded answers.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cluster.models import JobInfo
from jobs.errors import UsageError
from jobs.follow import follow
from jobs.monitor import cancel, states_many
from jobs.records import RunRecord, TaskRecord


class Slurm:
    """One cluster: its name and what its controller and accounting say about each id now."""

    def __init__(self, name: str, jobs: dict[str, JobInfo]) -> None:
        self.name, self.jobs = name, jobs
        self.calls: list[list[str]] = []
        self.cancelled: list[str] = []

    def cluster_name(self) -> str:
        return self.name

    def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
        self.calls.append(list(ids))
        return {k: v for k, v in self.jobs.items() if k in ids}

    def cancel(self, ids: list[str], *, no_requeue: bool = False) -> None:
        self.cancelled.extend(ids)


def _run(
    tmp_path: Path, run_id: str, job_id: str, cluster: str = "c1", name: str = "demo"
) -> RunRecord:
    run_dir = tmp_path / run_id
    (run_dir / "slurm").mkdir(parents=True)
    return RunRecord(
        run_id,
        name,
        str(run_dir),
        "slurm",
        job_id=job_id,
        tasks=[TaskRecord(0, str(run_dir))],
        cluster=cluster,
    )


def _done(job_id: str, name: str = "demo") -> JobInfo:
    return JobInfo(job_id, "COMPLETED", exit_code=0, partition="debug", name=name, source="sacct")


def _running(job_id: str, name: str = "demo") -> JobInfo:
    return JobInfo(job_id, "RUNNING", partition="debug", name=name, source="squeue")


def test_a_new_job_with_an_old_id_is_asked_about_not_shown_as_the_old_one(tmp_path: Path) -> None:
    """A rebuilt cluster or ids wrapping around: the same cluster name, the same id, a new job."""
    old = _run(tmp_path, "old-run", "42")
    first = Slurm("c1", {"42": _done("42")})
    assert states_many([old], lambda: first)["42"].state == "COMPLETED"  # type: ignore[arg-type,return-value]
    assert states_many([old], lambda: first, ttl_s=0)["42"].state == "COMPLETED"  # type: ignore[arg-type,return-value]
    assert len(first.calls) == 1  # final for that submission: never asked again
    # A new submission gets id 42 again and runs; the cache must not answer for it.
    new = _run(tmp_path, "new-run", "42")
    now = Slurm("c1", {"42": _running("42")})
    assert states_many([new], lambda: now)["42"].state == "RUNNING"  # type: ignore[arg-type,return-value]
    assert now.calls == [["42"]]
    # cancel acts on the real job and --follow does not end at once with COMPLETED
    assert cancel(new, lambda: now) == ["42"]  # type: ignore[arg-type,return-value]
    assert now.cancelled == ["42"]
    now.jobs["42"] = JobInfo("42", "FAILED", exit_code=1, partition="debug", name="demo")
    out = io.StringIO()
    code = follow(new, lambda: now, out=out, poll_s=0.001, min_poll_s=0.001)  # type: ignore[arg-type,return-value]
    assert code == 1 and "job 42: FAILED" in out.getvalue()


def test_a_run_of_another_cluster_is_unknown_here_and_never_cancelled(tmp_path: Path) -> None:
    theirs = _run(tmp_path, "theirs", "42", cluster="c2")
    here = Slurm("c1", {"42": _running("42")})  # some job 42 of c1 runs
    info = states_many([theirs], lambda: here)["42"]  # type: ignore[arg-type,return-value]
    assert info.state == "UNKNOWN" and "cluster c2" in info.reason
    assert here.calls == []  # not asked: c1's 42 is not the run's job
    with pytest.raises(UsageError, match=r"^cancel: theirs: .*cluster c2"):
        cancel(theirs, lambda: here)  # type: ignore[arg-type,return-value]
    assert here.cancelled == []


def test_an_old_run_whose_id_now_names_another_job_is_not_shown_as_that_job(
    tmp_path: Path,
) -> None:
    old = _run(tmp_path, "old", "42", name="demo")
    slurm = Slurm("c1", {"42": _running("42", name="someone-elses")})
    info = states_many([old], lambda: slurm)["42"]  # type: ignore[arg-type,return-value]
    assert info.state == "UNKNOWN" and "another job" in info.reason
    assert cancel(old, lambda: slurm) == [] and slurm.cancelled == []  # type: ignore[arg-type,return-value]


def test_one_query_for_runs_of_two_submissions_sharing_an_id(tmp_path: Path) -> None:
    a, b = _run(tmp_path, "a", "42"), _run(tmp_path, "b", "43")
    slurm = Slurm("c1", {"42": _done("42"), "43": _running("43")})
    states = states_many([a, b], lambda: slurm)  # type: ignore[arg-type,return-value]
    assert [states["42"].state, states["43"].state] == ["COMPLETED", "RUNNING"]
    assert slurm.calls == [["42", "43"]]


def test_an_older_cache_layout_is_not_trusted(tmp_path: Path) -> None:
    from jobs.statecache import cache_path

    cache_path().parent.mkdir(parents=True, exist_ok=True)
    # What the cache held before: a final state under the bare id 42.
    final = {"42": {"job_id": "42", "state": "COMPLETED", "partition": "debug"}}
    cache_path().write_text(json.dumps({"recent": {}, "final": final}))
    run = _run(tmp_path, "r", "42")
    slurm = Slurm("c1", {"42": _running("42")})
    assert states_many([run], lambda: slurm)["42"].state == "RUNNING"  # type: ignore[arg-type,return-value]
