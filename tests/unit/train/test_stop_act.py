"""PreemptionGuard, stop classification, RunHistory budgets and request_requeue."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from train.history import RunHistory
from train.spec.config import RequeueConfig
from train.stop import BUDGET_EXHAUSTED_EXIT_CODE, REQUEUE_EXIT_CODE, Decider, request_requeue
from train.stop.facts import classify_from_job_info, classify_stop
from train.stop.signals import PreemptionGuard


def FakeEnv(
    is_main: bool = True, job_id: str | None = "42", restart_count: int = 0, world_size: int = 1
) -> Decider:
    """A rank's stop environment: the one complete StopEnv (issue 41), no fake one."""
    return Decider(job_id, restart_count, world_size=world_size, is_main=is_main)


class FakeClient:
    def __init__(self, info: dict[str, str] | None = None, fail: Exception | None = None) -> None:
        self.info = info or {}
        self.fail = fail
        self.requeued: list[str] = []
        self.forbidden: list[str] = []

    def show_job(self, job_id: str) -> dict[str, str]:
        if self.fail:
            raise self.fail
        return self.info

    def forbid_requeue(self, job_id: str) -> None:
        self.forbidden.append(job_id)

    def installed_release(self) -> str | None:
        return None  # scontrol cannot say: the stop asks for the requeue itself (22.05's way)

    def requeue(self, job_id: str) -> None:
        if self.fail:
            raise self.fail
        self.requeued.append(job_id)


# Fixed when the module is collected: the parametrized cases below are built from it, and the
# classification is asked "as of" this instant, however long after collection the test runs.
NOW = float(int(time.time()))


def _at(offset_s: float) -> str:
    """A Slurm timestamp ``offset_s`` from NOW (for cases built at collection time)."""
    return datetime.fromtimestamp(NOW + offset_s).strftime("%Y-%m-%dT%H:%M:%S")


def _ts(offset_s: float) -> str:
    """A Slurm timestamp ``offset_s`` from the real clock (for code that reads the clock)."""
    return datetime.fromtimestamp(time.time() + offset_s).strftime("%Y-%m-%dT%H:%M:%S")


# -- the guard --------------------------------------------------------------------------------
def test_signal_only_sets_a_flag_and_ranks_agree() -> None:
    guard = PreemptionGuard(("USR2", "TERM")).install()
    try:
        assert guard.should_stop(lambda x: x) is False
        assert guard.reason is None
        os.kill(os.getpid(), signal.SIGUSR2)
        assert guard.requested and guard.signal_name == "SIGUSR2"
        assert guard.should_stop(lambda x: x) is True
        assert guard.reason == "signal"  # no job id: not classified
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)


def test_other_rank_signal_stops_this_rank() -> None:
    guard = PreemptionGuard()
    seen: list[int] = []

    def all_reduce_max(x: int) -> int:
        seen.append(x)
        return max(x, 1)  # rank 1 got the signal

    assert guard.should_stop(all_reduce_max) is True
    assert seen == [0] and not guard.requested
    assert guard.reason == "signal"


def test_sigterm_and_restore_previous_handler() -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
    try:
        guard = PreemptionGuard(("SIGTERM", signal.SIGUSR2)).install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.signal_name == "SIGTERM" and not calls
        guard.uninstall()
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_reason_is_classified_on_the_main_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("train.stop.facts.classify_stop", lambda job_id, delay: "timeout")
    guard = PreemptionGuard(job_id="7", signal_delay_s=90)
    guard.trigger("USR2")
    assert guard.should_stop(lambda x: x)
    assert guard.reason == "timeout"
    other = PreemptionGuard(job_id="7", is_main=False)
    other.trigger()
    assert other.reason == "signal"


# -- classification -------------------------------------------------------------------------
# Fields as `scontrol show job` printed them on the local cluster in each situation.
RUNNING = {"JobState": "RUNNING", "PreemptTime": "None", "Restarts": "0"}
ENDING = {"JobState": "COMPLETING", "PreemptTime": "None", "Restarts": "0"}


