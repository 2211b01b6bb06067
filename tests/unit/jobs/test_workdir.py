"""jobs.workdir: a new submission never continues an earlier run's files by accident.

A command runs in the folder ``jobs submit`` was called from; a script that keeps its
checkpoint there under a fixed name (``snapshot.pt``) would resume the LAST run. The second
submission is refused in one line that names the file and the choices; ``--continue-files``
continues on purpose; files that were there before any run (pretrained weights) are left be.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.monitor import task_states
from jobs.records import find_run
from jobs.workdir import earlier_checkpoints, refusal

SPEC = """name: snap
resources: {nodes: 1, ntasks_per_node: 1, time: 5}
entrypoint:
  command: [sh, -c, 'test -e snapshot.pt && echo resumed || echo fresh; echo w > snapshot.pt']
"""


def _index(folder: Path, at: float) -> list[dict[str, object]]:
    return [{"run_dir": "/x", "submit_dir": str(folder), "submitted_at": at}]


def _touch(path: Path, at: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (at, at))
    return path


def _submit(*extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        code = main(["submit", "snap.yaml", "--executor", "local", "--follow", *extra], out)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_a_second_submission_is_refused_where_the_first_left_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "snap.yaml").write_text(SPEC)
    code, out, _ = _submit()
    assert code == 0, out
    assert (work / "snapshot.pt").exists()  # the command ran here, and left its file
    code, out, err = _submit()
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "./snapshot.pt" in line and "--continue-files" in line
    code, out, _ = _submit("--continue-files")  # on purpose: it continues
    assert code == 0, out
    job_id = out.splitlines()[0]
    logs = io.StringIO()
    assert main(["logs", job_id], logs) == 0
    assert "resumed" in logs.getvalue()
    assert task_states(find_run(job_id), lambda: None)[job_id].state == "COMPLETED"  # type: ignore[arg-type]


def test_files_written_since_a_run_was_submitted_from_here_are_found(tmp_path: Path) -> None:
    start = time.time() - 100
    new = _touch(tmp_path / "snapshot.pt", start + 10)
    ckpts = _touch(tmp_path / "checkpoints" / "epoch_3.pt", start + 20).parent
    lightning = _touch(
        tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", start + 5
    ).parent
    _touch(tmp_path / "resnet50.pth", start - 1000)  # pretrained, there before any run
    _touch(tmp_path / "notes.txt", start + 30)  # not a checkpoint
    _touch(tmp_path / "runs" / "snap-1" / "model.pt", start + 40)  # our own run directory
    found = earlier_checkpoints(tmp_path, _index(tmp_path, start), tmp_path / "runs")
    assert [p for p, _ in found] == [ckpts, new, lightning]  # newest first
    line = refusal(found, tmp_path)
    assert line.startswith("./checkpoints (and 2 more), written ")
    assert "\n" not in line


def test_no_run_submitted_from_the_folder_means_nothing_to_refuse(tmp_path: Path) -> None:
    _touch(tmp_path / "snapshot.pt", time.time())
    assert earlier_checkpoints(tmp_path, [], None) == []
    other = _index(tmp_path / "elsewhere", time.time() - 100)
    assert earlier_checkpoints(tmp_path, other, None) == []


@pytest.mark.parametrize(
    "entry",
    [
        {"run_dir": "/x"},  # an entry of an older release: where it was submitted is unknown
        {"run_dir": "/x", "submit_dir": 3, "submitted_at": 1.0},
        {"run_dir": "/x", "submit_dir": "/nowhere", "submitted_at": "yesterday"},
    ],
)
def test_a_foreign_index_entry_counts_for_nothing(tmp_path: Path, entry: dict[str, object]) -> None:
    _touch(tmp_path / "snapshot.pt", time.time())
    assert earlier_checkpoints(tmp_path, [entry], None) == []


def test_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    start = time.time() - 100
    target = tmp_path / "elsewhere"
    _touch(target / "secret.pt", start + 10)
    work = tmp_path / "work"
    work.mkdir()
    (work / "checkpoints").symlink_to(target)  # a link, not a folder of the script's own
    assert earlier_checkpoints(work, _index(work, start), None) == []


def test_a_built_in_trainer_run_is_never_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in trainer keeps its checkpoints in RUN_DIR only: nothing to look for."""
    monkeypatch.chdir(tmp_path)
    _touch(tmp_path / "snapshot.pt", time.time())
    (tmp_path / "t.yaml").write_text("name: t\nresources: {nodes: 1}\ntrain: {max_steps: 1}\n")
    from jobs.cli import _refuse_earlier_files
    from jobs.load import load_spec

    _refuse_earlier_files(load_spec(tmp_path / "t.yaml"), tmp_path / "runs")
