"""Issue 29: a symbolic link planted in the run directory is never written through (events,
heartbeats, hang stacks and reports, metrics, markers): the write is refused and the file
elsewhere is untouched. Issue 41: the owner's writers (atomic, append, exclusive create,
folders, deletes) and node-local state: links and another user's files or folders planted in
a world-writable stand-in for /dev/shm are never followed, forged or deleted."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from train.hang.heartbeat import Heartbeat, Watchdog, node_local_dir
from train.history import RunHistory
from train.runfiles import (
    LinkRefusedError,
    NotOursError,
    RunDirError,
    append_line,
    atomic_write,
    create_exclusive,
    make_dirs,
    open_text,
    remove,
    remove_own_tree,
    touch,
    write_text,
)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_text("x" * 15000)
    return target


def _plant(link: Path, victim: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)


def test_events_are_not_appended_through_a_link(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "run"
    _plant(run / "events.jsonl", victim)
    with pytest.raises(LinkRefusedError, match=r"events\.jsonl is a symbolic link"):
        RunHistory(run).append("start", step=0)
    assert victim.read_text() == "x" * 15000


def test_a_heartbeat_never_truncates_through_a_link(tmp_path: Path, victim: Path) -> None:
    beats = tmp_path / "run" / ".progress" / "1-0"
    _plant(beats / "rank-0", victim)
    with pytest.raises(LinkRefusedError):
        Heartbeat(beats, 0, {"node": "n1"})
    assert victim.stat().st_size == 15000


@pytest.mark.parametrize("mode", ["w", "a"])
def test_text_files_and_markers_refuse_links(tmp_path: Path, victim: Path, mode: str) -> None:
    link = tmp_path / "run" / "metrics.jsonl"
    _plant(link, victim)
    with pytest.raises(LinkRefusedError):
        open_text(link, mode)
    with pytest.raises(LinkRefusedError):
        write_text(link, "{}")
    with pytest.raises(LinkRefusedError):
        touch(link)
    assert victim.read_text() == "x" * 15000


def test_plain_files_are_written(tmp_path: Path) -> None:
    write_text(tmp_path / "a", "one")
    with open_text(tmp_path / "a", "a") as f:
        f.write("two")
    touch(tmp_path / "m")
    assert (tmp_path / "a").read_text() == "onetwo" and (tmp_path / "m").exists()


# -- issue 41: node-local state, markers, deletes: nothing foreign is followed, forged or deleted
OTHER_UID = 4321
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to make another uid's files")


def _foreign(path: Path) -> None:
    """Make ``path`` (and what is in it) another user's, as if they had made it."""
    for p in [path, *path.rglob("*")]:
        os.lchown(p, OTHER_UID, OTHER_UID)


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    """A world-writable, sticky stand-in for /dev/shm."""
    root = tmp_path / "shm"
    root.mkdir()
    root.chmod(0o1777)
    return root


@pytest.fixture
def theirs(tmp_path: Path) -> Path:
    """Another user's folder, with a file in it."""
    folder = tmp_path / "theirs"
    (folder / "work").mkdir(parents=True)
    (folder / "work" / "results.txt").write_text("precious")
    _foreign(folder)
    return folder


def _watchdog(run: Path, root: Path) -> Watchdog:
    return Watchdog(
        run, rank=1, world_size=2, job_id="7", restart_count=0, timeout_s=5.0, budgets={},
        node="n1", local_rank=1, local_world_size=2, local_root=root,
    )  # fmt: skip


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_heartbeat_folder_is_private_and_ours(tmp_path: Path, shm: Path) -> None:
    wd = _watchdog(tmp_path / "run", shm)
    try:
        mine = shm / f"slurm-train-{os.getuid()}"
        for folder in (mine, *[p for p in wd.local_dir.parents if mine in p.parents]):
            st = folder.lstat()
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            assert stat.S_IMODE(st.st_mode) == 0o700
        assert stat.S_IMODE(wd.local_dir.stat().st_mode) == 0o700
    finally:
        wd.close()


def test_an_older_folder_of_ours_open_to_others_is_closed(tmp_path: Path, shm: Path) -> None:
    mine = shm / f"slurm-train-{os.getuid()}"
    mine.mkdir(mode=0o755)
    mine.chmod(0o755)
    wd = _watchdog(tmp_path / "run", shm)
    wd.close()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700


def test_a_planted_link_for_the_heartbeat_folder_is_refused(
    tmp_path: Path, shm: Path, theirs: Path
) -> None:
    (shm / f"slurm-train-{os.getuid()}").symlink_to(theirs)
    before = _tree(theirs)
    with pytest.raises(NotOursError, match="symbolic link") as err:
        _watchdog(tmp_path / "run", shm)
    assert "\n" not in str(err.value)
    assert _tree(theirs) == before  # no heartbeat forged or hidden in their folder


@as_root
def test_a_heartbeat_folder_of_another_user_is_refused(tmp_path: Path, shm: Path) -> None:
    planted = shm / f"slurm-train-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    _foreign(planted)
    with pytest.raises(NotOursError, match=f"belongs to uid {OTHER_UID}"):
        _watchdog(tmp_path / "run", shm)
    assert os.listdir(planted) == []


