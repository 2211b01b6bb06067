"""Run records, the index, lookups by id/name/job id, and the requeue history summary."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.errors import RunNotFoundError
from jobs.monitor import events_summary
from jobs.records import (
    RunRecord,
    TaskRecord,
    append_index,
    describe_progress,
    find_run,
    latest_progress,
    save_record,
)


def _record(tmp_path: Path, name: str, job_id: str, array: int | None = None) -> RunRecord:
    run_dir = tmp_path / "runs" / f"{name}-{job_id}"
    run_dir.mkdir(parents=True)
    n = array or 1
    tasks = [
        TaskRecord(i, str(run_dir / "tasks" / str(i)) if array else str(run_dir), {})
        for i in range(n)
    ]
    rec = RunRecord(
        run_id=f"{name}-{job_id}",
        name=name,
        run_dir=str(run_dir),
        executor="slurm",
        job_id=job_id,
        array_size=array,
        submitted_at=1.0,
        tasks=tasks,
        world_size=2,
    )
    save_record(rec)
    append_index(rec)
    return rec


def test_find_by_run_id_job_id_task_id_name_and_dir(tmp_path: Path) -> None:
    old = _record(tmp_path, "cifar", "10")
    new = _record(tmp_path, "cifar", "11", array=3)
    assert find_run("cifar-10").job_id == "10"
    assert find_run("10").run_id == old.run_id
    assert find_run("11_2").run_id == new.run_id
    assert find_run("cifar").run_id == new.run_id  # newest with that name
    assert find_run(old.run_dir).run_id == old.run_id
    assert find_run(None).run_id == new.run_id
    assert new.job_ids() == ["11_0", "11_1", "11_2"]
    assert new.log_file("11_1", 1) == Path(new.run_dir) / "slurm" / "11_1_1_log.out"


def test_unknown_run_is_an_input_error(tmp_path: Path) -> None:
    _record(tmp_path, "cifar", "10")
    with pytest.raises(RunNotFoundError, match="no run matches 'nope'"):
        find_run("nope")


def test_events_summary(tmp_path: Path) -> None:
    events = [
        {"event": "start", "step": 0},
        {"event": "signal", "step": 40},
        {"event": "preempted", "step": 40},
        {"event": "requeue", "step": 40},
        {"event": "resume", "step": 40},
        {"event": "preempted", "step": 90},
        {"event": "requeue", "step": 90},
        {"event": "resume", "step": 90},
        {"event": "complete", "step": 200},
    ]
    record = _record(tmp_path, "cifar", "10")
    run_dir = Path(record.tasks[0].run_dir)
    (run_dir / "events.jsonl").write_text(
        "\n".join(json.dumps(e) for e in events) + '\n{"event": "trunc'
    )
    # a half-written last line is skipped; the summary is train.history's
    assert events_summary(record) == {
        str(run_dir): "preempted 2x, resumed at step 90, complete at step 200"
    }
    (run_dir / "events.jsonl").unlink()
    assert events_summary(record) == {str(run_dir): ""}


def test_list_and_unknown_status_via_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _record(tmp_path, "cifar", "10")
    out = io.StringIO()
    assert main(["list"], out) == 0
    assert "cifar-10" in out.getvalue()
    out = io.StringIO()
    assert main(["list", "--json"], out) == 0
    assert json.loads(out.getvalue())[0]["job_id"] == "10"
    capsys.readouterr()  # `list` may warn that Slurm cannot be asked (no cluster up)
    assert main(["status", "nope"], io.StringIO()) == 2
    assert capsys.readouterr().err.startswith("no run matches 'nope'")


def test_logs_prints_the_rank_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = _record(tmp_path, "cifar", "12")
    rec.log_file("12", 1).parent.mkdir(parents=True, exist_ok=True)
    rec.log_file("12", 1).write_text("rank one says hi\n")
    out = io.StringIO()
    assert main(["logs", "12", "--rank", "1"], out) == 0
    assert out.getvalue() == "rank one says hi\n"
    assert main(["logs", "12", "--rank", "5"], io.StringIO()) == 2
    assert "ranks 0..1" in capsys.readouterr().err


def test_progress_from_metrics_tail(tmp_path: Path) -> None:
    lines = [{"kind": "train", "step": s, "loss": 1.0 / s} for s in range(1, 2000)]
    lines.append({"kind": "eval", "step": 1999, "test_accuracy": 0.875})
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"kind": "tra'
    (tmp_path / "metrics.jsonl").write_text(text)
    progress = latest_progress(tmp_path)
    assert progress["step"] == 1999 and progress["test_accuracy"] == 0.875
    assert describe_progress(progress) == "step 1999 loss 0.001 test acc 87.5%"
    assert latest_progress(tmp_path / "missing") == {}


def test_a_bad_byte_in_the_index_is_skipped_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 14.5: one non-UTF-8 byte in runs.jsonl stopped list/status/logs/cancel (exit 1)."""
    _record(tmp_path, "cifar", "10")
    index = tmp_path / "state" / "runs.jsonl"
    with index.open("ab") as f:
        f.write(b'{"run_id": "x\xff", "run_dir": "/nowhere"}\n')
        f.write(b"not json at all\n")
    newer = _record(tmp_path, "cifar", "11")
    with index.open("ab") as f:
        f.write(b'{"torn": ')  # a crash mid-append: the next append starts a fresh line
    _record(tmp_path, "cifar", "12")
    capsys.readouterr()
    out = io.StringIO()
    assert main(["list", "--no-state"], out) == 0
    listed = out.getvalue()
    assert "cifar-10" in listed and "cifar-11" in listed and "cifar-12" in listed
    err = capsys.readouterr().err
    assert "skipped 3 damaged entries (line 2, 3, 5)" in err, err
    assert find_run("11").run_id == newer.run_id
    logs = io.StringIO()
    assert main(["logs", "11"], logs) == 0
    assert main(["status", "11", "--json"], io.StringIO()) in (0, 1)


