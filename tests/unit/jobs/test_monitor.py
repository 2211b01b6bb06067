"""follow/status/cancel logic against a scripted fake SlurmClient (no Slurm needed)."""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest

from cluster.models import JobInfo
from jobs.follow import follow
from jobs.monitor import cancel, states_many
from jobs.records import RunRecord, TaskRecord


class ScriptedClient:
    """Answers job_states from a script of snapshots; appends log lines as time passes."""

    def __init__(self, snapshots: list[dict[str, str]], log: Path, lines: list[str]) -> None:
        self.snapshots = snapshots
        self.calls: list[list[str]] = []
        self.log = log
        self.lines = lines
        self.cancelled: list[str] = []
        self.commands: list[list[str]] = []

    def cluster_name(self) -> str:  # cluster.Slurm: the state cache's key ("": none named)
        return ""

    def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
        self.calls.append(list(ids))
        n = len(self.calls) - 1
        snap = self.snapshots[min(n, len(self.snapshots) - 1)]
        if n < len(self.lines):
            with self.log.open("a") as f:
                f.write(self.lines[n] + "\n")
        return {k: JobInfo(k, v) for k, v in snap.items()}

    def cancel(self, ids: list[str], *, no_requeue: bool = False) -> None:
        # What SlurmClient.cancel(no_requeue=True) runs first (tests/unit/cluster/test_client.py)
        if no_requeue:
            self.commands += [["scontrol", "update", f"JobId={i}", "Requeue=0"] for i in ids]
        self.cancelled.extend(ids)


def _record(tmp_path: Path, array: int | None = None) -> RunRecord:
    n = array or 1
    tasks = [TaskRecord(i, str(tmp_path / f"t{i}"), {}) for i in range(n)]
    return RunRecord("r-1", "r", str(tmp_path), "slurm", job_id="7", array_size=array, tasks=tasks)


def test_follow_streams_states_logs_events_and_exits_0_on_completed(tmp_path: Path) -> None:
    rec = _record(tmp_path)
    (tmp_path / "slurm").mkdir()
    Path(rec.tasks[0].run_dir).mkdir()
    (Path(rec.tasks[0].run_dir) / "events.jsonl").write_text(json.dumps({"event": "start"}) + "\n")
    snaps = [{"7": "PENDING"}, {"7": "RUNNING"}, {"7": "RUNNING"}, {"7": "COMPLETED"}]
    client = ScriptedClient(snaps, rec.log_file("7", 0), ["", "step 1", "step 2", "done"])
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.01, min_poll_s=0.01) == 0  # type: ignore[arg-type,return-value]
    text = out.getvalue()
    assert "7: PENDING" in text and "7: RUNNING" in text and "7: COMPLETED" in text
    assert text.index("step 1") < text.index("step 2") < text.index("done")
    assert ">> started" in text and '{"event"' not in text  # readable, no raw JSON (issue 19)
    assert text.index("done") < text.index("7: COMPLETED")  # the final state comes last
    assert all(call == ["7"] for call in client.calls)  # one id per poll: one Slurm query


def test_follow_exits_1_unless_every_task_completed(tmp_path: Path) -> None:
    rec = _record(tmp_path, array=2)
    snaps = [{"7_0": "RUNNING", "7_1": "RUNNING"}, {"7_0": "COMPLETED", "7_1": "FAILED"}]
    client = ScriptedClient(snaps, tmp_path / "unused.log", [])
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.01, min_poll_s=0.01) == 1  # type: ignore[arg-type,return-value]
    assert "7_1: FAILED" in out.getvalue()


def test_follow_gives_up_on_a_job_slurm_forgot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobs.follow.UNKNOWN_GIVE_UP_S", 0.05)
    rec = _record(tmp_path)
    client = ScriptedClient([{}], tmp_path / "x.log", [])
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.01, min_poll_s=0.01) == 1  # type: ignore[arg-type,return-value]
    assert "Slurm does not know 7" in out.getvalue()


