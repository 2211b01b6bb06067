"""``python -m cluster env`` (issue 45): the export lines ``up`` ends with, for a shell in which
plain ``sbatch`` must reach the local cluster; nothing is started."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cluster import cli


def test_env_prints_the_export_lines_of_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state dir"
    assert cli.main(["--state-dir", str(state), "env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    lc = cli._cluster(cli._parser().parse_args(["--state-dir", str(state), "env"]))
    assert lines == cli._exports(lc)
    assert lines[0] == f"export SLURM_CONF={shlex.quote(str(lc.conf))}"
    assert str(lc.conf).startswith(str(state))
    assert not state.exists()  # nothing started, nothing written