def test_a_bad_byte_in_events_costs_only_that_line(tmp_path: Path) -> None:
    record = _record(tmp_path, "cifar", "10")
    path = Path(record.tasks[0].run_dir) / "events.jsonl"
    path.write_bytes(
        b'{"event": "start", "step": 0}\n'
        b'{"event": "preempted", "step": 5, "note": "\xff"}\n'
        b'{"event": ["not", "a", "name"]}\n'
        b'{"event": "resume", "step": 4}\n'
    )
    assert events_summary(record) == {record.tasks[0].run_dir: "resumed at step 4"}
    from train.history import read_jsonl_checked

    events, bad = read_jsonl_checked(path)
    assert [e.get("step") for e in events] == [0, None, 4] and bad == [2]


@pytest.mark.parametrize(
    "text",
    [
        b"\xff\xfe",
        b"[1, 2]",
        b'{"run_id": "a", "name": "a", "run_dir": "/x", "executor": "local", "pid": "12"}',
        b'{"run_id": "a", "name": "a", "run_dir": "/x", "executor": "slurm", "tasks": [7]}',
        b'{"run_id": "a", "name": "a", "executor": "slurm"}',
    ],
)
def test_a_damaged_run_record_is_one_line(tmp_path: Path, text: bytes) -> None:
    from jobs.records import load_record

    (tmp_path / "run.json").write_bytes(text)
    with pytest.raises(RunNotFoundError, match="not a readable run record"):
        load_record(tmp_path)


def test_run_directories_are_claimed_exclusively(tmp_path: Path) -> None:
    """Issue 14.7: 16 random bits and exist_ok=True let two submissions share a directory."""
    from jobs.records import Plan

    root = tmp_path / "runs"
    plan = Plan.new("cifar", None, root)
    assert len(plan.run_id.rsplit("-", 1)[1]) == 12  # 48 random bits
    taken = Plan(plan.run_id, plan.run_dir)
    plan.run_dir.mkdir(parents=True)
    (plan.run_dir / "run.json").write_text("{}")  # someone else's run
    mine = taken.claim()
    assert mine.run_dir != plan.run_dir and mine.run_dir.is_dir()
    assert list(mine.run_dir.iterdir()) == []
    assert mine.run_id.startswith("cifar-") and mine.run_dir == root / mine.run_id
    explicit = Plan.new("cifar", str(plan.run_dir), root)
    assert explicit.claim().run_dir == plan.run_dir  # the user's own choice, reused


