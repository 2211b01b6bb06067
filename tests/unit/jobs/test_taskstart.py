"""Issue 46: the task's first instructions (jobs.taskstart). Every srun line runs submitit's
module through it; where ``jobs submit`` left the task's first-start note, the command starts
before submitit loads, in the same interpreter that then runs submitit's runtime and finds it
started. Everything else (no note, a damaged, foreign or linked one) runs submitit's module as
it always ran. Real interpreters, submitit's real runtime; no Slurm (its variables given)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.render import submitted_pickle
from jobs.taskstart import FIRST_NOTE_MAX_BYTES, first_note, read_first_note

REPO = Path(__file__).resolve().parents[3]


def _env(job_id: str, array: tuple[str, str] | None = None) -> dict[str, str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": "/nonexistent",
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": job_id,
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
    }
    if array is not None:
        env.update(SLURM_ARRAY_JOB_ID=array[0], SLURM_ARRAY_TASK_ID=array[1])
    return env


def _task(folder: Path, task: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The srun line's command, as jobs.executor.task_python renders it (the shell gave TASK)."""
    argv = [sys.executable, "-P", "-u", "-m", "jobs.taskstart", "--task", task, "--",
            "-u", "-m", "submitit.core._submit", str(folder)]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def _result(folder: Path, task: str) -> object:
    with (folder / f"{task}_0_result.pkl").open("rb") as f:
        return pickle.load(f)


def _run_dir(tmp_path: Path) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    folder = run_dir / "slurm"
    folder.mkdir(parents=True)
    return run_dir, folder


def _note(run_dir: Path, marker: Path, **changes: object) -> dict[str, object]:
    note: dict[str, object] = {
        "command": ["python", "-c", f"open({str(marker)!r}, 'w').write('ran')"],
        "run_dir": str(run_dir),
        "signal": "USR2",
        "stop_signal": "auto",
    }
    note.update(changes)
    return note


def _dump_started_first(folder: Path, task: str) -> None:
    # the task's callable says whether a command was started first in its process: only
    # jobs.taskstart could have (submitit's runtime starts none)
    from submitit.helpers import DelayedSubmission

    from train.command.prestart import started_first

    delayed = DelayedSubmission(started_first)
    delayed.set_timeout(5, 0)
    delayed.dump(submitted_pickle(folder, task))


def _wait(path: Path) -> str:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.parametrize(
    ("task", "job_id", "array"), [("", "77", None), ("76_3", "80", ("76", "3"))]
)
def test_with_its_note_the_command_starts_before_submitits_runtime(
    tmp_path: Path, task: str, job_id: str, array: tuple[str, str] | None
) -> None:
    # one job: the script gives no task (its job id is the name); an array task: ARRAYID_INDEX
    run_dir, folder = _run_dir(tmp_path)
    name = task or job_id
    _dump_started_first(folder, name)
    marker = tmp_path / "ran"
    first_note(folder, name).write_text(json.dumps(_note(run_dir, marker)))
    proc = _task(folder, task, _env(job_id, array))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _result(folder, name) == ("success", True)
    assert _wait(marker) == "ran"


