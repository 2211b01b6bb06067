"""What the batch script does after a step (train.stop.step) that the ranks could not finish
themselves (issue 44): a run rank 0 completed stays complete whatever a rank exits with after it
(item 2), and a requeue Slurm refused the ranks is retried here, its outcome recorded (item 10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from train.history import RunHistory, attempt_completed_at
from train.spec.config import RequeueConfig
from train.stop.decision import REQUEUE_EXIT_CODE
from train.stop.step import after_step, requeue_after_step

BUDGETS = RequeueConfig(max_restarts_in_place=2)


class _Slurm:
    """``scontrol requeue`` refused ``refusals`` times (the controller away), then taken;
    ``show_job`` says how often Slurm restarted the job (``restarts``)."""

    def __init__(self, refusals: int = 0, restarts: int = 0) -> None:
        self.refusals, self.restarts = refusals, restarts
        self.asked: list[str] = []
        self.requeued: list[str] = []

    def requeue(self, job_id: str) -> None:
        self.asked.append(job_id)
        if len(self.asked) <= self.refusals:
            raise RuntimeError("scontrol exited 1: Unable to contact slurm controller")
        self.requeued.append(job_id)

    def show_job(self, job_id: str) -> dict[str, str]:
        return {"JobState": "RUNNING", "Restarts": str(self.restarts)}


def _names(run: Path) -> list[str]:
    return [e["event"] for e in RunHistory(run).events()]


def _complete(run: Path, **fields: Any) -> None:
    RunHistory(run).append("complete", step=100, restart_count=1, job_id="7", **fields)


# -- item 2: what a completed run is -------------------------------------------------------------
@pytest.mark.parametrize("code", [1, 134, 137, REQUEUE_EXIT_CODE, 3])
def test_a_rank_that_fails_after_rank_0_completed_the_run_leaves_it_complete(
    tmp_path: Path, code: int
) -> None:
    """gloo's abort at exit (134), an OOM kill in teardown (137), any code: the script ends 0
    (sacct COMPLETED, afterok fires), and nothing is recorded or requeued."""
    _complete(tmp_path)
    client = _Slurm()
    code = after_step(tmp_path, BUDGETS, job_id="7", restart_count=1, in_place=0,
                      exit_code=code, client=client)  # fmt: skip
    assert code == 0
    assert _names(tmp_path) == ["complete"] and client.asked == []


def test_a_complete_of_another_attempt_or_job_does_not_count(tmp_path: Path) -> None:
    _complete(tmp_path)  # attempt 1 of job 7
    RunHistory(tmp_path).append("complete", step=9, restart_count=0, job_id="8", in_place=1)
    for job, restart, in_place in (("7", 0, 0), ("7", 1, 1), ("8", 0, 0), ("9", 1, 0)):
        assert after_step(tmp_path, BUDGETS, job_id=job, restart_count=restart,
                          in_place=in_place, exit_code=2) == 2  # fmt: skip


def test_one_definition_of_complete() -> None:
    events = [
        {"event": "complete", "job_id": 7, "restart_count": 1, "time": 5.0},
        {"event": "complete", "job_id": "7", "restart_count": 2, "in_place": 1, "time": 9.0},
        {"event": "complete", "job_id": "7", "restart_count": "3"},  # damaged: never counts
        {"event": "complete", "job_id": "7", "restart_count": "0"},
        {"event": "complete", "job_id": "7", "restart_count": 4, "in_place": "x"},
    ]
    assert attempt_completed_at(events, job_id="7", restart_count=1) == 5.0
    assert attempt_completed_at(events, job_id="7", restart_count=2, in_place=1) == 9.0
    assert attempt_completed_at(events, job_id="7", restart_count=2) is None
    assert attempt_completed_at(events, job_id="7", restart_count=3) is None
    assert attempt_completed_at(events, job_id="7", restart_count=0) is None
    assert attempt_completed_at(events, job_id="7", restart_count=4) is None
    assert attempt_completed_at(events, job_id=None, restart_count=1) is None


# -- item 10: a requeue Slurm refuses ------------------------------------------------------------
def _refused(run: Path) -> None:
    """The ranks' record of a requeue Slurm refused them (train.stop.act.carry_out)."""
    history = RunHistory(run)
    history.append("preempted", step=40, restart_count=0, job_id="7", action="requeue")
    history.append("requeue_failed", step=40, restart_count=0, job_id="7", by="rank",
                   error="Unable to contact slurm controller", then="exit 75")  # fmt: skip


def test_a_refused_requeue_is_retried_by_the_batch_script(tmp_path: Path) -> None:
    _refused(tmp_path)
    client = _Slurm(refusals=2)
    code = after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0,
                      exit_code=REQUEUE_EXIT_CODE, client=client)  # fmt: skip
    assert code == 0 and client.requeued == ["7"] and len(client.asked) == 3
    last = RunHistory(tmp_path).events()[-1]
    assert last["event"] == "requeue" and last["via"] == "batch_script", last
    assert last["step"] == 40 and last["tries"] == 3


