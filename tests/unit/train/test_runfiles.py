"""Issue 29: a symbolic link planted in the run directory is never written through (events,
heartbeats, hang stacks and reports, metrics, markers): the write is refused and the file
elsewhere is untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from train.hang.heartbeat import Heartbeat
from train.history import RunHistory
from train.runfiles import LinkRefusedError, open_text, touch, write_text


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
