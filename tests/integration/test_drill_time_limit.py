"""``jobs drill --kind timeout`` on the real cluster leaves the job's time limit as it found
it (issue 29): lowered to drill the time limit, put back once the job is requeued, and read
back; the restarted job trains on under its original limit. (As root this user may raise a
limit; the refusal where it may not is tests/unit/jobs/test_drill.py.)"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from byo_helpers import ByoRun, open_run
from test_byo_drill import SPEC

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


@pytest.mark.long(77)
@pytest.mark.timeout(900)
def test_timeout_drill_puts_the_time_limit_back(run: ByoRun) -> None:
    run.submit({**SPEC, "name": "drill-limit"})
    before = run.client.show_job(run.job_id)["TimeLimit"]
    proc = run.jobs(
        "drill", run.job_id, "--kind", "timeout", "--json", "--timeout", "400", timeout=500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["stop_event"] == "timeout", report
    assert report["outcome"].startswith("back: resumed at step"), report
    assert f"time limit restored to {before} (read back)" in report["notes"], report
    shown = run.client.show_job(run.job_id)
    assert shown["TimeLimit"] == before and shown["JobState"] == "RUNNING", shown
