"""``python -m jobs drill`` against the built-in trainer on the real local cluster.

One small training job, four drills in a row through the real CLI: ``preempt`` (a real
preemption through ``urgent``), ``timeout`` (a lowered time limit), ``fail`` (every process
killed by SIGABRT, then requeued by the drill) and last ``cancel``. Preemption, time limit and
cancel must lose no step (the trainer checkpoints at the step the signal found it); a crash
gives no chance to save, so it may lose at most the steps since the newest periodic checkpoint.
"""

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

INTERVAL = 20
SPEC: dict[str, Any] = {
    "name": "drill-it",
    "resources": {
        "partition": "debug",
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": 1,
        "time": "00:30:00",
    },
    "requeue": {"signal": "USR2", "signal_delay_s": 30},
    # each step sleeps 50 ms after it is done (tests/hooks; the parameters do not change): the
    # job trains through every drill without taking a whole core from the other test workers
    "environment": {
        "variables": {
            "PYTHONPATH": f"{REPO / 'tests' / 'hooks'}:{REPO}",
            "TRAIN_TEST_STEP_S": "0.05",
            "OMP_NUM_THREADS": "1",
        }
    },
    # other tests on a shared cluster pin their `urgent` jobs to n1: stay off it, so that
    # only this test interrupts this job
    "launch": {"sbatch_args": {"exclude": "n1"}},
    "train": {
        "model": "tinycnn",
        "width": 8,
        "data": {"kind": "synthetic", "train_size": 1024, "test_size": 64},
        "max_steps": 1_000_000,
        "batch_size": 32,
        "strategy": "single",
        "num_threads": 1,
        "log_interval": 1,
        "checkpoint": {"interval_steps": INTERVAL, "keep_last": 2},
    },
}


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


def drill(run: ByoRun, kind: str) -> dict[str, Any]:
    proc = run.jobs("drill", run.job_id, "--kind", kind, "--json", "--timeout", "400", timeout=500)
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\n{run.log()}"
    report: dict[str, Any] = json.loads(proc.stdout)
    print(json.dumps(report))  # the figures, with pytest -rP
    assert report["kind"] == kind and report["job_id"] == run.job_id
    return report


@pytest.mark.long(100)
@pytest.mark.timeout(1800)
def test_drills_of_each_kind_against_the_built_in_trainer(run: ByoRun) -> None:
    run.submit(SPEC)
    for kind, event in (("preempt", "preempted"), ("timeout", "timeout")):
        report = drill(run, kind)
        assert report["outcome"].startswith("back: resumed at step"), report
        assert report["stop_event"] == event, report
        assert report["steps_lost"] == 0, report
        assert report["checkpoint_step"] == report["last_completed_step"] > 0, report
        assert report["resumed_from_step"] == report["checkpoint_step"], report
        assert 0 < report["signal_to_checkpoint_s"] < 120, report
        assert 0 < report["restart_to_first_step_s"] < 300, report

    report = drill(run, "fail")
    assert report["outcome"].startswith("back: resumed at step"), report
    # a crash: the ranks record nothing; the job's script restarts the step in place and
    # records the step's failure itself (issue 26)
    assert report["outcome"].endswith("(restarted in place, the same allocation)"), report
    assert report["stop_event"] == "failure", report
    assert 0 <= report["steps_lost"] <= INTERVAL, report  # since the newest periodic save
    assert 0 < report["restart_to_first_step_s"] < 300, report

    report = drill(run, "cancel")
    assert report["outcome"] == "cancelled, not requeued", report
    assert report["stop_event"] == "cancelled"
    assert report["steps_lost"] == 0, report
    assert run.wait_final(60) == "CANCELLED"

    history = [e["event"] for e in run.events()]
    assert history.count("preempted") == 1 and history.count("timeout") == 1, history
    assert history.count("cancelled") == 1 and "budget_exhausted" not in history, history