def test_states_many_is_one_query_for_many_runs(tmp_path: Path) -> None:
    a = _record(tmp_path)
    b = RunRecord(
        "r-2",
        "r",
        str(tmp_path),
        "slurm",
        job_id="9",
        array_size=3,
        tasks=[TaskRecord(i, str(tmp_path), {}) for i in range(3)],
    )
    snap = {"7": "COMPLETED", "9_0": "RUNNING", "9_1": "PENDING"}
    client = ScriptedClient([snap], tmp_path / "x.log", [])
    states = states_many([a, b], lambda: client)  # type: ignore[arg-type,return-value]
    assert client.calls == [["7", "9"]]
    assert {k: v.state for k, v in states.items()} == {
        "7": "COMPLETED",
        "9_0": "RUNNING",
        "9_1": "PENDING",
        "9_2": "UNKNOWN",
    }


def test_cancel_makes_the_job_non_requeueable_first(tmp_path: Path) -> None:
    rec = _record(tmp_path, array=3)
    client = ScriptedClient([{}], tmp_path / "x.log", [])
    assert cancel(rec, lambda: client) == ["7"]  # type: ignore[arg-type,return-value]
    assert client.commands == [["scontrol", "update", "JobId=7", "Requeue=0"]]
    assert client.cancelled == ["7"]
    client = ScriptedClient([{}], tmp_path / "x.log", [])
    assert cancel(rec, lambda: client, "7_2") == ["7_2"]  # type: ignore[arg-type,return-value]
    assert client.commands == [["scontrol", "update", "JobId=7_2", "Requeue=0"]]


# -- polling (issue 18) ---------------------------------------------------------------------------
def test_poller_backs_off_to_one_poll_a_minute_and_hurries_on_news() -> None:
    from jobs.follow import Poller

    now = [0.0]
    poller = Poller(min_s=3, max_s=60, clock=lambda: now[0])
    polls = []
    while now[0] <= 120:  # a calm 2-minute job, looked at every second
        if poller.due():
            polls.append(now[0])
            poller.polled(changed=now[0] == 0)
        now[0] += 1
    assert len(polls) <= 30, polls
    after_first_minute = [b - a for a, b in itertools.pairwise(polls) if a >= 60]
    assert after_first_minute and min(after_first_minute) >= 10, polls
    assert min(b - a for a, b in itertools.pairwise(polls)) >= 3
    while now[0] <= 3600:
        if poller.due():
            polls.append(now[0])
            poller.polled(changed=False)
        now[0] += 1
    assert polls[-1] - polls[-2] == 60  # a long wait: one poll a minute
    poller.hurry()  # the files show the job stopped / ended: ask at once
    assert poller.due()


def test_follow_asks_slurm_rarely_while_reading_files_every_tick(tmp_path: Path) -> None:
    rec = _record(tmp_path)
    snaps = [{"7": "RUNNING"}] * 6 + [{"7": "COMPLETED"}]
    client = ScriptedClient(snaps, rec.log_file("7", 0), [])
    (tmp_path / "slurm").mkdir()
    ticks = 0
    log = rec.log_file("7", 0)

    import jobs.follow as jf

    real_sleep = jf.time.sleep

    def tick(_: float) -> None:
        nonlocal ticks
        ticks += 1
        with log.open("a") as f:
            f.write(f"12:00:00 [rank 0] INFO train.loop.trainer: step {ticks}/100\n")
        real_sleep(0.002)

    jf.time.sleep = tick  # type: ignore[assignment]
    try:
        out = io.StringIO()
        # Slurm every 0.2 s: a tick is 2 ms idle, and still far under 0.2 / 3 s on a loaded
        # machine (at 0.05 s, beside 6 integration workers, 24 ticks came for 8 queries)
        code = follow(rec, lambda: client, out=out, poll_s=0.001, min_poll_s=0.2, max_poll_s=0.2)  # type: ignore[arg-type,return-value]
    finally:
        jf.time.sleep = real_sleep  # type: ignore[assignment]
    assert code == 0
    assert ticks > 3 * len(client.calls)  # files every tick, Slurm every ~0.2 s
    text = out.getvalue()
    assert text.count("job 7: RUNNING") == 1 and text.rstrip().endswith("job 7: COMPLETED")
    steps = [ln for ln in text.splitlines() if " step " in ln]
    assert steps == [f"12:00:00 step {i}/100" for i in range(1, len(steps) + 1)]


