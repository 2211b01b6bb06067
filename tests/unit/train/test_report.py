"""train.report: a user's script tells the tool its step and numbers in one torch-free line."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from train.report import report
from train.schema import METRIC, read_records


def _lines(run: Path) -> list[dict[str, object]]:
    return read_records(run / "metrics.jsonl", METRIC)


def test_rank_0_appends_one_line_of_finite_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    report(10, loss=0.5, lr=1, bad=math.nan, worse="x", inf=math.inf, flag=True, kind=3)
    report(20, loss=0.25)
    first, second = _lines(tmp_path)
    assert first["kind"] == "report" and first["step"] == 10
    assert first["scalars"] == {"loss": 0.5, "lr": 1.0}  # the rest is not a finite number
    assert second["step"] == 20 and second["scalars"] == {"loss": 0.25}


@pytest.mark.parametrize(("rank", "run_dir"), [("1", True), ("0", False)])
def test_other_ranks_and_runs_outside_a_job_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: str, run_dir: bool
) -> None:
    monkeypatch.setenv("RANK", rank)
    if run_dir:
        monkeypatch.setenv("RUN_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("RUN_DIR", raising=False)
    report(1, loss=1.0)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_planted_link_is_not_written_through_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    monkeypatch.setenv("RUN_DIR", str(run))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("train.report._failed", False)
    report(1, loss=1.0)
    report(2, loss=1.0)
    assert victim.read_text() == "keep\n"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.report" in err[0]  # said once


def test_importing_it_costs_no_torch() -> None:
    code = "import sys, train.report; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