def test_a_requeue_refused_to_the_end_is_recorded_as_failed(tmp_path: Path) -> None:
    _refused(tmp_path)
    client = _Slurm(refusals=99)
    waited: list[float] = []
    code = requeue_after_step(RunHistory(tmp_path), "7", 0, 0, client=client,
                              sleep=waited.append)  # fmt: skip
    assert code == REQUEUE_EXIT_CODE and client.requeued == [] and waited == [1.0, 2.0, 4.0, 8.0]
    assert _names(tmp_path) == ["preempted", "requeue_failed", "requeue_failed"]
    last = RunHistory(tmp_path).events()[-1]
    assert last["by"] == "batch_script" and last["tries"] == 5 and "controller" in last["error"]
    assert "requeue" not in _names(tmp_path)  # never recorded as done


def test_a_requeue_that_slurm_made_meanwhile_is_recorded_as_slurms(tmp_path: Path) -> None:
    """The first try's answer was lost but Slurm requeued the job (or its grace ended): the
    job's restart count moved on, and a second requeue would be refused."""
    _refused(tmp_path)
    client = _Slurm(refusals=99, restarts=1)
    code = requeue_after_step(RunHistory(tmp_path), "7", 0, 0, client=client, sleep=lambda s: None)
    assert code == 0 and len(client.asked) == 1
    assert RunHistory(tmp_path).events()[-1]["via"] == "slurm"


def test_every_fallback_of_the_decision_is_carried_out_by_the_scripts() -> None:
    """The rendered script and every template that runs `python -m train` hand a step's exit
    code to train.stop.step (which carries out a restart in place, a refused requeue, a
    completed run): none ends on the step's code by itself."""
    from jobs.executor import in_place_loop

    root = Path(__file__).resolve().parents[3] / "sbatch_templates"
    for name in ("ddp", "dataparallel", "array", "requeue"):
        text = (root / f"{name}.sbatch").read_text()
        assert "-m train.stop.step" in text, name
    assert "--after-step" in in_place_loop("srun true", Path("/tmp/x"))


def test_a_failure_knows_where_a_restart_would_resume(tmp_path: Path) -> None:
    """The no-progress rule's fact (issue 44 item 6): the newest committed checkpoint (its
    manifest written last), never an uncommitted one or a link."""
    from train.stop.facts import gather, newest_checkpoint_step

    root = tmp_path / "checkpoints"
    for name, committed in (("step-10", True), ("step-15.b1", True), ("step-20", False)):
        (root / name).mkdir(parents=True)
        if committed:
            (root / name / "manifest.json").write_text("{}")
    (root / "step-99").symlink_to(root / "step-10")
    assert newest_checkpoint_step(tmp_path) == 15
    assert newest_checkpoint_step(tmp_path / "nowhere") is None
    facts = gather("failure", job_id=None, restart_count=0, run_dir=tmp_path, signal_delay_s=90)
    assert facts.checkpoint_step == 15
    signal = gather("signal", job_id=None, restart_count=0, run_dir=tmp_path, signal_delay_s=90)
    assert signal.checkpoint_step is None  # a stop that saves makes its own progress


def test_a_refused_requeue_is_retried_whatever_code_the_step_ended_with(tmp_path: Path) -> None:
    """The rank that decided exited 75 but another rank was killed meanwhile: srun's code is
    137. The ranks' decision (a requeue Slurm refused) is still carried out."""
    _refused(tmp_path)
    client = _Slurm()
    code = after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0,
                      exit_code=137, client=client)  # fmt: skip
    assert code == 0 and client.requeued == ["7"]
    assert _names(tmp_path)[-1] == "requeue"
    # carried out once: asked again, the step's end is settled
    assert after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0,
                      exit_code=137, client=client) == 137  # fmt: skip
    assert client.requeued == ["7"]


def test_a_link_of_a_chain_that_exits_75_ends_for_the_next_link(tmp_path: Path) -> None:
    """requeue.mode chain (issue 48, jobs.chain): the link's exit 75 ends the batch script with
    75 at once (the job FAILED, the next link's afternotok met), no scontrol requeue tried."""
    RunHistory(tmp_path).append("requeue", step=9, restart_count=0, job_id="7", via="chain")
    client = _Slurm()
    chain = RequeueConfig(max_restarts_in_place=2, mode="chain")
    code = after_step(tmp_path, chain, job_id="7", restart_count=0, in_place=0,
                      exit_code=REQUEUE_EXIT_CODE, client=client)  # fmt: skip
    assert code == REQUEUE_EXIT_CODE and client.asked == []
    assert _names(tmp_path) == ["requeue"]
