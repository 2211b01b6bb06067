"""scripts/test.sh without pytest: which runs it starts for which Slurm release (issue 43).

The script is copied into a folder of its own beside a stub ``.venv/bin/python`` that records
its arguments, the release and worker base it was given, and whether another run of it was
going on at the time, so what ``make test`` runs on each release (the whole suite on one, the
whole integration half on each other one, one after another) is checked without a cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STUB = r"""#!/bin/bash
release="${SLURM_TRAIN_TEST_SLURM:-default}"
beside=alone
if ! mkdir "${STUB_LOG}.running" 2>/dev/null; then beside=beside; fi
printf '%s|%s|%s|%s\n' "$release" "${SLURM_TRAIN_TEST_WORKER_BASE:-unset}" "$beside" "$*" \
    >> "${STUB_LOG}"
sleep 0.3
[[ "$beside" == alone ]] && rmdir "${STUB_LOG}.running"
if [[ "$release" == "${STUB_FAIL:-}" ]]; then exit 3; fi
exit 0
"""


def _run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list]:
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(REPO / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(STUB)
    python.chmod(0o755)
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "IT_", "REL_"))}
    proc = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "test.sh"), *args],
        env={**base, "STUB_LOG": str(log), **env}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    calls = []
    if log.exists():
        for line in log.read_text().splitlines():
            release, worker_base, beside, argv = line.split("|", 3)
            calls.append((release, worker_base, beside, argv))
    # the last call, once, whatever ran: the summary of each half's report
    # (scripts/test_summary.py, in the results folder the script made and removes)
    summary = [i for i, c in enumerate(calls) if c[3].startswith("scripts/test_summary.py ")]
    if not calls:  # refused before any half ran
        return proc, calls
    assert summary == [len(calls) - 1], calls
    results = calls[-1][3].split(" ", 1)[1]
    assert not Path(results).exists()
    pytests = calls[:-1]
    assert all(f"--junitxml={results}/" in c[3] for c in pytests), pytests
    return proc, pytests


def _marker(argv: str) -> str:
    return re.split(r" -n | --", argv.split(" -m ", 1)[1])[0]


def test_by_default_the_other_releases_run_the_whole_integration_half_one_after_another(
    tmp_path: Path,
) -> None:
    """The default release first, then 24.11, then 26.05, each alone on the same worker
    indexes (each session brings the last one's clusters down)."""
    proc, calls = _run(tmp_path, "integration", SLURM_TRAIN_TEST_WORKER_BASE="10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [(r, b, beside, _marker(a)) for r, b, beside, a in calls]
    assert got == [
        ("default", "10", "alone", "integration"),
        ("24.11", "10", "alone", "integration"),
        ("26.05", "10", "alone", "integration"),
    ]
    assert "== integration tests on Slurm 24.11 (the whole integration half) ==" in proc.stdout


def test_all_runs_the_other_releases_after_both_halves_of_the_default_one(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(r, _marker(a)) for r, _, _, a in calls[:2]] in (
        [("default", "integration"), ("default", "not integration")],
        [("default", "not integration"), ("default", "integration")],
    )
    # (whether the unit half's stub met the other's is timing: not asserted)
    assert [(r, beside, _marker(a)) for r, _, beside, a in calls[2:]] == [
        ("24.11", "alone", "integration"),
        ("26.05", "alone", "integration"),
    ]


def test_one_release_alone_and_another_main_release(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "integration", SLURM_RELEASES="none")
    assert proc.returncode == 0 and [c[0] for c in calls] == ["default"]
    proc, calls = _run(tmp_path, "integration", SLURM_TRAIN_TEST_SLURM="24.11")
    # the whole suite on 24.11 (SLURM_TRAIN_TEST_SLURM), then the others' integration halves
    assert [c[0] for c in calls] == ["24.11", "22.05", "26.05"]
    assert {_marker(a) for *_, a in calls} == {"integration"}
    proc, calls = _run(tmp_path, "unit")
    assert proc.returncode == 0 and [c[0] for c in calls] == ["default"]  # no cluster at all


def test_a_failing_release_fails_the_run_and_the_next_release_still_runs(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "integration", STUB_FAIL="24.11")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert [c[0] for c in calls] == ["default", "24.11", "26.05"]


@pytest.mark.parametrize("bad", ["23.02", "24.11 latest"])
def test_an_unknown_release_is_one_line_and_exit_2(tmp_path: Path, bad: str) -> None:
    proc, calls = _run(tmp_path, "integration", SLURM_RELEASES=bad)
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.strip().splitlines() == [
        f"scripts/test.sh: SLURM_RELEASES: unknown release '{bad.split()[-1]}' "
        "(22.05, 24.11, 26.05 or none)"
    ]
