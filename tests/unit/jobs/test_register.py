"""``python -m jobs.register`` (issue 45): a run a template started by plain ``sbatch`` is
recorded like a ``jobs submit`` run (run.json and one index line through the owner), once per
job id, in a run directory outside the submission folder, and another run's directory is
refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import records
from jobs.register import main

REPO = Path(__file__).resolve().parents[3]
SPEC = "name: reg-test\nresources: {nodes: 1, ntasks_per_node: 2}\ntrain: {max_steps: 5}\n"


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "submit" / "spec.yaml"
    path.parent.mkdir()
    path.write_text(SPEC)
    return path


def _register(spec: Path, *extra: str, job: str = "501") -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "jobs.register", "--config", str(spec), "--job-id", job,
         "--world-size", "2", "--partition", "debug", "--cluster", "c1", *extra],
        cwd=spec.parent, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout.strip(), proc.stderr


def test_registers_once_per_job_id_outside_the_submission_folder(
    spec: Path, tmp_path: Path
) -> None:
    rc, out, err = _register(spec, "--set", "train.max_steps=3", "--log-every", "1")
    assert rc == 0, err
    run_dir = tmp_path / "runs" / "reg-test-job501"  # $SLURM_TRAIN_RUNS_DIR/NAME-jobID
    assert out == str(run_dir)
    record = records.load_record(run_dir)
    assert (record.run_id, record.job_id, record.executor) == ("reg-test-job501", "501", "slurm")
    assert (record.world_size, record.partition, record.cluster) == (2, "debug", "c1")
    assert record.overrides == ["train.max_steps=3"]  # train's other options are not ours
    assert (run_dir / "slurm").is_dir() and (run_dir / "resolved.yaml").is_file()
    assert [e["run_id"] for e in records.read_index()] == ["reg-test-job501"]
    assert records.find_run("reg-test").run_dir == str(run_dir)  # jobs status/logs find it
    assert sorted(p.name for p in spec.parent.iterdir()) == ["spec.yaml"]  # nothing written
    # A requeue starts the script again with the same job id: nothing new is recorded.
    before = (run_dir / "run.json").read_bytes()
    rc, out, err = _register(spec)
    assert (rc, out) == (0, str(run_dir)), err
    assert (run_dir / "run.json").read_bytes() == before
    assert len(records.read_index()) == 1


def test_default_run_dir_is_the_state_folders(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_TRAIN_RUNS_DIR")
    rc, out, err = _register(spec)
    assert rc == 0, err
    assert out == str(tmp_path / "state" / "runs" / "reg-test-job501")


def test_a_start_cut_short_before_the_index_line_is_completed(spec: Path) -> None:
    assert _register(spec)[0] == 0
    records.index_path().unlink()  # as if the job died between run.json and the index line
    assert _register(spec)[0] == 0
    assert [e["run_id"] for e in records.read_index()] == ["reg-test-job501"]


def test_another_live_runs_directory_is_refused(spec: Path, tmp_path: Path) -> None:
    """A run dir whose records are in doubt and that was written a moment ago belongs to a run
    that may live: refused, exit 2, one line naming the directory; nothing written there."""
    run_dir = tmp_path / "busy"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{damaged")
    (run_dir / "events.jsonl").write_text('{"event": "start"}\n')
    rc, out, err = _register(spec, "--run-dir", str(run_dir))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(run_dir) in err, err
    assert "Traceback" not in err
    assert (run_dir / "run.json").read_text() == "{damaged"
    assert not records.index_path().exists()


def test_a_spec_train_takes_but_jobs_does_not_is_recorded_by_the_job_name(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "submit" / "train-only.yaml"
    spec.parent.mkdir()
    spec.write_text("train: {max_steps: 5}\n")  # no name: the raw template's own resources
    rc, out, err = _register(spec, "--name", "train-ddp")
    assert rc == 0, err
    assert out == str(tmp_path / "runs" / "train-ddp-job501")
    assert "not a whole job spec" in err
    assert records.load_record(out).run_id == "train-ddp-job501"


def test_an_empty_job_id_is_one_line(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(spec), "--job-id", " "]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jobs.register: --job-id is empty") and err.count("\n") == 1


def test_index_line_names_the_submission_folder(spec: Path) -> None:
    assert _register(spec)[0] == 0
    (line,) = records.index_path().read_text().splitlines()
    assert json.loads(line)["submit_dir"] == str(spec.parent)