@pytest.mark.parametrize(
    ("info", "kind"),
    [
        # USR2 at preemption (preempt_send_user_signal): PreemptTime set, EndTime = +GraceTime
        ({**RUNNING, "PreemptTime": _at(-3), "EndTime": _at(20)}, "preemption"),
        # USR2 before the time limit
        ({**RUNNING, "EndTime": _at(80)}, "timeout"),
        ({**RUNNING, "EndTime": _at(140)}, "timeout"),  # Slurm sends up to 60 s early
        # scancel --signal=USR2 by hand: checkpoint and requeue like a preemption
        ({**RUNNING, "EndTime": _at(3600)}, "preemption"),
        ({**RUNNING, "EndTime": "Unknown"}, "preemption"),
        ({}, "preemption"),
        # plain scancel: SIGTERM, job already COMPLETING, EndTime = now, limit far away
        (
            {**ENDING, "EndTime": _at(0), "StartTime": _at(-30), "TimeLimit": "00:10:00"},
            "cancel",
        ),
        (
            {**ENDING, "JobState": "CANCELLED", "StartTime": _at(-30), "TimeLimit": "1-00:00:00"},
            "cancel",
        ),
        # SIGTERM at the time limit itself (the early signal was missed)
        ({**ENDING, "StartTime": _at(-60), "TimeLimit": "00:01:00"}, "timeout"),
        ({**ENDING, "JobState": "TIMEOUT"}, "timeout"),
        # SIGTERM at the end of a preemption's grace time: Slurm already requeued the job
        ({**ENDING, "Restarts": "1", "StartTime": _at(-30), "TimeLimit": "00:10:00"}, "preemption"),
    ],
)
def test_classify_from_job_info(info: dict[str, str], kind: str) -> None:
    assert classify_from_job_info(info, signal_delay_s=90, now=NOW, restart_count=0) == kind


def test_cancel_is_recorded_and_not_requeued(tmp_path: Path) -> None:
    info = {**ENDING, "EndTime": _ts(0), "StartTime": _ts(-30), "TimeLimit": "00:10:00"}
    client = FakeClient(info)
    code = request_requeue(FakeEnv(), tmp_path, RequeueConfig(), "signal", step=9, client=client)
    assert code == 0 and client.requeued == []
    assert _events(tmp_path) == ["cancelled"]
    assert RunHistory(tmp_path).summary() == "cancelled at step 9"
    # the guard's "cancel" is re-checked with this run's restart count: here Slurm requeued it
    # (scontrol requeue from outside): recorded, and not requeued a second time (which fails:
    # "Job is pending execution"; issue 29's chaos test)
    client = FakeClient({**info, "Restarts": "1"})
    code = request_requeue(FakeEnv(), tmp_path, RequeueConfig(), "cancel", step=9, client=client)
    assert code == 0 and client.requeued == []
    assert _events(tmp_path)[-2:] == ["preempted", "requeue"]
    last = RunHistory(tmp_path).events()[-2:]
    assert last[0]["kind"] == "requeued" and last[1]["via"] == "slurm"


def test_classify_stop_without_slurm_is_signal() -> None:
    assert classify_stop("1", 90, client=FakeClient(fail=OSError("no scontrol"))) == "signal"
    client = FakeClient({"PreemptTime": "None", "EndTime": _ts(30)})
    assert classify_stop("1", 90, client=client) == "timeout"


# -- history --------------------------------------------------------------------------------
def test_history_counts_summary_and_torn_lines(tmp_path: Path) -> None:
    h = RunHistory(tmp_path)
    assert h.summary() == "no events yet"
    h.append("start", step=0, restart_count=0, job_id="1")
    assert h.summary() == "no interruptions"
    for n, kind in enumerate(["preempted", "timeout", "preempted"], start=1):
        h.append(kind, step=10 * n, restart_count=n - 1, job_id="1")
        h.append("requeue", step=10 * n, restart_count=n - 1, job_id="1")
        h.append("resume", step=10 * n, restart_count=n, job_id="1")
    with open(h.path, "a") as f:
        f.write('{"time": 1, "event": "compl')  # a crash mid-write
    assert h.counts()["preempted"] == 2
    assert h.summary() == "preempted 2x, timeout 1x, resumed at step 30"
    h.append("complete", step=50, restart_count=3, job_id="1")
    d = h.to_dict()
    assert d["preemptions"] == 2 and d["timeouts"] == 1 and d["failures"] == 0
    assert d["resumes"] == 3 and d["resumed_at_step"] == 30 and d["complete"] is True
    assert h.summary().endswith("complete at step 50")
    with pytest.raises(ValueError, match="unknown event"):
        h.append("exploded")


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        (["preempted"] * 2, None),
        (["preempted"] * 3, "preempted 3x, over the budget requeue.max_preemptions=2"),
        (["timeout"], None),
        (["timeout"] * 2, "requeue.max_timeouts=1"),
        (["failure"], "requeue.max_failures=0"),
    ],
)
def test_budgets(tmp_path: Path, events: list[str], reason: str | None) -> None:
    cfg = RequeueConfig(max_preemptions=2, max_timeouts=1, max_failures=0)
    h = RunHistory(tmp_path)
    for e in events:
        h.append(e)
    got = h.check_budget(cfg)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


