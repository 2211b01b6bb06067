"""A command's own ``scontrol requeue`` of its job during a stop is its supervisor's
(train.command.selfrequeue): our ``scontrol`` (POSIX sh, run for real here) takes that one
call while the supervisor is stopping and hands everything else to the real ``scontrol`` with
its arguments as they are; the command's environment points at both; the markers are this
user's, node-local, and gone at the end. End to end with a supervised command:
tests/unit/train/test_command.py (``..._is_the_stops_one_requeue``) and, on each Slurm
release, tests/integration/test_byo_preempt.py (Lightning)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from train.command import selfrequeue
from train.env import DistEnv
from train.runfiles import NotOursError

SHIM = selfrequeue.SHIM_DIR / "scontrol"


def _real(tmp_path: Path, code: int = 0) -> Path:
    """A stand-in for Slurm's scontrol: each call's arguments, one per line, then exits code."""
    real = tmp_path / "real" / "scontrol"
    real.parent.mkdir(exist_ok=True)
    real.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{tmp_path}/calls"; echo; exit {code}\n')
    real.chmod(0o755)
    return real


def _run(
    tmp_path: Path, *args: str, stopping: bool, **env: str
) -> subprocess.CompletedProcess[str]:
    state = tmp_path / "requeue-0"
    if stopping:
        Path(f"{state}.stopping").touch()
    environ = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77",
               selfrequeue.STATE_ENV: str(state), selfrequeue.SCONTROL_ENV: str(_real(tmp_path)),
               **env}  # fmt: skip
    return subprocess.run([str(SHIM), *args], env=environ, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip


def _calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_the_shim_is_executable_sh() -> None:
    assert os.access(SHIM, os.X_OK)
    assert SHIM.read_text().startswith("#!/bin/sh\n")


def test_outside_a_stop_every_call_is_the_real_scontrols(tmp_path: Path) -> None:
    proc = _run(tmp_path, "requeue", "77", stopping=False)
    assert proc.returncode == 0 and _calls(tmp_path) == ["requeue", "77"]
    assert not Path(f"{tmp_path}/requeue-0.asked").exists()


@pytest.mark.parametrize(
    ("job", "env"),
    [("77", {}), ("12_3", {"SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3"})],
)
def test_in_a_stop_the_commands_requeue_of_its_job_is_handed_over(
    tmp_path: Path, job: str, env: dict[str, str]
) -> None:
    proc = _run(tmp_path, "requeue", job, stopping=True, **env)
    assert proc.returncode == 0  # what the command expects of a requeue that was taken
    assert _calls(tmp_path) == []  # Slurm never asked
    assert Path(f"{tmp_path}/requeue-0.asked").exists()
    assert len(proc.stderr.strip().splitlines()) == 1  # one line says so


@pytest.mark.parametrize(
    "args",
    [
        ("requeue", "78"),  # another job's
        ("requeue", "_"),  # an unset array's shape is no job of ours
        ("requeue", "77", "extra"),
        ("requeuehold", "77"),
        ("show", "job", "77"),
        ("update", "JobId=77", "Comment=a b; $(touch x)"),
    ],
)
def test_in_a_stop_anything_else_is_the_real_scontrols_as_it_was_given(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    proc = _run(tmp_path, *args, stopping=True)
    assert proc.returncode == 0 and _calls(tmp_path) == list(args)
    assert not Path(f"{tmp_path}/requeue-0.asked").exists()
    assert not (Path.cwd() / "x").exists()


def test_the_real_scontrols_exit_code_is_the_commands(tmp_path: Path) -> None:
    environ = {"PATH": os.environ["PATH"], selfrequeue.SCONTROL_ENV: str(_real(tmp_path, 3))}
    proc = subprocess.run([str(SHIM), "show", "job", "5"], env=environ, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert proc.returncode == 3


def test_without_a_real_scontrol_one_line_and_127(tmp_path: Path) -> None:
    proc = subprocess.run([str(SHIM), "show", "job"], env={"PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert proc.returncode == 127 and len(proc.stderr.strip().splitlines()) == 1


def test_export_puts_ours_first_and_names_the_real_one(tmp_path: Path) -> None:
    real = _real(tmp_path)
    state = selfrequeue.state_path(tmp_path / "run", DistEnv(job_id="77", rank=3))
    assert state is not None and state.name == "requeue-3"
    assert tmp_path / "run" not in state.parents  # node-local, never in the run directory
    # ours already on it (a command that runs a command of ours) is not counted twice
    child = {"PATH": os.pathsep.join([str(selfrequeue.SHIM_DIR), str(real.parent), "/usr/bin"])}
    selfrequeue.export(child, state)
    assert child["PATH"].split(os.pathsep) == [str(selfrequeue.SHIM_DIR), str(real.parent),
                                               "/usr/bin"]  # fmt: skip
    assert child[selfrequeue.SCONTROL_ENV] == str(real)
    assert child[selfrequeue.STATE_ENV] == str(state)


def test_export_changes_nothing_without_a_job_or_a_real_scontrol(tmp_path: Path) -> None:
    assert selfrequeue.state_path(tmp_path, DistEnv(job_id=None)) is None
    child = {"PATH": str(_real(tmp_path).parent)}
    selfrequeue.export(child, None)  # no Slurm job: nothing of Slurm's to take
    assert child == {"PATH": str(tmp_path / "real")}
    (tmp_path / "empty").mkdir()
    child = {"PATH": str(tmp_path / "empty")}
    selfrequeue.export(child, tmp_path / "requeue-0")  # no scontrol: the command has none
    assert child == {"PATH": str(tmp_path / "empty")}


def test_markers_are_this_users_and_gone_at_the_end(tmp_path: Path) -> None:
    state = selfrequeue.state_path(tmp_path / "run", DistEnv(job_id="77"), root=tmp_path)
    assert state is not None
    assert not selfrequeue.asked(state)
    assert selfrequeue.mark_stopping(state)
    assert oct(state.parent.stat().st_mode & 0o777) == oct(0o700)
    Path(f"{state}.asked").touch()  # what our scontrol leaves
    assert selfrequeue.asked(state)
    selfrequeue.clear(state)
    assert not state.parent.exists()  # the attempt's folder, once no rank's markers are left
    assert not selfrequeue.mark_stopping(None) and not selfrequeue.asked(None)


def test_a_planted_marker_folder_is_refused(tmp_path: Path) -> None:
    state = selfrequeue.state_path(tmp_path / "run", DistEnv(job_id="77"), root=tmp_path)
    assert state is not None
    state.parent.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state.parent.symlink_to(elsewhere)  # another user's link where our folder goes
    assert not selfrequeue.mark_stopping(state)  # the command's requeue stays Slurm's
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(NotOursError):
        from train.runfiles import private_dir

        private_dir(state.parent.parent.parent, state.parent.parent.name, state.parent.name)
    selfrequeue.clear(state)  # never through the link
    assert elsewhere.exists() and state.parent.is_symlink()


def test_follow_says_the_requeue_was_the_commands_wish(tmp_path: Path) -> None:
    from jobs.follow import describe_event

    asked = {"event": "requeue", "via": "scontrol", "asked_by": "command", "step": None}
    assert describe_event(asked, tmp_path) == "requeued, as the command asked"
    assert describe_event({**asked, "asked_by": None}, tmp_path) == "requeued"