def test_follow_output_is_readable_once_and_in_order(tmp_path: Path) -> None:
    """Issue 19: submitit's lines twice, raw JSON events, the final state before the last lines."""
    rec = _record(tmp_path)
    run_dir = Path(rec.tasks[0].run_dir)
    (run_dir / "checkpoints" / "step-70").mkdir(parents=True)
    (tmp_path / "slurm").mkdir()
    t0 = 1795430000.0
    events = [
        {"time": t0, "event": "start", "step": 0},
        {"time": t0 + 10, "event": "signal", "step": 70, "signal": "USR2"},
        {"time": t0 + 11, "event": "preempted", "step": 70},
        {"time": t0 + 12, "event": "requeue", "step": 70, "via": "scontrol"},
        {"time": t0 + 50, "event": "resume", "step": 70, "restart_count": 1},
        {"time": t0 + 60, "event": "complete", "step": 100, "test_accuracy": 0.5},
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    log = [
        "submitit INFO (2026-11-23 10:49:05,206) - Job completed successfully",
        "10:49:05 [rank 0] INFO submitit: Job completed successfully",
        "submitit WARNING (2026-11-23 10:49:06,000) - Something odd",
        "10:49:06 [rank 0] WARNING submitit: Something odd",
        "10:49:07 [rank 0] INFO train.loop.trainer: step 100/100 (100%) epoch 1 | loss 0.1",
    ]
    rec.log_file("7", 0).write_text("\n".join(log) + "\n")
    client = ScriptedClient([{"7": "RUNNING"}, {"7": "COMPLETED"}], tmp_path / "x.log", [])
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.001, min_poll_s=0.001) == 0  # type: ignore[arg-type,return-value]
    text = out.getvalue()
    assert "Job completed successfully" not in text  # submitit's INFO: noise, and twice
    assert text.count("Something odd") == 1  # a warning: shown once
    assert ">> preempted at step 70, checkpoint step-70" in text
    assert ">> resumed at step 70 (restart 1)" in text
    assert ">> complete at step 100, test acc 50.0%" in text
    assert "{" not in text
    lines = text.splitlines()
    assert lines[-1].endswith("job 7: COMPLETED")
    order = [">> started", ">> preempted", ">> requeued", ">> resumed", ">> complete"]
    assert [next(i for i, ln in enumerate(lines) if o in ln) for o in order] == sorted(
        next(i for i, ln in enumerate(lines) if o in ln) for o in order
    )
    out = io.StringIO()
    client = ScriptedClient([{"7": "COMPLETED"}], tmp_path / "x.log", [])
    assert follow(rec, lambda: client, out=out, poll_s=0.001, min_poll_s=0.001, as_json=True) == 0  # type: ignore[arg-type,return-value]
    objs = [json.loads(ln) for ln in out.getvalue().splitlines()]  # only JSON, one a line
    assert {o["type"] for o in objs} == {"log", "event", "state"}
    assert objs[-1] == {**objs[-1], "type": "state", "state": "COMPLETED"}


def test_status_cache_one_query_for_many_and_none_within_ttl(tmp_path: Path) -> None:
    from jobs.statecache import cache_path, slurm_states

    a, b = _record(tmp_path), _record(tmp_path, array=3)
    b.job_id = "9"
    snap = {"7": "RUNNING", "9_0": "RUNNING", "9_1": "PENDING"}
    client = ScriptedClient([snap], tmp_path / "x", [])
    first = states_many([a, b], lambda: client)  # type: ignore[arg-type,return-value]
    again = states_many([a, b], lambda: client)  # type: ignore[arg-type,return-value]
    assert client.calls == [["7", "9"]]  # one query, then the cache (watch jobs status)
    assert first == again and first["9_2"].state == "UNKNOWN"
    states_many([a], lambda: client, ttl_s=0.0)  # type: ignore[arg-type,return-value]
    assert len(client.calls) == 2
    cache_path().write_bytes(b"\xff{damaged")  # a damaged cache costs one query, no error
    assert slurm_states(["7"], lambda: client)["7"].state == "RUNNING"  # type: ignore[arg-type,return-value]
    assert len(client.calls) == 3