@pytest.mark.parametrize(
    "damage",
    [
        "missing",
        "not json {",
        "[1, 2]",
        "link",
        "too big",
        "another run's",
        "command not a list",
        "an empty command",
        "a signal missing",
    ],
)
def test_without_a_whole_note_of_this_run_nothing_starts_first(tmp_path: Path, damage: str) -> None:
    run_dir, folder = _run_dir(tmp_path)
    _dump_started_first(folder, "77")
    marker = tmp_path / "ran"
    path = first_note(folder, "77")
    good = json.dumps(_note(run_dir, marker))
    if damage in ("not json {", "[1, 2]"):
        path.write_text(damage)
    elif damage == "link":
        (tmp_path / "elsewhere.json").write_text(good)
        path.symlink_to(tmp_path / "elsewhere.json")
    elif damage == "too big":
        note = _note(run_dir, marker, pad="x" * FIRST_NOTE_MAX_BYTES)
        path.write_text(json.dumps(note))
    elif damage == "another run's":
        path.write_text(json.dumps(_note(tmp_path / "other", marker)))
    elif damage == "command not a list":
        path.write_text(json.dumps(_note(run_dir, marker, command="python x.py")))
    elif damage == "an empty command":
        path.write_text(json.dumps(_note(run_dir, marker, command=[])))
    elif damage == "a signal missing":
        path.write_text(json.dumps(_note(run_dir, marker, stop_signal="")))
    assert read_first_note(path) is None
    proc = _task(folder, "", _env("77"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _result(folder, "77") == ("success", False)  # submitit's runtime ran, as always
    assert not marker.exists()


def test_a_whole_note_reads_back(tmp_path: Path) -> None:
    run_dir, folder = _run_dir(tmp_path)
    note = _note(run_dir, tmp_path / "ran")
    first_note(folder, "5").write_text(json.dumps(note))
    assert read_first_note(first_note(folder, "5")) == note


@pytest.mark.parametrize("args", [[], ["--task", "1"], ["--task", "1", "--", "-u", "x.py"]])
def test_a_line_it_does_not_understand_is_one_line_and_an_error(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-P", "-m", "jobs.taskstart", *args],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "jobs.taskstart: usage: --task TASK -- [-u] -m MODULE ARGS..."
    ]


CMD_SPEC = "name: c\nentrypoint: {command: [python, train.py, --lr, '0.1'], stop_signal: USR1}\n"


@pytest.mark.parametrize(
    ("text", "overrides"),
    [(CMD_SPEC, ()), (CMD_SPEC, ("requeue.mode=chain", "requeue.chain_depth=1"))],
)
def test_a_submission_leaves_each_jobs_note_beside_its_pickle(
    tmp_path: Path, stub_slurm: Path, text: str, overrides: tuple[str, ...]
) -> None:
    from cluster.client import SlurmClient
    from jobs.load import load_text
    from jobs.submit import make_plan, submit_slurm

    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    loaded = load_text(text, str(spec), overrides)
    record = submit_slurm(loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient())
    folder = Path(record.run_dir) / "slurm"
    for jid in record.chain_job_ids or [record.job_id]:
        note = read_first_note(first_note(folder, jid))
        assert note is not None and note["command"] == ["python", "train.py", "--lr", "0.1"]
        assert (note["run_dir"], note["signal"], note["stop_signal"]) == (
            record.run_dir, "USR2", "USR1")  # fmt: skip
    assert not (folder / ".pending").exists()


def test_a_run_of_the_built_in_trainer_has_no_note(tmp_path: Path, stub_slurm: Path) -> None:
    from cluster.client import SlurmClient
    from jobs.load import load_text
    from jobs.submit import make_plan, submit_slurm

    text = "name: t\ntrain: {max_steps: 5}\n"
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    loaded = load_text(text, str(spec), ())
    record = submit_slurm(loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient())
    assert list((Path(record.run_dir) / "slurm").glob("*_first.json")) == []


def test_submitits_runtime_loads_once_the_commands_start_is_over(tmp_path: Path) -> None:
    # the command keeps its core busy (as an import does), says so in a file, then sleeps: the
    # task's callable (after submitit's import and the unpickling) finds that file there
    from submitit.helpers import DelayedSubmission

    run_dir, folder = _run_dir(tmp_path)
    marker = tmp_path / "started"
    busy = "import sys, time; sum(i * i for i in range(3_000_000)); "
    busy += "open(sys.argv[1], 'w').write('started'); time.sleep(3)"
    note = _note(run_dir, marker, command=["python", "-c", busy, str(marker)])
    first_note(folder, "77").write_text(json.dumps(note))
    delayed = DelayedSubmission(Path.exists, marker)
    delayed.set_timeout(5, 0)
    delayed.dump(submitted_pickle(folder, "77"))
    proc = _task(folder, "", _env("77"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _result(folder, "77") == ("success", True)