# -- request_requeue ------------------------------------------------------------------------
def _events(run_dir: Path) -> list[str]:
    return [
        json.loads(line)["event"]
        for line in (run_dir / "events.jsonl").read_text().split("\n")
        if line
    ]


def test_requeue_via_scontrol(tmp_path: Path) -> None:
    client = FakeClient({"PreemptTime": _ts(-2), "EndTime": _ts(20)})
    code = request_requeue(FakeEnv(), tmp_path, RequeueConfig(), "signal", step=12, client=client)
    assert code == 0 and client.requeued == ["42"]
    assert _events(tmp_path) == ["preempted", "requeue"]
    first = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])
    assert first["step"] == 12 and first["job_id"] == "42" and first["restart_count"] == 0


def test_requeue_falls_back_to_exit_code(tmp_path: Path) -> None:
    client = FakeClient(fail=FileNotFoundError("scontrol"))
    code = request_requeue(FakeEnv(), tmp_path, RequeueConfig(), "timeout", step=5, client=client)
    assert code == REQUEUE_EXIT_CODE
    # what happened, not what was hoped: the batch script retries (train.stop.step)
    assert _events(tmp_path) == ["timeout", "requeue_failed"]
    code = request_requeue(FakeEnv(job_id=None), tmp_path, RequeueConfig(), "preemption", step=6)
    assert code == REQUEUE_EXIT_CODE


def test_an_operators_term_saves_and_requeues_where_the_ranks_met(tmp_path: Path) -> None:
    """Issue 44 item 7: `scancel --signal=TERM` while the job runs on (not preempted, far from
    its time limit) under the rendered script: the session saved, every rank met at the
    barrier, so no rank died: a stop like the requeue signal (README), not "the step is
    ending" (no record, exit 1, then a failure and a restart from the last periodic save)."""
    client = FakeClient({"JobState": "RUNNING", "EndTime": _ts(3600), "Restarts": "0"})
    in_place = Decider("42", 0, in_place_supervised=True)  # a batch script restarts failed steps
    code = request_requeue(in_place, tmp_path, RequeueConfig(), None, step=12, client=client,
                           signal="SIGTERM")  # fmt: skip
    assert code == 0 and client.requeued == ["42"]
    assert _events(tmp_path) == ["preempted", "requeue"]  # no failure spent


def test_budget_exhausted_stops_without_requeue(tmp_path: Path) -> None:
    client = FakeClient()
    cfg = RequeueConfig(max_failures=1)
    # a failure is requeued, but the process still reports that it failed
    assert request_requeue(FakeEnv(), tmp_path, cfg, "failure", step=1, client=client) == 1
    code = request_requeue(FakeEnv(), tmp_path, cfg, "failure", step=2, client=client)
    assert code == BUDGET_EXHAUSTED_EXIT_CODE
    assert client.requeued == ["42"]
    assert _events(tmp_path) == ["failure", "requeue", "failure", "budget_exhausted"]
    # the run ends for good: Slurm must not requeue the job either (26.05 requeues a failed job
    # of --requeue=expedite, held); the requeued failure before it left the job requeueable
    assert client.forbidden == ["42"]
    assert "max_failures=1" in RunHistory(tmp_path).summary()


def test_the_first_failing_rank_of_an_attempt_records_and_requeues(tmp_path: Path) -> None:
    """srun --kill-on-bad-exit ends the step when any rank fails: a failure on rank 1 must not
    wait for rank 0 to record it; a second failing rank of the same attempt adds nothing."""
    client = FakeClient()
    cfg = RequeueConfig(max_failures=3)
    rank1 = FakeEnv(is_main=False, world_size=2)
    rank0 = FakeEnv(is_main=True, world_size=2)
    assert request_requeue(rank1, tmp_path, cfg, "failure", step=7, error="OOM", client=client) == 1
    assert client.requeued == ["42"]
    assert _events(tmp_path) == ["failure", "requeue"]
    # rank 0 fails too (its peer is gone): the same attempt, already recorded
    assert request_requeue(rank0, tmp_path, cfg, "failure", step=7, client=client) == 1
    assert client.requeued == ["42"] and _events(tmp_path) == ["failure", "requeue"]
    # the next attempt (restart 1) fails on rank 0: recorded again, the budget counts both
    again = FakeEnv(is_main=True, world_size=2, restart_count=1)
    assert request_requeue(again, tmp_path, cfg, "failure", step=9, client=client) == 1
    assert _events(tmp_path) == ["failure", "requeue", "failure", "requeue"]
    assert RunHistory(tmp_path).to_dict()["failures"] == 2
    # outside Slurm (no job id) only rank 0 records, as before
    local = tmp_path / "local"
    local.mkdir()
    code = request_requeue(
        FakeEnv(is_main=False, job_id=None, world_size=2), local, cfg, "failure", step=1
    )
    assert code == 1 and not (local / "events.jsonl").exists()


