"""scripts/test.sh without pytest: which runs it starts for which Slurm release (issue 43).

The script is copied into a folder of its own beside a stub ``.venv/bin/python`` that records
its arguments and the release and worker base it was given, so what ``make test`` runs on each
release (the whole suite on one, the integration tests marked ``release_sensitive`` on the
others, on worker clusters of their own) is checked without a cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STUB = r"""#!/bin/bash
release="${SLURM_TRAIN_TEST_SLURM:-default}"
printf '%s|%s|%s\n' "$release" "${SLURM_TRAIN_TEST_WORKER_BASE:-unset}" "$*" >> "${STUB_LOG}"
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
            release, worker_base, argv = line.split("|", 2)
            calls.append((release, worker_base, argv))
    return proc, sorted(calls)


def _marker(argv: str) -> str:
    return argv.split(" -m ", 1)[1].split(" -n ")[0]


def test_by_default_the_other_releases_run_their_release_sensitive_tests_beside(
    tmp_path: Path,
) -> None:
    proc, calls = _run(tmp_path, "integration", SLURM_TRAIN_TEST_WORKER_BASE="10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [(r, b, _marker(a)) for r, b, a in calls]
    assert got == [
        ("24.11", "16", "integration and release_sensitive"),  # after the default run's 6
        ("26.05", "19", "integration and release_sensitive"),  # and 24.11's 3 workers
        ("default", "10", "integration"),
    ]
    assert "== integration tests on Slurm 24.11 (release_sensitive) ==" in proc.stdout


def test_one_release_alone_and_another_main_release(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "integration", SLURM_RELEASES="none")
    assert proc.returncode == 0 and [c[0] for c in calls] == ["default"]
    proc, calls = _run(tmp_path, "integration", SLURM_TRAIN_TEST_SLURM="24.11")
    # the whole suite on 24.11 (SLURM_TRAIN_TEST_SLURM), the others' selection beside it
    assert sorted(c[0] for c in calls) == ["22.05", "24.11", "26.05"]
    assert [_marker(a) for r, _, a in calls if r == "24.11"] == ["integration"]
    proc, calls = _run(tmp_path, "unit")
    assert proc.returncode == 0 and [c[0] for c in calls] == ["default"]  # no cluster at all


def test_a_failing_release_fails_the_run(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, "integration", STUB_FAIL="26.05")
    assert proc.returncode == 3, proc.stdout + proc.stderr


@pytest.mark.parametrize("bad", ["23.02", "24.11 latest"])
def test_an_unknown_release_is_one_line_and_exit_2(tmp_path: Path, bad: str) -> None:
    proc, calls = _run(tmp_path, "integration", SLURM_RELEASES=bad)
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.strip().splitlines() == [
        f"scripts/test.sh: SLURM_RELEASES: unknown release '{bad.split()[-1]}' "
        "(22.05, 24.11, 26.05 or none)"
    ]
