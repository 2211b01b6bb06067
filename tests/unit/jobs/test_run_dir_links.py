"""Issue 41: ``jobs`` writes a shared run directory and the state folder only through the owner
(:mod:`train.runfiles`): a link planted there by another user (in a shared ``train.run_dir``,
where the temporary files of an atomic write go, in ``$SLURM_TRAIN_STATE_DIR``) is never
written, appended or renamed through, and the file it names stays as it was.

The plants are made as another user would make them: the file they name belongs to another
uid (``os.chown``, these tests run as root where they can), and so does a foreign state folder.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.localrun import Supervisor
from jobs.records import RunRecord, TaskRecord, append_index, save_record

OTHER_UID = 4321
PRECIOUS = "another user's file\n" * 100


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Another user's file, elsewhere."""
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_text(PRECIOUS)
    if os.getuid() == 0:
        os.chown(target.parent, OTHER_UID, OTHER_UID)
        os.chown(target, OTHER_UID, OTHER_UID)
    return target


def _plant(link: Path, victim: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    if os.getuid() == 0:
        os.lchown(link, OTHER_UID, OTHER_UID)


def _untouched(victim: Path) -> bool:
    return victim.read_text() == PRECIOUS


def _record(run_dir: Path) -> RunRecord:
    return RunRecord(
        run_id="demo-1",
        name="demo",
        run_dir=str(run_dir),
        executor="local",
        tasks=[TaskRecord(0, str(run_dir))],
    )


def _spec(tmp_path: Path, run_dir: Path) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: demo\ntrain:\n  run_dir: {run_dir}\n  seed: 1\n")
    return spec


@pytest.mark.parametrize("name", ["spec.yaml", "resolved.yaml", "sbatch.sh"])
def test_submit_never_writes_through_a_link_in_the_run_dir(
    tmp_path: Path, stub_slurm: Path, victim: Path, name: str
) -> None:
    run_dir = tmp_path / "shared-run"
    _plant(run_dir / name, victim)
    code = main(["submit", str(_spec(tmp_path, run_dir)), "--executor", "slurm", "--no-preflight"])
    assert _untouched(victim)
    assert code != 0


def test_the_run_record_is_never_written_through_a_planted_temporary_name(
    tmp_path: Path, victim: Path
) -> None:
    run_dir = tmp_path / "run"
    # the names the old writer used for its temporary file (predictable: the PID)
    _plant(run_dir / f".run.json.{os.getpid()}.tmp", victim)
    save_record(_record(run_dir))
    assert _untouched(victim)
    assert RunRecord.from_dict(__import__("json").loads((run_dir / "run.json").read_text()))


def test_a_link_planted_as_the_run_record_is_refused_not_replaced(
    tmp_path: Path, victim: Path
) -> None:
    run_dir = tmp_path / "run"
    _plant(run_dir / "run.json", victim)
    with pytest.raises(OSError, match=r"run\.json is a symbolic link"):
        save_record(_record(run_dir))
    assert _untouched(victim) and (run_dir / "run.json").is_symlink()


def test_the_local_state_is_never_written_through_a_planted_temporary_name(
    tmp_path: Path, victim: Path
) -> None:
    run_dir = tmp_path / "run"
    _plant(run_dir / ".local_state.json.tmp", victim)  # the old fixed temporary name
    sup = Supervisor(_record(run_dir))
    sup.save()
    assert _untouched(victim)
    assert (run_dir / "local_state.json").is_file()


def test_a_local_cancel_never_truncates_through_a_planted_stop_file(
    tmp_path: Path, victim: Path
) -> None:
    run_dir = tmp_path / "run"
    _plant(run_dir / ".local-stop", victim)
    sup = Supervisor(_record(run_dir))
    sup.cancel(signal.SIGTERM, None)  # what `jobs cancel` makes the local supervisor do
    assert _untouched(victim)


def test_a_local_cancel_writes_its_stop_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Supervisor(_record(run_dir)).cancel(signal.SIGTERM, None)
    assert (run_dir / ".local-stop").read_text() == "cancel\n"


def test_the_run_index_is_never_appended_through_a_link(
    isolated_state: Path, tmp_path: Path, victim: Path
) -> None:
    isolated_state.mkdir()
    _plant(isolated_state / "runs.jsonl", victim)
    with pytest.raises(OSError, match=r"runs\.jsonl is a symbolic link"):
        append_index(_record(tmp_path / "run"))
    assert _untouched(victim)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a folder of another uid")
def test_a_state_folder_of_another_user_is_refused_in_one_line(
    isolated_state: Path, tmp_path: Path
) -> None:
    isolated_state.mkdir()
    os.chown(isolated_state, OTHER_UID, OTHER_UID)
    with pytest.raises(OSError, match=rf"belongs to uid {OTHER_UID}") as err:
        append_index(_record(tmp_path / "run"))
    assert "\n" not in str(err.value)
    assert os.listdir(isolated_state) == []


def test_a_state_folder_planted_as_a_link_is_refused(
    isolated_state: Path, tmp_path: Path, victim: Path
) -> None:
    _plant(isolated_state, victim.parent)
    with pytest.raises(OSError, match="symbolic link"):
        append_index(_record(tmp_path / "run"))
    assert sorted(os.listdir(victim.parent)) == ["precious.txt"]


def test_the_state_folder_is_made_closed_to_writes_of_others(
    isolated_state: Path, tmp_path: Path
) -> None:
    append_index(_record(tmp_path / "run"))
    assert (isolated_state / "runs.jsonl").is_file()
    assert isolated_state.stat().st_mode & 0o022 == 0


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a file of another uid")
def test_another_users_claim_is_never_deleted(
    tmp_path: Path, stub_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "shared-run"
    run_dir.mkdir()
    (run_dir / ".owner").write_text("{}\n")  # theirs, naming no live run
    os.chown(run_dir / ".owner", OTHER_UID, OTHER_UID)
    capsys.readouterr()
    code = main(["submit", str(_spec(tmp_path, run_dir)), "--executor", "slurm", "--no-preflight"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and f"belongs to uid {OTHER_UID}" in err
    assert (run_dir / ".owner").read_text() == "{}\n"
    assert (run_dir / ".owner").stat().st_uid == OTHER_UID


def test_a_local_ranks_log_is_never_appended_through_a_link(tmp_path: Path, victim: Path) -> None:
    run_dir = tmp_path / "run"
    sup = Supervisor(_record(run_dir))
    _plant(sup.record.log_file(sup.task_id(0), 0), victim)
    try:
        with pytest.raises(OSError, match="symbolic link"):
            sup.start(0)  # refused before any rank starts
    finally:
        sup._send(signal.SIGKILL)
        for procs in sup.running.values():
            for p in procs:
                p.wait()
    assert _untouched(victim)