def test_other_ranks_do_nothing(tmp_path: Path) -> None:
    client = FakeClient()
    env = FakeEnv(is_main=False)
    assert request_requeue(env, tmp_path, RequeueConfig(), "signal", client=client) == 0
    assert client.requeued == [] and not (tmp_path / "events.jsonl").exists()


def test_kind_passthrough_does_not_ask_slurm(tmp_path: Path) -> None:
    class NoShowJob(FakeClient):
        def show_job(self, job_id: str) -> dict[str, str]:
            raise AssertionError("a classified kind must not ask Slurm again")

    client = NoShowJob()
    assert request_requeue(FakeEnv(), tmp_path, RequeueConfig(), "preemption", client=client) == 0
    assert _events(tmp_path) == ["preempted", "requeue"]


def test_failure_outside_slurm_is_recorded_not_requeued(tmp_path: Path) -> None:
    code = request_requeue(
        FakeEnv(job_id=None), tmp_path, RequeueConfig(), "failure", step=4, error="boom"
    )
    assert code == 1
    events = RunHistory(tmp_path).events()
    assert [e["event"] for e in events] == ["failure"] and events[0]["error"] == "boom"
    assert request_requeue(FakeEnv(is_main=False), tmp_path, RequeueConfig(), "failure") == 1


def test_signal_during_startup_is_kept_for_the_guard() -> None:
    import train.stop.signals as preempt

    previous = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        preempt.install_early(("USR2", "TERM"))
        os.kill(os.getpid(), signal.SIGUSR2)  # e.g. while torch is being imported: not fatal
        guard = PreemptionGuard(("USR2", "TERM")).install()
        assert guard.requested and guard.signal_name == "SIGUSR2"
        assert guard.should_stop(lambda x: x)
        guard.uninstall()
        os.kill(os.getpid(), signal.SIGUSR2)  # a late repeat after the guard: still harmless
        assert preempt._EARLY and preempt._EARLY[-1][0] == signal.SIGUSR2
        preempt._EARLY.clear()
        # a launcher's own handler can hand a signal over too; other signals are not taken
        preempt.note_early_signal(signal.SIGUSR1)
        assert not PreemptionGuard(("USR2",)).install().requested
        assert not preempt._EARLY
        # code without a guard (a command entrypoint) takes them to pass them on
        os.kill(os.getpid(), signal.SIGTERM)
        assert preempt.pop_early_signals() == [signal.SIGTERM] and not preempt._EARLY
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        preempt._EARLY.clear()


