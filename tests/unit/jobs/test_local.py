"""--executor local: a detached supervisor runs the ranks with torchrun-style variables."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.monitor import task_states
from jobs.records import find_run

sys.path.insert(0, str(Path(__file__).parent))
import env_probe

pytestmark = pytest.mark.slow  # each rank imports torch (python -m train)

SPEC = """name: local-demo
resources: {nodes: 1, ntasks_per_node: 2, time: 5}
entrypoint:
  command: [sh, -c, 'echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK via $MASTER_ADDR"; %s']
"""


def _no_client() -> object:
    raise AssertionError("a local run never asks Slurm")


def test_local_run_follows_to_completed_with_per_rank_logs(tmp_path: Path) -> None:
    spec = tmp_path / "local.yaml"
    spec.write_text(SPEC % "true")
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local", "--follow"], out) == 0
    job_id = out.getvalue().splitlines()[0]
    assert job_id.startswith("local-")
    assert f"{job_id}: COMPLETED" in out.getvalue()
    logs = io.StringIO()
    assert main(["logs", job_id, "--rank", "1"], logs) == 0
    assert "rank 1 of 2 local 1 via 127.0.0.1" in logs.getvalue()


def test_local_run_cancel(tmp_path: Path) -> None:
    spec = tmp_path / "local.yaml"
    spec.write_text(SPEC % "sleep 60")
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local"], out) == 0
    job_id = out.getvalue().strip()
    record = find_run(job_id)
    deadline = time.monotonic() + 60
    while task_states(record, _no_client)[job_id].state != "RUNNING":  # type: ignore[arg-type]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelled = io.StringIO()
    assert main(["cancel", job_id], cancelled) == 0
    assert f"cancelled {job_id}" in cancelled.getvalue()
    while task_states(record, _no_client)[job_id].state != "CANCELLED":  # type: ignore[arg-type]
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_local_run_is_not_failed_the_moment_it_is_submitted(
    tmp_path: Path, started: list[str]
) -> None:
    """Its supervisor is proven by its command line, which the kernel sets up only after
    ``Popen`` returned: asked at once (``submit --follow`` does), the run read FAILED."""
    spec = tmp_path / "local.yaml"
    spec.write_text(SPEC % "sleep 30")
    for _ in range(5):
        out = io.StringIO()
        assert main(["submit", str(spec), "--executor", "local"], out) == 0
        started.append(job_id := out.getvalue().strip())
        state = task_states(find_run(job_id), _no_client)[job_id]  # type: ignore[arg-type]
        assert state.state in ("PENDING", "RUNNING"), state


# -- the requeue contract and no orphans (issue 14.4) ---------------------------------------------
REPO = Path(__file__).resolve().parents[3]
# A step takes a few ms here (one thread: tests run beside each other). The tests act on the
# run's progress (metrics.jsonl), which it writes every step (log_interval=1): at the default 50,
# the first progress a test could see was step 50, and a 60-step run could end before the
# test's signal reached it.
TRAIN = [
    "--set", "resources.nodes=1", "--set", "train.max_steps=400", "--set", "train.width=4",
    "--set", "train.batch_size=16", "--set", "train.data.train_size=1024",
    "--set", "train.data.test_size=32", "--set", "train.checkpoint.interval_steps=1000",
    "--set", "train.strategy=single", "--set", "train.log_interval=1",
    "--set", "train.num_threads=1",
]  # fmt: skip


@pytest.fixture
def started() -> Iterator[list[str]]:
    """Job ids of local runs a test starts: cancelled afterwards (a failed test leaves none)."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        main(["cancel", job_id], io.StringIO())


def _submit_training(tmp_path: Path, started: list[str], steps: int = 400) -> str:
    out = io.StringIO()
    cmd = ["submit", str(REPO / "examples" / "cifar.yaml"), "--executor", "local", *TRAIN]
    cmd += ["--set", f"train.max_steps={steps}"]
    assert main(cmd, out) == 0
    started.append(out.getvalue().strip())
    return started[-1]


def _wait(what: Callable[[], bool], timeout: float = 120, poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll)


def _step(run_dir: str) -> int:
    from jobs.records import latest_progress

    step = latest_progress(run_dir).get("step")
    return step if isinstance(step, int) else -1


