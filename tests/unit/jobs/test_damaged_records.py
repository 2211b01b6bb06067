"""Damaged but valid JSON in every record a run leaves, fed to every command that reads it
(issue 29): the record is skipped and reported in ONE line naming the file, the command exits as
it would without it, never with a traceback, and one bad run never hides another.

Slurm is stub squeue/sacct commands answering COMPLETED (a follower ends at its first poll).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

import train.schema
from jobs.cli import main
from jobs.drill import Drill
from jobs.records import RunRecord, TaskRecord, append_index, save_record

SQUEUE = """#!/bin/sh
exit 0
"""
SACCT = """#!/bin/sh
for id in 101 102; do echo "$id|demo|COMPLETED|0:0|00:00:07|n1|debug|None"; done
"""
NAN = math.nan

BAD_EVENTS: list[tuple[str, Any]] = [
    ("no_reason", {"event": "budget_exhausted", "time": 5.0, "step": 3}),
    ("nodes_a_number", {"event": "hang", "time": 5.0, "step": 3, "nodes": 2, "ranks": [0]}),
    ("nodes_an_object", {"event": "quarantine", "time": 5.0, "nodes": {"n1": 1}, "reason": "x"}),
    ("nan_time", {"event": "preempted", "time": NAN, "step": 3}),
    ("nan_step", {"event": "resume", "time": 5.0, "step": NAN}),
    ("string_step", {"event": "resume", "time": 5.0, "step": "3"}),
    ("list_event", ["event", "resume"]),
    ("event_a_number", {"event": 7, "time": 5.0}),
    ("stderr_a_string", {"event": "failure", "time": 5.0, "error": "x", "stderr_tail": "oops"}),
    ("time_a_list", {"event": "signal", "time": [1, 2], "step": 2}),
]
BAD_METRICS: list[tuple[str, Any]] = [
    ("string_step", {"kind": "train", "time": 4.0, "step": "2", "loss": 1.0}),
    ("nan_step", {"kind": "train", "time": 4.0, "step": NAN, "loss": 1.0}),
    ("nan_time", {"kind": "eval", "time": NAN, "step": 2, "test_accuracy": 0.5}),
    ("kind_a_list", {"kind": ["train"], "time": 4.0, "step": 2}),
    ("loss_text", {"kind": "train", "time": 4.0, "step": 2, "loss": "low"}),
]
GOOD_EVENTS = [
    {"event": "start", "time": 1.0, "step": 0, "nodes": 1},  # a count: older start events
    {"event": "complete", "time": 9.0, "step": 4, "test_accuracy": 0.5},
]
GOOD_METRICS = [
    {"kind": "train", "time": 2.0, "step": 2, "loss": 2.0},
    {"kind": "train", "time": 3.0, "step": 4, "loss": NAN},  # a diverged loss is a fact, kept
    {"kind": "eval", "time": 3.5, "step": 4, "test_accuracy": 0.5},
]


@pytest.fixture
def slurm(stub_slurm: Path) -> Path:
    for name, text in (("squeue", SQUEUE), ("sacct", SACCT)):
        (stub_slurm / name).write_text(text)
        (stub_slurm / name).chmod(0o755)
    return stub_slurm


def _run(
    tmp_path: Path, name: str, job_id: str, *, events: list[Any], metrics: list[Any]
) -> RunRecord:
    run_dir = tmp_path / "runs" / name
    (run_dir / "slurm").mkdir(parents=True)
    record = RunRecord(
        name, "demo", str(run_dir), "slurm", job_id=job_id, submitted_at=1.0,
        tasks=[TaskRecord(0, str(run_dir))], world_size=1,
    )  # fmt: skip
    save_record(record)
    append_index(record)
    lines = "".join(json.dumps(x) + "\n" for x in events)
    (run_dir / "events.jsonl").write_text(lines)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in metrics))
    record.log_file(job_id, 0).write_text("a log line\n")
    return record


def _cmd(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    train.schema._reported.clear()  # each command is its own process in real life
    out = io.StringIO()
    code = main(argv, out)
    return code, out.getvalue(), capsys.readouterr().err


def _one_report(err: str, path: Path) -> None:
    lines = err.splitlines()
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"warning: {path}: skipped 1 "), err


def _commands(good: RunRecord, bad: RunRecord, tmp_path: Path) -> list[tuple[list[str], int]]:
    return [
        (["status"], 0),
        (["status", bad.run_id], 0),
        (["status", "--json"], 0),
        (["logs", "-f", bad.run_id], 0),
        (["plot", bad.run_id, "-o", str(tmp_path / "plot.png")], 0),
    ]


@pytest.mark.parametrize(("case", "bad"), BAD_EVENTS, ids=[c for c, _ in BAD_EVENTS])
def test_a_damaged_event_is_skipped_and_reported_by_every_command(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str], case: str, bad: Any
) -> None:
    good = _run(tmp_path, "good", "101", events=GOOD_EVENTS, metrics=GOOD_METRICS)
    events = [GOOD_EVENTS[0], bad, GOOD_EVENTS[1]]
    damaged = _run(tmp_path, "bad", "102", events=events, metrics=GOOD_METRICS)
    path = Path(damaged.run_dir) / "events.jsonl"
    for argv, code in _commands(good, damaged, tmp_path):
        got, out, err = _cmd(argv, capsys)
        assert got == code, (argv, err)
        _one_report(err, path)
        if argv == ["status"]:
            assert "good" in out and "bad" in out and "complete at step 4" in out
    drill = Drill(damaged, _RunningJob(), "cancel")  # type: ignore[arg-type]
    train.schema._reported.clear()
    assert [e["event"] for e in drill.events()] == ["start", "complete"]
    drill._measure(0.0, 0)
    _one_report(capsys.readouterr().err, path)


@pytest.mark.parametrize(("case", "bad"), BAD_METRICS, ids=[c for c, _ in BAD_METRICS])
def test_a_damaged_metric_is_skipped_and_reported_by_every_command(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str], case: str, bad: Any
) -> None:
    good = _run(tmp_path, "good", "101", events=GOOD_EVENTS, metrics=GOOD_METRICS)
    damaged = _run(tmp_path, "bad", "102", events=GOOD_EVENTS, metrics=[*GOOD_METRICS, bad])
    path = Path(damaged.run_dir) / "metrics.jsonl"
    for argv, code in _commands(good, damaged, tmp_path):
        if argv[0] == "logs":
            continue  # logs -f reads no metrics
        got, out, err = _cmd(argv, capsys)
        assert got == code, (argv, err)
        _one_report(err, path)
        if argv == ["status"]:
            assert "good" in out and "step 4" in out
    drill = Drill(damaged, _RunningJob(), "cancel")  # type: ignore[arg-type]
    train.schema._reported.clear()
    assert [s for _, s in drill.train_steps()] == [2, 4]
    _one_report(capsys.readouterr().err, path)


BAD_RECORDS: list[tuple[str, Any]] = [
    ("tasks_an_object", {"tasks": {"0": {"index": 0}}}),
    ("nan_submitted_at", {"submitted_at": NAN}),
    ("overrides_a_string", {"overrides": "train.seed=1"}),
    ("job_id_a_number", {"job_id": 102}),
    ("task_index_text", {"tasks": [{"index": "0", "run_dir": "/x"}]}),
]


@pytest.mark.parametrize(("case", "change"), BAD_RECORDS, ids=[c for c, _ in BAD_RECORDS])
def test_a_damaged_run_record_costs_only_its_run(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str], case: str, change: Any
) -> None:
    _run(tmp_path, "good", "101", events=GOOD_EVENTS, metrics=GOOD_METRICS)
    damaged = _run(tmp_path, "bad", "102", events=GOOD_EVENTS, metrics=GOOD_METRICS)
    path = Path(damaged.run_dir) / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    code, out, err = _cmd(["status"], capsys)
    assert code == 0 and "good" in out and "bad " not in out
    _one_report(err, path)
    code, out, err = _cmd(["list"], capsys)
    assert code == 0 and "good" in out and "bad" in out  # listed from the index, no state
    assert err.count("\n") == 1 and f"jobs: warning: {path}: not a readable run record" in err
    code, out, err = _cmd(["status", "bad"], capsys)
    assert code == 2 and err.count("\n") == 1 and f"{path}: not a readable run record" in err


@pytest.mark.parametrize(
    "entry",
    [
        {"run_dir": 5},
        {"run_dir": "/x", "submitted_at": "yesterday"},
        {"run_dir": "/x", "job_id": [1]},
    ],
)
def test_a_damaged_index_entry_is_skipped_and_reported(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str], entry: Any
) -> None:
    _run(tmp_path, "good", "101", events=GOOD_EVENTS, metrics=GOOD_METRICS)
    index = tmp_path / "state" / "runs.jsonl"
    with index.open("a") as f:
        f.write(json.dumps(entry) + "\n")
    for argv in (["list"], ["status"], ["list", "--no-state"]):
        code, out, err = _cmd(argv, capsys)
        assert code == 0 and "good" in out, (argv, err)
        assert err.splitlines() == [f"jobs: warning: {index}: skipped 1 damaged entry (line 2)"]


@pytest.mark.parametrize(
    "state",
    [
        {"tasks": [1, 2]},
        {"tasks": {"local-1": {"state": 5}}},
        {"tasks": {"local-1": {"state": "RUNNING", "exit_codes": "0"}}},
        {"tasks": {"local-1": {"state": "RUNNING", "ranks": {"pid": 1}}}},
        {"supervisor": [1], "tasks": {}},
    ],
)
def test_a_damaged_local_state_is_skipped_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: Any
) -> None:
    run_dir = tmp_path / "runs" / "loc"
    (run_dir / "slurm").mkdir(parents=True)
    record = RunRecord(
        "loc", "demo", str(run_dir), "local", job_id="local-1", pid=1, submitted_at=1.0,
        tasks=[TaskRecord(0, str(run_dir))],
    )  # fmt: skip
    save_record(record)
    append_index(record)
    (run_dir / "local_state.json").write_text(json.dumps(state))
    for argv in (["status"], ["status", "loc", "--json"], ["list"], ["cancel", "loc"]):
        code, out, err = _cmd(argv, capsys)
        assert code == 0, (argv, err)
        assert len(err.splitlines()) == 1 and "local_state.json: skipped 1" in err, (argv, err)
        if argv[0] == "status":
            assert "FAILED" in out  # the supervisor (PID 1 is not it) is gone


class _RunningJob:
    """What a drill asks Slurm, answered for a job that runs."""

    def show_job(self, job_id: str) -> dict[str, str]:
        return {"JobState": "RUNNING", "Restarts": "0", "StartTime": "Unknown"}


# the fields the stop path writes (train.stop.act.record, the supervisor's root, the hang
# watcher, the batch script's retry, the local executor's submission): typed for readers
STOP_FIELDS: dict[str, Any] = {
    "kind": "failure", "action": "requeue", "failure_class": "infra",
    "cause": "infra: a device (rule device)", "signature": "RuntimeError: x @ a.py:3:f",
    "root_rank": 1, "cascade": {"rank": 2, "error": "connection closed"},
    "observed": [{"rank": 0, "idle_s": 30.0}], "by": "batch_script", "tries": 2,
    "then": "exit 75", "after": "failure", "in_place": 1, "next_in_place": 2,
    "submission": "local-3", "exact": False, "config_changed": ["train.lr"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "bad"),
    [("root_rank", "1"), ("cascade", "rank 2"), ("observed", {"rank": 0}), ("by", 3),
     ("cause", ["x"]), ("signature", 5), ("submission", 7), ("in_place", -1), ("tries", "2"),
     ("exact", "no"), ("config_changed", "train.lr"), ("failure_class", 1)],
)  # fmt: skip
def test_the_stop_paths_event_fields_are_typed(name: str, bad: Any) -> None:
    """Issue 44: readers get typed values of the stop path's fields; one that does not fit is
    a damaged record (skipped and reported), never a value a reader trips on."""
    good = {"event": "failure", "time": 5.0, "step": 3, **STOP_FIELDS}
    assert train.schema.EVENT.problem(good) is None
    assert (train.schema.EVENT.problem({**good, name: bad}) or "").startswith(f"{name}:")
