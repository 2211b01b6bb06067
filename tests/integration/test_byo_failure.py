"""A command that fails on its own stays a failure, with its real cause in `jobs status`; a
command stopped by a time limit is not one (real local cluster, real clients)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from byo_helpers import REPO, ByoRun, open_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def spec(command: list[str], **requeue: Any) -> dict[str, Any]:
    return {
        "name": "byo-fail-it",
        "resources": {"partition": "debug", "nodes": 1, "cpus_per_task": 1, "time": "00:10:00"},
        "requeue": {"signal_delay_s": 30, **requeue},
        # other tests on a shared cluster pin their `urgent` jobs to n1: stay off it, so that
        # only this test interrupts this job
        "launch": {"sbatch_args": {"exclude": "n1"}},
        "entrypoint": {"command": command},
    }


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


def test_failing_command_shows_its_real_cause(run: ByoRun) -> None:
    code = "import sys; print('loading data', file=sys.stderr); import no_such_module_h7"
    run.submit(spec(["python", "-c", code], max_failures=0))
    assert run.wait_final(300) == "FAILED", run.log()
    (failure,) = [e for e in run.events() if e["event"] == "failure"]
    assert failure["exit_code"] == 1
    assert "No module named 'no_such_module_h7'" in failure["error"]
    assert "loading data" in failure["stderr_tail"]
    status = run.status()
    assert "No module named 'no_such_module_h7'" in json.dumps(status), status
    assert "failed 1x" in status["history"], status


@pytest.mark.long(83)
def test_time_limit_drill_on_a_command_is_not_a_failure(run: ByoRun) -> None:
    script = str(REPO / "examples" / "byo" / "ignores_signals.py")
    run.submit(spec(["python", script, "--steps", "100000", "--step-time", "0.2"]))
    run.wait("the command to train", lambda: run.steps_done() >= 5, 300)
    proc = run.jobs(
        "drill", run.job_id, "--kind", "timeout", "--json", "--timeout", "300", timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + run.log()
    report = json.loads(proc.stdout)
    assert report["stop_event"] == "timeout" and report["outcome"].startswith("back"), report
    names = [e["event"] for e in run.events()]
    assert "failure" not in names and names.count("timeout") == 1, names

    def starts() -> list[dict[str, Any]]:
        return [p for p in run.progress() if p.get("event") == "start"]

    run.wait("the command to start again", lambda: starts()[-1]["restart"] >= 1, 120)
    assert starts()[-1]["step"] > 0, starts()  # from its last periodic save