def test_a_run_directory_that_cannot_be_made_there_is_bad_input_in_one_line(
    unmakeable_run_dir: tuple[Path, Path],
) -> None:
    taken, base = unmakeable_run_dir
    with pytest.raises(RunDirError) as caught:
        make_dirs(base, "logs")
    from cluster.errors import BadInputError

    assert isinstance(caught.value, BadInputError) and isinstance(caught.value, OSError)
    said = str(caught.value)
    assert said.startswith(f"{base}: cannot make the run directory: ") and "\n" not in said
    assert "Errno" not in said
    assert taken.read_text() == "keep"  # nothing written over it


def test_a_run_directory_failing_for_the_moment_stays_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def broken(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error", str(self))

    monkeypatch.setattr(Path, "mkdir", broken)
    with pytest.raises(OSError) as caught:  # an I/O error is the run's failure (requeued)
        make_dirs(tmp_path / "run")
    assert not isinstance(caught.value, RunDirError)


def test_a_refused_folder_is_bad_input_for_python_m_train() -> None:
    from cluster.errors import BadInputError

    assert issubclass(NotOursError, BadInputError)  # exit 2, one line, never requeued


@as_root
def test_the_watchers_clean_up_deletes_nothing_it_did_not_make(
    tmp_path: Path, shm: Path, theirs: Path
) -> None:
    """The watcher's clean-up of a node folder whose parent another user planted as a link
    (after the check, or made before it): their files stay; ours go."""
    from train.hang import watcher

    local = node_local_dir(tmp_path / "run", "7-0", "n1", shm)
    local.parent.parent.symlink_to(theirs)  # slurm-train-UID -> their folder
    (theirs / local.parent.name).mkdir()
    (theirs / local.parent.name / "n1").mkdir()
    (theirs / local.parent.name / "n1" / "rank-0").write_text("their beat")
    _foreign(theirs)
    before = _tree(theirs)
    args = watcher._Args(
        run_dir=tmp_path / "run", attempt="7-0", node="n1", local_dir=local, world_size=1,
        local_world_size=1, pid=-1, timeout=None, poll=None, summary=10.0, budgets={},
        job_id="7", restart_count=0,
    )  # fmt: skip
    assert watcher._watch(args) == 0  # its rank (pid -1) is gone: clean up and end
    assert _tree(theirs) == before


@as_root
def test_remove_own_tree_never_follows_a_link_nor_deletes_anothers(
    tmp_path: Path, theirs: Path
) -> None:
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "sub" / "beat").write_text("ours")
    (mine / "link").symlink_to(theirs)
    (mine / "sub" / "planted").write_text("theirs")
    os.chown(mine / "sub" / "planted", OTHER_UID, OTHER_UID)
    before = _tree(theirs)
    remove_own_tree(mine)
    assert _tree(theirs) == before
    assert _tree(mine) == ["sub", "sub/planted"]  # only what is not ours stayed


@as_root
def test_remove_refuses_a_link_a_folder_and_anothers_file(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / ".local-stop").symlink_to(victim)
    (run / ".owner").write_text("{}")
    os.chown(run / ".owner", OTHER_UID, OTHER_UID)
    (run / "dir").mkdir()
    for name in (".local-stop", ".owner", "dir"):
        with pytest.raises(NotOursError):
            remove(run / name)
    assert victim.read_text() == "x" * 15000 and (run / ".owner").exists()
    (run / "mine").write_text("ours")
    assert remove(run / "mine") and not (run / "mine").exists()
    assert remove(run / "mine") is False  # missing: nothing to do


def test_markers_are_never_made_through_a_planted_folder(tmp_path: Path) -> None:
    from train.stop.act import claim_failure

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    run.mkdir()
    (run / ".failures").symlink_to(elsewhere)
    claim_failure(run, "7", 0, is_main=True)
    assert os.listdir(elsewhere) == []
    with pytest.raises(LinkRefusedError):
        make_dirs(run, ".failures", "x")
    assert os.listdir(elsewhere) == []


def test_atomic_write_replaces_whole_and_refuses_links(tmp_path: Path, victim: Path) -> None:
    atomic_write(tmp_path / "a.json", "one")
    atomic_write(tmp_path / "a.json", b"two")
    assert (tmp_path / "a.json").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    (tmp_path / "b.json").symlink_to(victim)
    with pytest.raises(LinkRefusedError):
        atomic_write(tmp_path / "b.json", "x")
    (tmp_path / "linked").symlink_to(victim.parent)
    with pytest.raises(LinkRefusedError):
        atomic_write(tmp_path / "linked" / "c.json", "x")  # a planted parent
    assert victim.read_text() == "x" * 15000 and not (victim.parent / "c.json").exists()