def test_status_of_a_failed_run_shows_its_error_and_stderr_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster.models import JobAttempt, JobInfo

    class Client:
        def cluster_name(self) -> str:  # cluster.Slurm: the state cache's key
            return ""

        def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
            return {"31": JobInfo("31", "FAILED", exit_code=1, source="squeue")}

        def attempt_times(self, job_id: str) -> list[JobAttempt]:  # sacct -D: none recorded
            return []

    monkeypatch.setattr("jobs.cli._client", Client)
    rec = _record(tmp_path, "byo", "31")
    failure = {
        "event": "failure",
        "step": None,
        "error": "command exited 1: ModuleNotFoundError: No module named 'torch'",
        "stderr_tail": ["Traceback (most recent call last):", "  line 1", "  line 2", "boom"],
    }
    (Path(rec.run_dir) / "events.jsonl").write_text(json.dumps(failure) + "\n")
    out = io.StringIO()
    assert main(["status", "31"], out) == 0
    text = out.getvalue()
    assert text.count("command exited 1: ModuleNotFoundError") == 1  # named once
    assert "| boom" in text and "| Traceback" not in text  # the last 3 lines
    out = io.StringIO()
    assert main(["status", "31", "--json"], out) == 0
    assert json.loads(out.getvalue())["tasks"][0]["last_failure"]["stderr_tail"][-1] == "boom"


def test_status_shows_slurm_restarts_only_when_the_run_recorded_none(tmp_path: Path) -> None:
    from cluster.models import JobInfo
    from jobs.statusview import _slurm_restarts

    info = JobInfo("5", "RUNNING", restarts=2)  # squeue's RestartCnt
    assert _slurm_restarts(info, str(tmp_path)) == "restarted 2x (Slurm)"
    (tmp_path / "events.jsonl").write_text('{"event": "resume", "step": 3, "restart_count": 2}\n')
    assert _slurm_restarts(info, str(tmp_path)) == ""  # the history says it already
    assert _slurm_restarts(JobInfo("5", "RUNNING"), str(tmp_path)) == ""


def test_list_has_a_header_and_names_another_clusters_run_instead_of_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: `jobs list` had no header and mixed in runs of other clusters as UNKNOWN."""
    from dataclasses import replace

    from cluster.models import JobInfo
    from jobs.records import save_record

    save_record(replace(_record(tmp_path, "here", "10"), cluster="alpha"))
    save_record(replace(_record(tmp_path, "there", "11"), cluster="beta"))

    class Here:
        def cluster_name(self) -> str:
            return "alpha"

        def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
            return {i: JobInfo(i, "RUNNING", name="here") for i in ids}

    monkeypatch.setattr("jobs.cli._client", Here)
    out = io.StringIO()
    assert main(["list"], out) == 0
    header, *rows = out.getvalue().splitlines()
    assert header.split()[:5] == ["RUN", "JOB", "WHERE", "STATE", "SUBMITTED"]
    (there,) = [r for r in rows if r.startswith("there-11")]
    (here,) = [r for r in rows if r.startswith("here-10")]
    assert "on beta" in there and "UNKNOWN" not in there
    assert "RUNNING" in here


@pytest.mark.parametrize("command", ["submit", "status", "logs", "cancel", "list", "drill", "plot"])
def test_each_subcommands_help_has_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"], io.StringIO())
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    examples = text.split("examples:\n", 1)[1].splitlines()
    assert examples and all(line.startswith(f"  python -m jobs {command}") for line in examples)


def test_submit_help_lists_every_template(capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli import TEMPLATES
    from jobs.templates import TEMPLATE_NAMES

    assert set(TEMPLATES) == set(TEMPLATE_NAMES)
    with pytest.raises(SystemExit):
        main(["submit", "--help"], io.StringIO())
    assert ", ".join(TEMPLATES) in " ".join(capsys.readouterr().out.split())


def test_status_of_a_state_slurm_added_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Slurm release that prints a job state the tool does not know: ``jobs status`` says so
    in one line naming the field (exit 1), never a traceback, never a guessed state."""
    from cluster import parse
    from cluster.models import JobInfo

    class Client:
        def cluster_name(self) -> str:  # cluster.Slurm: the state cache's key
            return ""

        def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
            return parse.parse_squeue("31|wrap|FROBNICATING|None|n1|debug|0:01|0:0|0|\n")

        job_states = poll_states

    monkeypatch.setattr("jobs.cli._client", Client)
    _record(tmp_path, "byo", "31")
    code = main(["status", "31"], io.StringIO())
    err = capsys.readouterr().err
    assert "squeue field State: unknown job state 'FROBNICATING'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and code == 1