def test_final_states_from_accounting_are_never_asked_again(tmp_path: Path) -> None:
    from jobs.statecache import slurm_states

    class Client:
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
            self.calls.append(list(ids))
            return {
                "5": JobInfo("5", "COMPLETED", exit_code=0, partition="debug", source="sacct"),
                "6": JobInfo("6", "RUNNING", partition="debug", source="squeue"),
            }

    c = Client()
    scopes = {"5": "run-a", "6": "run-b"}  # kept as final only for the submission that asked
    slurm_states(["5", "6"], lambda: c, scopes=scopes)  # type: ignore[arg-type,return-value]
    slurm_states(["5", "6"], lambda: c, ttl_s=0, scopes=scopes)  # type: ignore[arg-type,return-value]
    assert c.calls == [["5", "6"], ["6"]]


SHIM = """#!/bin/sh
echo "${0##*/} $*" >> "$SHIM_LOG"
case "${0##*/}" in
  squeue) echo "5|a|RUNNING|None|n1|debug|0:05|0|" ;;
  sacct) echo "6|b|COMPLETED|0:0|00:00:07|n1|debug|None" ;;
esac
"""


def test_poll_states_is_one_squeue_and_sacct_only_for_forgotten_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster.client import SlurmClient

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("squeue", "sacct", "sbatch"):
        (bin_dir / name).write_text(SHIM)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {"PATH": str(bin_dir), "SHIM_LOG": str(log)}
    client = SlurmClient(conf="/nonexistent/slurm.conf", environ=env)
    assert client.poll_states(["5"])["5"].state == "RUNNING"
    assert log.read_text().splitlines()[0].startswith("squeue ")
    assert len(log.read_text().splitlines()) == 1  # one command per poll
    log.unlink()
    client.poll_states(["5", "6"])
    assert [ln.split()[0] for ln in log.read_text().splitlines()] == ["squeue", "sacct"]
    assert "-j 6" in log.read_text().splitlines()[1]  # only the id squeue did not know


# -- local runs: nothing but our own processes is ever signalled (issue 14.1) ---------------------
def _local_record(tmp_path: Path, pid: int, state: dict[str, object] | None) -> RunRecord:
    run_dir = tmp_path / "local-run"
    run_dir.mkdir(parents=True)
    if state is not None:
        (run_dir / "local_state.json").write_text(json.dumps(state))
    return RunRecord(
        "l-1",
        "l",
        str(run_dir),
        "local",
        job_id=f"local-{pid}",
        tasks=[TaskRecord(0, str(run_dir), {})],
        pid=pid,
        submitted_at=1.0,
    )


@pytest.fixture
def bystander() -> object:
    """An unrelated process (what a recycled PID points at after the run ended)."""
    import subprocess

    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_process_handles_need_the_same_start_time() -> None:
    import os

    from jobs.pids import ProcHandle

    me = ProcHandle.of(os.getpid())
    assert me is not None and me.alive()
    assert not ProcHandle(me.pid, me.start + 1, me.boot).alive()  # same PID, another process
    assert not ProcHandle(me.pid, me.start, "another-boot").alive()
    for junk in (None, [], {"pid": "1", "start": 2}, {"pid": True, "start": 2}, {"pid": 1}):
        assert ProcHandle.from_json(junk) is None
    assert ProcHandle.from_json(me.to_json()) == me


def test_a_process_just_started_is_proven_by_its_command_line_once_exec_is_done() -> None:
    import subprocess
    import sys

    from jobs.pids import cmdline, wait_exec

    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    for _ in range(10):
        proc = subprocess.Popen(argv)
        try:
            assert wait_exec(proc.pid) and cmdline(proc.pid) == argv
        finally:
            proc.kill()
            proc.wait()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not wait_exec(gone.pid, timeout=5)  # gone: no wait for the time-out


def test_cancel_never_signals_a_process_that_reuses_the_pid(tmp_path: Path, bystander) -> None:  # type: ignore[no-untyped-def]
    from jobs.pids import ProcHandle

    pid = bystander.pid
    h = ProcHandle.of(pid)
    assert h is not None
    cases = [
        # the run COMPLETED; its PID now belongs to someone else
        {
            "supervisor": {**h.to_json(), "start": h.start - 5},
            "tasks": {f"local-{pid}": {"state": "COMPLETED"}},
        },
        # the supervisor's handle is right but it is not running this run (command line)
        {"supervisor": h.to_json(), "tasks": {f"local-{pid}": {"state": "RUNNING"}}},
        None,  # no state file at all: only the PID is known
        {"supervisor": "garbage", "tasks": ["x"]},
    ]
    for i, state in enumerate(cases):
        rec = _local_record(tmp_path / str(i), pid, state)
        assert cancel(rec, lambda: None) == []  # type: ignore[arg-type,return-value]
        assert bystander.poll() is None, state  # still alive: never signalled
        states = states_many([rec], lambda: None)  # type: ignore[arg-type,return-value]
        assert states[f"local-{pid}"].state in ("COMPLETED", "FAILED")


