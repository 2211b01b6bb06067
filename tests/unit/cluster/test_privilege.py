"""Who may raise a time limit again (the timeout drill asks before it lowers one): parsers on
recorded outputs, and the client's answer from stub Slurm commands."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster import parse
from cluster.client import SlurmClient

DATA = Path(__file__).parent / "data"


def test_slurm_user_uid_from_the_recorded_config() -> None:
    assert parse.parse_slurm_user_uid((DATA / "scontrol_config.txt").read_text()) == 0
    assert parse.parse_slurm_user_uid("SlurmUser               = slurm(64030)\n") == 64030
    assert parse.parse_slurm_user_uid("ClusterName = x\n") is None


@pytest.mark.parametrize(
    ("text", "level"),
    [("Administrator\n", "Administrator"), ("None\n", "None"), ("Operator", "Operator"), ("", "")],
)
def test_admin_level(text: str, level: str) -> None:
    assert parse.parse_admin_level(text) == level


@pytest.mark.parametrize(("level", "may"), [("Operator", True), ("None", False), ("", False)])
def test_an_unprivileged_user_may_raise_only_as_an_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str, may: bool
) -> None:
    for name, text in (
        ("scontrol", "echo 'SlurmUser = slurm(64030)'"),
        ("sacctmgr", f"echo '{level}'"),
    ):
        (tmp_path / name).write_text(f"#!/bin/sh\n{text}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    monkeypatch.setattr("pwd.getpwuid", lambda uid: type("P", (), {"pw_name": "alice"})())
    client = SlurmClient(conf="/nonexistent", environ={"PATH": str(tmp_path)})
    assert client.may_raise_time_limits() is may


def test_root_may_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert SlurmClient(
        conf="/nonexistent", environ={"PATH": "/nonexistent"}
    ).may_raise_time_limits()


@pytest.mark.parametrize(
    ("value", "owner"),
    [
        ("trainee(1001)", ("trainee", 1001)),
        ("root(0)", ("root", 0)),
        ("(4242)", ("", 4242)),  # a uid with no name on the controller
        ("", None),
        ("trainee", None),
        ("x(y)", None),
    ],
)
def test_the_owner_of_a_job_from_scontrols_user_id(value: str, owner: object) -> None:
    assert parse.parse_user_id(value) == owner