def test_local_requeue_request_restarts_the_run_with_resume(
    tmp_path: Path, started: list[str]
) -> None:
    """A rank that checkpoints and exits 75 was marked FAILED; now it restarts and resumes."""
    from jobs.localrun import read_state
    from train.history import RunHistory

    # The request must reach a run in training: it is sent as soon as the run has done 10 of
    # its 300 steps (it lands near step 20), so that ~280 steps still lie between it and the end.
    job_id = _submit_training(tmp_path, started, steps=300)
    record = find_run(job_id)
    assert record.pid is not None
    _wait(lambda: _step(record.run_dir) >= 10, poll=0.05)
    os.kill(record.pid, signal.SIGUSR2)  # a requeue request, like Slurm's signal
    _wait(lambda: task_states(record, _no_client)[job_id].state == "COMPLETED", timeout=180)  # type: ignore[arg-type]
    events = [e["event"] for e in RunHistory(record.run_dir).events() if e["event"] != "checkpoint"]
    assert events == ["start", "signal", "preempted", "requeue", "resume", "complete"], events
    resume = next(e for e in RunHistory(record.run_dir).events() if e["event"] == "resume")
    assert resume["step"] >= 10 and resume["restart_count"] == 1
    assert read_state(record.run_dir)["tasks"][job_id]["restarts"] == 1
    status = io.StringIO()
    assert main(["status", job_id], status) == 0
    assert "preempted 1x, resumed at step" in status.getvalue()


def test_a_killed_supervisor_leaves_no_rank_training(tmp_path: Path, started: list[str]) -> None:
    from jobs.localrun import read_state
    from jobs.pids import ProcHandle

    job_id = _submit_training(tmp_path, started)
    record = find_run(job_id)
    assert record.pid is not None
    _wait(lambda: _step(record.run_dir) >= 5, poll=0.05)
    ranks = [ProcHandle.from_json(r) for r in read_state(record.run_dir)["tasks"][job_id]["ranks"]]
    assert ranks and all(r is not None and r.alive() for r in ranks)
    os.kill(record.pid, signal.SIGKILL)
    _wait(lambda: not any(r is not None and r.alive() for r in ranks), timeout=60)
    info = task_states(record, _no_client)[job_id]  # type: ignore[arg-type]
    assert (info.state, info.reason) == ("FAILED", "local supervisor is gone")
    out = io.StringIO()
    assert main(["cancel", job_id], out) == 0
    assert "nothing running" in out.getvalue()
    assert _step(record.run_dir) < 400  # it did not train on to the end
    from train.history import RunHistory

    events = [e["event"] for e in RunHistory(record.run_dir).events()]
    assert events[-1] == "cancelled" and "requeue" not in events  # no restart is pretended


def test_a_failing_local_run_is_restarted_within_its_failure_budget(tmp_path: Path) -> None:
    from train.history import RunHistory

    spec = tmp_path / "fails.yaml"
    spec.write_text(
        (SPEC % "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 1").replace(
            "resources: {nodes: 1, ntasks_per_node: 2, time: 5}",
            "resources: {nodes: 1, ntasks_per_node: 1, time: 5}\nrequeue: {max_failures: 1}",
        )
    )
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local", "--follow"], out) == 1
    job_id = out.getvalue().splitlines()[0]
    assert f"job {job_id}: FAILED" in out.getvalue()
    record = find_run(job_id)
    events = [e["event"] for e in RunHistory(record.run_dir).events()]
    assert events.count("failure") == 2 and events[-1] == "budget_exhausted", events
    assert "requeue" in events  # the first failure was within the budget: restarted once
    # every event carries the submission (no Slurm job id here): budgets per submission hold
    ids = {e.get("submission") for e in RunHistory(record.run_dir).events()}
    assert ids == {job_id}, ids
    logs = io.StringIO()
    assert main(["logs", job_id], logs) == 0
    assert "attempt 0" in logs.getvalue() and "attempt 1" in logs.getvalue()


