"""jobs.confcache: cluster facts kept on slurm.conf's stamp, read tolerantly, written as ours."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from jobs.confcache import UNSTAMPED_TTL_S, read_entry, write_entry


def test_an_entry_lives_as_long_as_its_stamp(tmp_path: Path) -> None:
    write_entry(tmp_path / "state", "x.json", "conf:1", {"a": 1})
    assert read_entry(tmp_path / "state", "x.json", "conf:1") == {
        "a": 1, "stamp": "conf:1", "at": pytest.approx(time.time(), abs=5)
    }  # fmt: skip
    assert read_entry(tmp_path / "state", "x.json", "conf:2") is None  # slurm.conf edited
    assert read_entry(tmp_path / "state", "x.json", "conf:1", ttl_s=0) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"stamp": "conf:1"}',
        '{"stamp": "conf:1", "at": "soon"}',
        json.dumps({"stamp": "conf:1", "at": 4102444800.0}),  # 2100: written by a clock ahead
    ],
)
def test_a_damaged_foreign_or_future_entry_reads_as_none(tmp_path: Path, text: str) -> None:
    (tmp_path / "x.json").write_text(text)
    assert read_entry(tmp_path, "x.json", "conf:1") is None


def test_an_unstamped_configuration_keeps_an_entry_an_hour(tmp_path: Path) -> None:
    old = {"stamp": "x:missing", "at": time.time() - UNSTAMPED_TTL_S - 1}
    (tmp_path / "x.json").write_text(json.dumps(old))
    assert read_entry(tmp_path, "x.json", "x:missing") is None


def test_a_link_planted_as_the_entry_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    state = tmp_path / "state"
    state.mkdir()
    os.symlink(victim, state / "x.json")
    write_entry(state, "x.json", "conf:1", {"a": 1})  # refused, silently: no cache
    assert victim.read_text() == "keep"
