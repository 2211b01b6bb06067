"""scripts/test_summary.py: the last lines of scripts/test.sh say what each half ran and each
failure with its half and the first line of its message, from pytest's own JUnit reports (a
real pytest run here); a report that is missing or damaged is one line, never a failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUMMARY = REPO / "scripts" / "test_summary.py"

CASES = """
import pytest

def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "one is not two\\nsecond line"

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
"""


def test_the_summary_names_each_failure_with_its_release(tmp_path: Path) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "test_cases.py").write_text(CASES)
    results = tmp_path / "results"
    results.mkdir()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={results / 'integration-24.11.xml'}", "cases"],
                   cwd=tmp_path, capture_output=True, timeout=120, check=False)  # fmt: skip
    (results / "unit.xml").write_text("<testsuites><testsuite tests='1'")  # torn: it died
    out = subprocess.run([sys.executable, str(SUMMARY), str(results)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()  # fmt: skip
    assert out[0].startswith("== summary")
    assert out[1].startswith("unit: no report")  # unit first, in one line
    assert out[2].startswith("integration on Slurm 24.11: 1 passed, 1 skipped, 1 failed")
    assert out[3].startswith("  FAILED cases/test_cases.py::test_fails: ")
    assert "one is not two" in out[3] and "second line" not in out[3]
    assert len(out) == 4


def test_no_report_at_all_is_said(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()  # fmt: skip
    assert out[1] == "no report: no half finished"