def test_a_local_run_inside_an_allocation_never_takes_that_job_for_its_own() -> None:
    """Issue 29: `--executor local` started from a batch script or a salloc shell took
    SLURM_JOB_ID for its own (its cancel requeued the enclosing job). Its ranks see no
    variable of the enclosing job or step; the project's own and the cluster's config stay."""
    from jobs.localrun import rank_environ
    from train.env import DistEnv

    enclosing = {
        "SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "SLURM_NTASKS": "8",
        "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_RESTART_COUNT": "2", "SLURMD_NODENAME": "n1",
        "SBATCH_PARTITION": "urgent", "SLURM_STEP_ID": "0",
        "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_TRAIN_STATE_DIR": "/s", "HOME": "/root",
    }  # fmt: skip
    env = rank_environ(enclosing)
    assert env == {
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_TRAIN_STATE_DIR": "/s",
        "HOME": "/root",
    }
    assert DistEnv.from_env(env).job_id is None


# -- one spec, one behaviour: the spec's environment (issue 45) ----------------------------------
def test_the_local_executor_applies_the_specs_environment_as_the_batch_script_does(
    tmp_path: Path,
) -> None:
    """A script reading STEPS ran 400 steps instead of 60 on --executor local: the variables
    and the setup block (its exports, cd and umask) reached the batch script only."""
    work = tmp_path / "work dir"
    work.mkdir()
    spec = env_probe.write_spec(tmp_path, work)
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local", "--follow"], out) == 0
    job_id = out.getvalue().splitlines()[0]
    assert f"{job_id}: COMPLETED" in out.getvalue()
    record = find_run(job_id)
    assert record is not None
    run_dir = Path(record.run_dir)
    for rank in (0, 1):
        assert env_probe.seen(run_dir, rank) == {**env_probe.EXPECTED, "pwd": str(work)}


def test_a_failing_setup_fails_the_local_run_before_any_rank_starts(tmp_path: Path) -> None:
    spec = env_probe.write_spec(tmp_path, tmp_path, setup_exit=7)
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local", "--follow"], out) != 0
    job_id = out.getvalue().splitlines()[0]
    assert f"{job_id}: FAILED" in out.getvalue()
    record = find_run(job_id)
    assert record is not None
    state = task_states(record, _no_client)[job_id]  # type: ignore[arg-type]
    assert state.state == "FAILED"
    assert not list(Path(record.run_dir).glob("seen-*"))
    log = (Path(record.run_dir) / "slurm" / "supervisor.log").read_text()
    assert "environment.setup exited 7 before the ranks could start" in log


# -- the state after `jobs cancel` (issue 45) -----------------------------------------------------
def test_status_and_list_show_the_cancel_at_once(tmp_path: Path, started: list[str]) -> None:
    """Right after `jobs cancel` a run whose ranks take a while to stop read RUNNING: it reads
    CANCELLING (from the record the cancel writes) until the supervisor records CANCELLED."""
    spec = tmp_path / "local.yaml"
    stubborn = 'trap "sleep 5; exit 0" TERM; touch "$RUN_DIR/up-$RANK"; sleep 60 & wait'
    spec.write_text(SPEC % stubborn)
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local"], out) == 0
    started.append(job_id := out.getvalue().strip())
    record = find_run(job_id)
    assert record is not None
    _wait(lambda: len(list(Path(record.run_dir).glob("up-*"))) == 2)  # both traps are set
    assert main(["cancel", job_id], io.StringIO()) == 0
    shown, listed = io.StringIO(), io.StringIO()
    assert main(["status", job_id], shown) in (0, 1)
    assert main(["list"], listed) == 0
    assert re.search(rf"{job_id}\s+CANCELLING ", shown.getvalue()), shown.getvalue()
    line = next(ln for ln in listed.getvalue().splitlines() if job_id in ln)
    assert "CANCELLING" in line and "RUNNING" not in line, listed.getvalue()
    _wait(lambda: task_states(find_run(job_id), _no_client)[job_id].state == "CANCELLED")  # type: ignore[arg-type]


def test_a_run_dir_that_cannot_be_made_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unmakeable_run_dir: tuple[Path, Path]
) -> None:
    taken, run_dir = unmakeable_run_dir
    spec = tmp_path / "local.yaml"
    spec.write_text(SPEC % "true" + f"train: {{run_dir: '{run_dir}'}}\n")
    out = io.StringIO()
    assert main(["submit", str(spec), "--executor", "local"], out) == 2  # bad input
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{run_dir}: cannot make the run directory: ")
    assert "Errno" not in err[0]
    assert taken.read_text() == "keep" and out.getvalue() == ""
