"""follow/status/cancel logic against a scripted fake SlurmClient (no Slurm needed)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cluster.models import JobInfo
from jobs.monitor import cancel, follow, states_many
from jobs.records import RunRecord, TaskRecord


class ScriptedClient:
    """Answers job_states from a script of snapshots; appends log lines as time passes."""

    def __init__(self, snapshots: list[dict[str, str]], log: Path, lines: list[str]) -> None:
        self.snapshots = snapshots
        self.calls: list[list[str]] = []
        self.log = log
        self.lines = lines
        self.cancelled: list[str] = []
        self.commands: list[list[str]] = []

    def job_states(self, ids: list[str]) -> dict[str, JobInfo]:
        self.calls.append(list(ids))
        n = len(self.calls) - 1
        snap = self.snapshots[min(n, len(self.snapshots) - 1)]
        if n < len(self.lines):
            with self.log.open("a") as f:
                f.write(self.lines[n] + "\n")
        return {k: JobInfo(k, v) for k, v in snap.items()}

    def cancel(self, ids: list[str], *, no_requeue: bool = False) -> None:
        # What SlurmClient.cancel(no_requeue=True) runs first (tests/unit/cluster/test_client.py)
        if no_requeue:
            self.commands += [["scontrol", "update", f"JobId={i}", "Requeue=0"] for i in ids]
        self.cancelled.extend(ids)


def _record(tmp_path: Path, array: int | None = None) -> RunRecord:
    n = array or 1
    tasks = [TaskRecord(i, str(tmp_path / f"t{i}"), {}) for i in range(n)]
    return RunRecord("r-1", "r", str(tmp_path), "slurm", job_id="7", array_size=array, tasks=tasks)


def test_follow_streams_states_logs_events_and_exits_0_on_completed(tmp_path: Path) -> None:
    rec = _record(tmp_path)
    (tmp_path / "slurm").mkdir()
    Path(rec.tasks[0].run_dir).mkdir()
    (Path(rec.tasks[0].run_dir) / "events.jsonl").write_text(json.dumps({"event": "start"}) + "\n")
    snaps = [{"7": "PENDING"}, {"7": "RUNNING"}, {"7": "RUNNING"}, {"7": "COMPLETED"}]
    client = ScriptedClient(snaps, rec.log_file("7", 0), ["", "step 1", "step 2", "done"])
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.01) == 0  # type: ignore[arg-type,return-value]
    text = out.getvalue()
    assert "7: PENDING" in text and "7: RUNNING" in text and "7: COMPLETED" in text
    assert text.index("step 1") < text.index("step 2") < text.index("done")
    assert 'event: {"event": "start"}' in text
    assert all(call == ["7"] for call in client.calls)  # one id per poll: one sacct call


def test_follow_exits_1_unless_every_task_completed(tmp_path: Path) -> None:
    rec = _record(tmp_path, array=2)
    snaps = [{"7_0": "RUNNING", "7_1": "RUNNING"}, {"7_0": "COMPLETED", "7_1": "FAILED"}]
    client = ScriptedClient(snaps, tmp_path / "unused.log", [])
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.01) == 1  # type: ignore[arg-type,return-value]
    assert "7_1: FAILED" in out.getvalue()


def test_follow_gives_up_on_a_job_slurm_forgot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobs.monitor.UNKNOWN_GIVE_UP_S", 0.05)
    rec = _record(tmp_path)
    client = ScriptedClient([{}], tmp_path / "x.log", [])
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.01) == 1  # type: ignore[arg-type,return-value]
    assert "Slurm does not know 7" in out.getvalue()


def test_states_many_is_one_query_for_many_runs(tmp_path: Path) -> None:
    a = _record(tmp_path)
    b = RunRecord(
        "r-2",
        "r",
        str(tmp_path),
        "slurm",
        job_id="9",
        array_size=3,
        tasks=[TaskRecord(i, str(tmp_path), {}) for i in range(3)],
    )
    snap = {"7": "COMPLETED", "9_0": "RUNNING", "9_1": "PENDING"}
    client = ScriptedClient([snap], tmp_path / "x.log", [])
    states = states_many([a, b], lambda: client)  # type: ignore[arg-type,return-value]
    assert client.calls == [["7", "9"]]
    assert {k: v.state for k, v in states.items()} == {
        "7": "COMPLETED",
        "9_0": "RUNNING",
        "9_1": "PENDING",
        "9_2": "UNKNOWN",
    }


def test_cancel_makes_the_job_non_requeueable_first(tmp_path: Path) -> None:
    rec = _record(tmp_path, array=3)
    client = ScriptedClient([{}], tmp_path / "x.log", [])
    assert cancel(rec, lambda: client) == ["7"]  # type: ignore[arg-type,return-value]
    assert client.commands == [["scontrol", "update", "JobId=7", "Requeue=0"]]
    assert client.cancelled == ["7"]
    client = ScriptedClient([{}], tmp_path / "x.log", [])
    assert cancel(rec, lambda: client, "7_2") == ["7_2"]  # type: ignore[arg-type,return-value]
    assert client.commands == [["scontrol", "update", "JobId=7_2", "Requeue=0"]]
