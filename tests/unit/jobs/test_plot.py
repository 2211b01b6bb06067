"""``python -m jobs plot``: a valid PNG for a run, a running job and a sweep (issue 16)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from jobs.cli import main
from jobs.plot import read_series

PNG = b"\x89PNG\r\n\x1a\n"


def _write_run(run: Path, *, interrupted: bool = True, damaged: bool = False) -> None:
    run.mkdir(parents=True)
    t = 1_790_000_000.0
    metrics, events = [], [{"time": t, "event": "start", "step": 0}]
    steps = list(range(1, 14)) + (list(range(11, 31)) if interrupted else list(range(14, 31)))
    for i, step in enumerate(steps):
        metrics.append({"time": t + i, "kind": "train", "step": step, "loss": 2.0 / step})
        if step % 5 == 0:
            acc = step / 40
            metrics.append({"time": t + i, "kind": "eval", "step": step, "test_accuracy": acc})
    if interrupted:
        events += [
            {"time": t + 13, "event": "preempted", "step": 13},
            {"time": t + 20, "event": "resume", "step": 10},
        ]
    lines = [json.dumps(m) for m in metrics]
    if damaged:
        lines.insert(3, '{"kind": "train", "step": \xff')
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="latin-1")
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def _check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 10_000
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] >= 800 and img.size[1] >= 600


def test_plot_of_an_interrupted_run(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    _write_run(run, damaged=True)
    s = read_series(run, "r1")
    assert s.stops == [("preempted", 13)] and s.resumes == [10] and s.redone == [(10, 13)]
    out = io.StringIO()
    assert main(["plot", str(run), "-o", str(tmp_path / "r1.png")], out=out) == 0
    _check_png(tmp_path / "r1.png")
    assert main(["plot", str(run)], out=io.StringIO()) == 0  # default: RUN_DIR/plot.png
    _check_png(run / "plot.png")


def test_plot_of_a_sweep_has_one_curve_per_task(tmp_path: Path) -> None:
    run = tmp_path / "sweep"
    for i in range(3):
        _write_run(run / "tasks" / str(i), interrupted=i == 1)
    assert main(["plot", str(run), "-o", str(tmp_path / "s.png")], out=io.StringIO()) == 0
    _check_png(tmp_path / "s.png")


def test_plot_of_a_run_without_metrics_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty")], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "no metrics yet" in err and len(err.strip().splitlines()) == 1


def test_other_commands_do_not_import_matplotlib() -> None:
    code = "import sys, jobs.cli; jobs.cli.build_parser(); sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_a_restart_in_place_is_named_on_its_interruption(tmp_path: Path) -> None:
    """Issue 26: the plot says which interruptions went on in the same allocation."""
    from train.history import RunHistory

    history = RunHistory(tmp_path)
    history.append("failure", step=40, restart_count=0, job_id="7", failure_class="infra")
    history.append("restart_in_place", step=None, restart_count=0, job_id="7")
    history.append("resume", step=30, restart_count=0, job_id="7", in_place=1)
    s = read_series(tmp_path, "run")
    assert s.stops == [("failure, restart in place", 40)] and s.resumes == [30]
    assert s.redone == [(30, 40)]


def _command_run(run: Path, *, reports: bool) -> None:
    """A command's run: no built-in metrics; its life in events.jsonl, maybe train.report lines."""
    run.mkdir(parents=True, exist_ok=True)
    t = 1_790_000_000.0
    events = [
        {"time": t, "event": "start", "step": None, "restart_count": 0},
        {"time": t + 40, "event": "preempted", "step": None, "restart_count": 0},
        {"time": t + 41, "event": "requeue", "restart_count": 0, "via": "scontrol"},
        {"time": t + 170, "event": "start", "step": None, "restart_count": 1},
        {"time": t + 230, "event": "complete", "step": None, "restart_count": 1},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if reports:
        lines = [
            {"kind": "report", "time": t + i, "step": i, "scalars": {"loss": 1 / i, "acc": i / 99}}
            for i in range(1, 60)
        ]
        lines.append({"kind": "report", "time": t, "step": 3, "scalars": "nan"})  # foreign
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_a_command_run_is_drawn_from_its_life_and_its_reports(tmp_path: Path) -> None:
    """Issue 45: `jobs plot` of a command run drew nothing ("no metrics yet", exit 2)."""
    run = tmp_path / "cmd"
    _command_run(run, reports=True)
    s = read_series(run, "cmd")
    assert sorted(s.scalars) == ["acc", "loss"] and len(s.scalars["loss"]) == 59
    assert [e for _, e, _ in s.life] == ["start", "preempted", "requeue", "start", "complete"]
    assert main(["plot", str(run), "-o", str(tmp_path / "c.png")], out=io.StringIO()) == 0
    _check_png(tmp_path / "c.png")


def test_a_command_run_without_numbers_still_shows_its_life(tmp_path: Path) -> None:
    run = tmp_path / "cmd"
    _command_run(run, reports=False)
    assert main(["plot", str(run), "-o", str(tmp_path / "c.png")], out=io.StringIO()) == 0
    _check_png(tmp_path / "c.png")


def test_lightning_csv_and_tensorboard_logs_are_the_commands_numbers(tmp_path: Path) -> None:
    run = tmp_path / "cmd"
    _command_run(run, reports=False)
    csv_dir = run / "lightning_logs" / "version_0"
    csv_dir.mkdir(parents=True)
    rows = ["epoch,step,train_loss,val_acc"] + [f"0,{i},{1 / i},{'' if i % 2 else i}" for i in
                                                range(1, 11)]  # fmt: skip
    (csv_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    s = read_series(run, "cmd")
    assert s.scalars == {}  # read by the plot, for a run that reported nothing itself
    from jobs.plot import _tasks

    (series,) = _tasks(run)
    assert len(series.scalars["train_loss"]) == 10 and len(series.scalars["val_acc"]) == 5

    tb = pytest.importorskip("torch.utils.tensorboard")
    run2 = tmp_path / "cmd2"
    _command_run(run2, reports=False)
    writer = tb.SummaryWriter(str(run2 / "tb"))
    for i in range(5):
        writer.add_scalar("loss/train", 1.0 / (i + 1), i)
    writer.close()
    (series,) = _tasks(run2)
    assert [v for _, v in series.scalars["loss/train"]] == pytest.approx(
        [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5]
    )
    assert main(["plot", str(run2), "-o", str(tmp_path / "t.png")], out=io.StringIO()) == 0
    _check_png(tmp_path / "t.png")
