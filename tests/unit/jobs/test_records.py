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