def test_append_and_exclusive_create(tmp_path: Path, victim: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"torn": ')
    append_line(path, "{}")
    assert path.read_text() == '{"torn": \n{}\n'
    assert create_exclusive(tmp_path / "m", "1") and not create_exclusive(tmp_path / "m", "2")
    assert (tmp_path / "m").read_text() == "1"
    (tmp_path / "n").symlink_to(victim)
    assert create_exclusive(tmp_path / "n") is False  # a link there: taken, never followed
    with pytest.raises(LinkRefusedError):
        append_line(tmp_path / "n", "{}")
    assert victim.read_text() == "x" * 15000


def test_rank_logs_are_never_appended_through_a_link(tmp_path: Path, victim: Path) -> None:
    import logging

    from train.logsetup import setup_logging

    run = tmp_path / "run"
    _plant(run / "logs" / "rank-0.log", victim)
    with pytest.raises(LinkRefusedError):
        setup_logging(0, run)
    logging.getLogger("x").error("a line")
    assert victim.read_text() == "x" * 15000
    (run / "logs" / "rank-0.log").unlink()
    setup_logging(0, run)
    logging.getLogger("x").error("a line")
    setup_logging(0, None)  # replaces (and closes) the file handler
    assert "a line" in (run / "logs" / "rank-0.log").read_text()


def test_a_run_log_closed_already_is_replaced_without_an_error(tmp_path: Path) -> None:
    """The rank's log file handler, its file closed already (logging.shutdown at an exit, a
    second close): setting logging up again replaces it; ``python -m train`` run twice in one
    process failed on it with "I/O operation on closed file" (test order)."""
    import logging

    from train.logsetup import setup_logging

    setup_logging(0, tmp_path / "a")
    for h in logging.getLogger().handlers:
        train_file = getattr(h, "_train_handler", False) and hasattr(h, "stream")
        if train_file and h.stream is not sys.stderr:
            h.stream.close()
    setup_logging(0, tmp_path / "b")
    logging.getLogger("x").error("a line")
    setup_logging(0, None)
    assert "a line" in (tmp_path / "b" / "logs" / "rank-0.log").read_text()


# -- the owner's tables ---------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[3]


def test_architecture_draws_the_owners_layout() -> None:
    from train.runfiles import LAYOUT

    text = (REPO / "ARCHITECTURE.md").read_text()
    section = text.split("## Files a run leaves behind (RUN_DIR)", 1)[1]
    table = section[section.index("| path |") :].split("\n\n", 1)[0].splitlines()[2:]
    assert table == [f"| `{e.path}` | {e.holds} | {e.writer} | {e.reader} |" for e in LAYOUT]


def test_every_list_of_event_names_is_the_tables() -> None:
    from typing import get_args

    from jobs import drill, follow, goodput, plot
    from jobs.cli import DRILLS
    from train import history
    from train.runfiles import EVENT_KINDS, EVENT_OF_KIND, FAILURE_CLASSES, events_where
    from train.spec.policy import FailureRule
    from train.stop import causes, decision, quarantine, step

    names = {k.name for k in EVENT_KINDS}
    assert set(history.EVENTS) == names and len(history.EVENTS) == len(names)
    stops = events_where(interrupts=True)
    assert set(history.STOP_EVENTS) == stops == set(plot.STOPS) == set(plot._COLORS)
    assert decision.EVENT_OF_KIND is EVENT_OF_KIND and set(EVENT_OF_KIND.values()) == stops
    assert stops | {"complete", "budget_exhausted", "restart_in_place"} == goodput._ENDS
    assert set(goodput._TERMINAL) == follow._FINAL_EVENTS == set(history.FINAL_EVENTS)
    assert stops | follow._FINAL_EVENTS <= follow._HURRY
    assert set(drill.KINDS) == set(DRILLS) and stops >= drill._STOP_EVENTS
    assert set(history.FINAL_EVENTS) <= step._SETTLED and stops <= quarantine._ENDS
    # the failure classes: the spec's rules and the causes' type say the same as the table
    assert set(get_args(causes.FailureClass)) == set(FAILURE_CLASSES)
    assert set(get_args(FailureRule.model_fields["cause"].annotation)) == set(FAILURE_CLASSES)
    assert {f"failure_{c}" for c in FAILURE_CLASSES} <= set(history.BUDGETS)


def test_rename_moves_ours_and_never_over_or_from_a_link(tmp_path: Path, victim: Path) -> None:
    from train.runfiles import rename

    (tmp_path / "a").write_text("new")
    (tmp_path / "dst").mkdir()
    rename(tmp_path / "a", tmp_path / "dst" / "b")
    assert (tmp_path / "dst" / "b").read_text() == "new" and not (tmp_path / "a").exists()
    (tmp_path / "dst" / "c").symlink_to(victim)
    (tmp_path / "d").write_text("x")
    with pytest.raises(LinkRefusedError):
        rename(tmp_path / "d", tmp_path / "dst" / "c")
    (tmp_path / "e").symlink_to(victim)
    with pytest.raises(NotOursError):
        rename(tmp_path / "e", tmp_path / "dst" / "f")
    assert victim.read_text() == "x" * 15000 and (tmp_path / "dst" / "c").is_symlink()