def test_a_local_cancel_is_recorded_as_cancelled_not_preempted(tmp_path: Path) -> None:
    """The local supervisor marks its SIGTERM as a cancel (RUN_DIR/.local-stop) before sending
    it; train then records 'cancelled' and asks for no restart (was: 'preempted' + exit 75)."""
    from jobs.localrun import STOP_FILE
    from train.history import RunHistory
    from train.spec.config import RequeueConfig
    from train.stop import Decider, request_requeue

    def Env() -> Decider:
        return Decider(None, 0)

    assert request_requeue(Env(), tmp_path, RequeueConfig(), "signal", step=7) == 75
    (tmp_path / STOP_FILE).write_text("cancel\n")
    assert request_requeue(Env(), tmp_path, RequeueConfig(), "signal", step=9) == 0
    events = [(e["event"], e["step"]) for e in RunHistory(tmp_path).events()]
    assert events == [("preempted", 7), ("requeue", 7), ("cancelled", 9)]


def test_cancel_leaves_an_ended_slurm_run_alone(tmp_path: Path) -> None:
    rec = _record(tmp_path, array=2)
    client = ScriptedClient([{"7_0": "COMPLETED", "7_1": "FAILED"}], tmp_path / "x.log", [])
    assert cancel(rec, lambda: client) == []  # type: ignore[arg-type,return-value]
    assert client.cancelled == [] and client.commands == []
    client = ScriptedClient([{"7_0": "COMPLETED", "7_1": "RUNNING"}], tmp_path / "x.log", [])
    assert cancel(rec, lambda: client, "7_0") == []  # type: ignore[arg-type,return-value]
    assert cancel(rec, lambda: client, "7_1") == ["7_1"]  # type: ignore[arg-type,return-value]


def test_a_rank_that_ignores_the_cancel_is_killed_after_the_kill_wait(tmp_path: Path) -> None:
    import functools
    import os
    import signal
    import subprocess
    import time

    from jobs.localrun import Supervisor, _die_with_parent, read_state

    rec = RunRecord(
        "l-2", "l", str(tmp_path), "local", job_id="local-1",
        tasks=[TaskRecord(0, str(tmp_path), {})],
    )  # fmt: skip
    sup = Supervisor(rec)
    ready = tmp_path / "ready"
    stubborn = subprocess.Popen(
        ["sh", "-c", f"trap '' TERM; touch {ready}; sleep 30 & wait"],
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
    )
    deadline = time.monotonic() + 10
    while not ready.exists():  # the trap is set
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sup.running[0] = [stubborn]
    sup.cancel(signal.SIGTERM, None)
    time.sleep(0.3)
    sup.reap()
    assert stubborn.poll() is None and sup.running  # within the kill wait: it may still save
    sup.cancelled_at -= 31
    deadline = time.monotonic() + 10
    while sup.running:
        assert time.monotonic() < deadline
        sup.reap()
        time.sleep(0.05)
    assert stubborn.returncode == -signal.SIGKILL
    assert read_state(tmp_path)["tasks"][sup.task_id(0)]["state"] == "CANCELLED"


def test_one_task_of_a_local_array_cannot_be_cancelled_alone(tmp_path: Path) -> None:
    from jobs.errors import UsageError

    rec = _local_record(tmp_path, 999999, None)
    rec.array_size = 2
    with pytest.raises(UsageError, match="one task of a local run"):
        cancel(rec, lambda: None, "local-999999_1")  # type: ignore[arg-type,return-value]