def test_a_cascade_leaves_the_claim_to_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2 item 3 (root first for the built-in trainer): rank 1 lost its peer (gloo's
    "Connection closed by peer") and raises first; rank 0, the root, raises its own error a
    moment later. The cascade waits; the root claims and records its own error and traceback
    location; the cascade records nothing (it was: the cascade claimed first, its symptom
    recorded as the failure's cause)."""
    import threading

    import train.stop.act

    monkeypatch.setattr(train.stop.act, "ROOT_WAIT_S", 30.0, raising=False)
    client = FakeClient()
    cfg = RequeueConfig(max_failures=3)
    from train.stop import failure_details

    def root_fails() -> None:
        time.sleep(0.3)
        try:
            raise ValueError("bad batch shape (3, 4)")
        except ValueError as exc:
            details = failure_details(exc)
        request_requeue(FakeEnv(is_main=True, world_size=2), tmp_path, cfg, "failure", step=7,
                        error="ValueError: bad batch shape (3, 4)", details=details,
                        client=client)  # fmt: skip

    root = threading.Thread(target=root_fails)
    root.start()
    cascade = "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500"
    code = request_requeue(FakeEnv(is_main=False, world_size=2), tmp_path, cfg, "failure",
                           step=7, error=cascade, client=client)  # fmt: skip
    root.join()
    assert code == 1
    (failure,) = [e for e in RunHistory(tmp_path).events() if e["event"] == "failure"]
    assert failure["error"].startswith("ValueError: bad batch shape")
    sig = failure["signature"]
    assert sig.startswith("ValueError: bad batch shape") and sig.endswith(":root_fails"), sig
    assert "@ test_stop_act.py:" in sig
    assert client.requeued == ["42"]


def _a_cascade(run_dir: Path, error: str, *, is_main: bool) -> tuple[int, float]:
    """A failing rank of two whose error is a peer's death: (its exit code, seconds it took)."""
    start = time.monotonic()
    code = request_requeue(FakeEnv(is_main=is_main, world_size=2), run_dir,
                           RequeueConfig(max_failures=3), "failure", step=7, error=error,
                           client=FakeClient())  # fmt: skip
    return code, time.monotonic() - start


def test_a_killed_roots_cascade_claims_once_srun_ends_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46 (a restart in place at the floor): the root was killed (``kill -9``: it never
    claims) and srun, at its task's bad exit, sends SIGTERM to every other task at once. The
    cascade stops waiting for a claim then (it waited the whole ROOT_WAIT_S before: 10 of a
    restart in place's 14 s), records the failure itself and leaves; the handler that was
    installed still sees the signal."""
    import threading

    import train.stop.act

    monkeypatch.setattr(train.stop.act, "ROOT_WAIT_S", 20.0)
    seen: list[int] = []

    def mine(signum: int, frame: object) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        cascade = "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500"
        code, waited = _a_cascade(tmp_path, cascade, is_main=False)
        assert signal.getsignal(signal.SIGTERM) is mine  # put back after the wait
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert waited < 20.0  # it did not wait out ROOT_WAIT_S for a claim that never comes
    assert seen == [signal.SIGTERM]
    assert code == 1
    (failure,) = [e for e in RunHistory(tmp_path).events() if e["event"] == "failure"]
    assert failure["error"] == cascade


@pytest.mark.parametrize("holder", ["guard", "early"])
def test_srun_ending_the_step_before_the_failure_still_ends_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holder: str
) -> None:
    """Issue 46 (a restart in place at the floor): srun's SIGTERM (the root's bad exit) often
    reaches a rank while it is still in the collective that then fails: the run's guard (or,
    during start-up, the early handler) holds it, and the wait for the root's claim begins
    after it. The cascade knows the step is ending all the same and claims at once (it waited
    the whole ROOT_WAIT_S before: 10 s of a restart in place, one round in three on the local
    cluster)."""
    import train.stop.act
    from train.stop.signals import install_early, term_received_at

    monkeypatch.setattr(train.stop.act, "ROOT_WAIT_S", 20.0)
    assert term_received_at() is None
    if holder == "guard":
        guard = PreemptionGuard(("USR2", "TERM")).install()
    else:
        install_early(("USR2", "TERM"))
    os.kill(os.getpid(), signal.SIGUSR2)  # a job signal first: the step's end is SIGTERM only
    assert term_received_at() is None
    os.kill(os.getpid(), signal.SIGTERM)
    assert term_received_at() is not None
    cascade = "RuntimeError: [gloo] Connection reset by peer [127.0.0.1]:29500"
    code, waited = _a_cascade(tmp_path, cascade, is_main=True)
    if holder == "guard":
        assert guard.requested and guard.signal_name == "SIGUSR2"
        guard.uninstall()
    assert waited < 5.0  # not ROOT_WAIT_S
    assert code != 0
    (failure,) = [e for e in RunHistory(tmp_path).events() if e["event"] == "failure"]
    assert failure["error"] == cascade


@pytest.mark.parametrize(("stop_signal", "ending"), [("USR2", True), ("TERM", False)])
def test_a_sessions_step_ends_at_a_term_that_is_not_its_stop_signal(
    stop_signal: str, ending: bool
) -> None:
    """The run session tells its checkpoint saves that the step is ending (srun's TERM at a
    peer's bad exit) when this process got SIGTERM and it is not the run's stop signal; with
    TERM as the stop signal, a TERM starts every rank's save, and nothing is ended early."""
    from types import SimpleNamespace

    from train.session import RunSession
    from train.stop.signals import install_early

    me = SimpleNamespace(requeue=RequeueConfig(signal=stop_signal))
    assert RunSession._step_ending(me) is False  # type: ignore[arg-type]
    install_early(("USR2", "TERM"))
    os.kill(os.getpid(), signal.SIGTERM)
    assert RunSession._step_ending(me) is ending  # type: ignore[arg-type]
