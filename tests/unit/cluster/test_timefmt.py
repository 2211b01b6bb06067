"""Slurm time strings, as --time, MaxTime and Elapsed write them."""

from __future__ import annotations

import pytest

from cluster.errors import SlurmTimeError
from cluster.timefmt import format_slurm_time, parse_slurm_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        (30, 1800),
        ("5:30", 330),
        ("02:00:00", 7200),
        ("1-0", 86400),
        ("1-12", 129600),
        ("1-12:30", 131400),
        ("2-00:00:07", 172807),
        ("UNLIMITED", None),
        ("infinite", None),
        ("00:00:03.123", 3),
    ],
)
def test_parse(text: str | int, seconds: int | None) -> None:
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "-5", "1-", "abc", "1.5"])
def test_rejects(text: str) -> None:
    with pytest.raises(SlurmTimeError, match="not a Slurm time"):
        parse_slurm_time(text)


def test_rejects_bool_and_negative() -> None:
    with pytest.raises(SlurmTimeError):
        parse_slurm_time(True)
    with pytest.raises(SlurmTimeError):
        parse_slurm_time(-1)


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "UNLIMITED"), (59, "00:00:59"), (90061, "1-01:01:01")]
)
def test_format_round_trip(seconds: int | None, text: str) -> None:
    assert format_slurm_time(seconds) == text
    assert parse_slurm_time(text) == seconds