def test_a_final_state_is_confirmed_within_min_poll_even_after_a_long_calm() -> None:
    from jobs.follow import Poller

    now = [0.0]
    poller = Poller(min_s=3, max_s=60, clock=lambda: now[0])
    poller.polled(changed=True)
    now[0] = 3600.0  # an hour of calm: the back-off is at one poll a minute
    poller.polled(changed=False)
    assert poller.next_at == 3660.0
    poller.soon()  # a final state seen once: confirm it soon, not in a minute
    assert poller.next_at == 3603.0


def test_local_restarts_on_exit_75_are_bounded_even_without_events(tmp_path: Path) -> None:
    """A program that exits 75 and records nothing must not be restarted forever."""
    from jobs.localrun import Supervisor
    from train.history import RunHistory

    (tmp_path / "resolved.yaml").write_text(
        "train: {}\nrequeue: {max_preemptions: 1, max_timeouts: 1, max_failures: 0}\n"
    )
    rec = RunRecord(
        "l-3", "l", str(tmp_path), "local", job_id="local-1",
        tasks=[TaskRecord(0, str(tmp_path), {})],
    )  # fmt: skip
    sup = Supervisor(rec)
    assert sup.budgets[0].max_preemptions == 1
    history = RunHistory(tmp_path)
    assert sup._outcome(0, [75, 0], history, attempt=1)[0] == "REQUEUED"
    state, why = sup._outcome(0, [75, 0], history, attempt=2)
    assert state == "FAILED" and "restarted 2x" in why


def test_ranks_of_a_killed_local_supervisor_record_a_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their parent-death SIGTERM is no preemption: nobody is left to restart them."""
    import os

    from train.history import RunHistory
    from train.spec.config import RequeueConfig
    from train.stop import Decider, request_requeue

    def Env() -> Decider:
        return Decider(None, 0)

    monkeypatch.setenv("SLURM_TRAIN_LOCAL_SUPERVISOR", str(os.getppid()))  # alive: a requeue
    assert request_requeue(Env(), tmp_path, RequeueConfig(), "signal", step=3) == 75
    monkeypatch.setenv("SLURM_TRAIN_LOCAL_SUPERVISOR", str(os.getppid() + 100000))  # gone
    assert request_requeue(Env(), tmp_path, RequeueConfig(), "signal", step=5) == 0
    assert [e["event"] for e in RunHistory(tmp_path).events()][-1] == "cancelled"


@pytest.mark.parametrize("codes", [[0, 1], [-9, 134], [0, 75], [0, 3]])
def test_a_local_run_rank_0_completed_is_completed_whatever_a_rank_exits_with_after(
    tmp_path: Path, codes: list[int]
) -> None:
    """Issue 44 item 2: the local executor agrees with the batch script and the command
    supervisor (train.history.attempt_completed_at): rank 0's complete of this attempt ends the
    run COMPLETED; a rank that fails after it (gloo's abort at exit) is not a failure."""
    from jobs.localrun import Supervisor
    from train.history import RunHistory

    rec = RunRecord(
        "l-4", "l", str(tmp_path), "local", job_id="local-1",
        tasks=[TaskRecord(0, str(tmp_path), {})],
    )  # fmt: skip
    sup = Supervisor(rec)
    history = RunHistory(tmp_path)
    history.append("complete", step=50, restart_count=1, job_id=None)
    assert sup._outcome(0, codes, history, attempt=1) == ("COMPLETED", "")
    assert [e["event"] for e in history.events()] == ["complete"]  # no failure, no requeue
    # another attempt's complete is not this one's
    assert sup._outcome(0, [0, 1], history, attempt=2)[0] == "REQUEUED"


class LateEventClient(ScriptedClient):
    """A log line read first, then an event stamped a moment BEFORE it written after it."""

    def __init__(self, log: Path, events: Path) -> None:
        super().__init__([{"7": "RUNNING"}] * 3 + [{"7": "COMPLETED"}], log, [])
        self.events_path = events

    def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
        import time as _time

        n = len(self.calls)
        now = _time.time()
        if n == 0:
            with self.log.open("a") as f:
                f.write("epoch 3 done\n")  # the command's own output: no time of its own
                f.write(
                    "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-11-27T17:33:24 "
                    "DUE TO JOB REQUEUE ***\n"
                )
                f.write(
                    "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
                )
        if n == 1:
            with self.events_path.open("a") as f:  # written late, stamped before the line
                f.write(json.dumps({"time": now - 1.0, "event": "preempted", "step": None}) + "\n")
        return super().poll_states(ids)


def test_follow_shows_each_line_with_its_time_in_order_and_a_requeue_as_no_error(
    tmp_path: Path,
) -> None:
    """Issue 45: slurmstepd's requeue note streamed as an error; a line out of time order; two
    prefix styles (the command's own lines had no time)."""
    rec = _record(tmp_path)
    run_dir = Path(rec.tasks[0].run_dir)
    run_dir.mkdir()
    (tmp_path / "slurm").mkdir()
    events = run_dir / "events.jsonl"
    events.write_text("")
    client = LateEventClient(rec.log_file("7", 0), events)
    out = io.StringIO()
    assert follow(rec, lambda: client, out=out, poll_s=0.3, min_poll_s=0.3) == 0  # type: ignore[arg-type,return-value]
    lines = out.getvalue().splitlines()
    assert all(re.match(r"^\d\d:\d\d:\d\d ", ln) for ln in lines), lines  # one prefix style
    text = "\n".join(lines)
    assert "error" not in text and "Slurm ended the step: job requeue" in text
    assert "Job step aborted" not in text
    shown = [ln for ln in lines if ">> preempted" in ln or "epoch 3 done" in ln]
    assert ">> preempted" in shown[0], lines  # stamped first, shown first, though read later


# -- the state after `jobs cancel` (issue 45) -----------------------------------------------------
def test_status_right_after_cancel_shows_cancelling_until_slurm_confirms(tmp_path: Path) -> None:
    """`status` 2 s after `jobs cancel` showed PENDING 5, RUNNING 1 (Slurm's answer, cached for
    a few seconds, from before the cancel): the cancel is recorded and shown (CANCELLING) until
    Slurm says the job is over, and the cache never answers with a state from before it."""
    from jobs.records import load_record, save_record

    rec = _record(tmp_path, array=3)
    save_record(rec)
    running = {"7_0": "RUNNING", "7_1": "PENDING", "7_2": "PENDING"}
    client = ScriptedClient([running], tmp_path / "x.log", [])
    before = states_many([rec], lambda: client)  # type: ignore[arg-type,return-value]
    assert [i.state for i in before.values()] == ["RUNNING", "PENDING", "PENDING"]
    assert cancel(rec, lambda: client) == ["7"]  # type: ignore[arg-type,return-value]
    asked = len(client.calls)
    now = states_many([load_record(tmp_path)], lambda: client)  # type: ignore[arg-type,return-value]
    assert len(client.calls) == asked + 1  # asked again: nothing cached from before the cancel
    assert {i.state for i in now.values()} == {"CANCELLING"}
    assert "cancel asked 0 s ago; Slurm still shows RUNNING" in now["7_0"].reason
    client.snapshots = [{"7_0": "CANCELLED", "7_1": "CANCELLED", "7_2": "CANCELLED"}]
    done = states_many([load_record(tmp_path)], lambda: client, fresh=True)  # type: ignore[arg-type,return-value]
    assert {i.state for i in done.values()} == {"CANCELLED"}


def test_cancelling_one_task_marks_only_that_task(tmp_path: Path) -> None:
    from jobs.records import load_record

    rec = _record(tmp_path, array=2)
    client = ScriptedClient([{"7_0": "RUNNING", "7_1": "RUNNING"}], tmp_path / "x.log", [])
    assert cancel(rec, lambda: client, "7_1") == ["7_1"]  # type: ignore[arg-type,return-value]
    states = states_many([load_record(tmp_path)], lambda: client)  # type: ignore[arg-type,return-value]
    assert {k: v.state for k, v in states.items()} == {"7_0": "RUNNING", "7_1": "CANCELLING"}


def test_a_damaged_cancel_field_is_refused_like_any_other_field(tmp_path: Path) -> None:
    from jobs.records import RECORD, load_record

    rec = _record(tmp_path)
    data = json.loads(rec.to_json())
    data.update(cancel_requested_at=-5, cancel_targets=["7"])
    (tmp_path / RECORD).write_text(json.dumps(data))
    with pytest.raises(Exception, match="cancel_requested_at"):
        load_record(tmp_path)
