"""jobs.drill without Slurm: what it refuses, what it does, what it reads from the run records.

A small stand-in for the Slurm client plays the cluster and the run (it writes the events and
metrics train would write); the real drills run in tests/integration/test_byo_drill.py.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import SlurmCommandError
from cluster.models import Partition
from jobs.cli import main
from jobs.drill import Drill, DrillError, DrillReport, run_drill
from jobs.errors import UsageError
from jobs.records import RunRecord, TaskRecord


def _record(run_dir: Path, **kw: Any) -> RunRecord:
    fields: dict[str, Any] = {
        "run_id": "r-1",
        "name": "r",
        "run_dir": str(run_dir),
        "executor": "slurm",
        "job_id": "42",
        "tasks": [TaskRecord(0, str(run_dir))],
    }
    fields.update(kw)
    return RunRecord(**fields)


def _append(path: Path, **rec: Any) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"time": time.time(), **rec}) + "\n")


class FakeCluster:
    """A job that trains, gets interrupted by the drill's action, is requeued and resumes."""

    def __init__(self, run_dir: Path, kind: str, *, operator: bool = True) -> None:
        self.run_dir, self.kind = run_dir, kind
        self.operator = operator  # may raise a time limit (root, SlurmUser, an operator)
        self.limit = "00:20:00"
        self.state, self.restarts = "RUNNING", 0
        self.calls: list[tuple[Any, ...]] = []
        self.events = run_dir / "events.jsonl"
        self.metrics = run_dir / "metrics.jsonl"
        _append(self.events, event="start", step=0, restart_count=0)
        for step in (10, 20, 30):
            _append(self.metrics, kind="train", step=step)

    def show_job(self, job_id: str) -> dict[str, str]:
        return {
            "JobState": self.state,
            "Restarts": str(self.restarts),
            "NodeList": "n[1-2]",
            "Partition": "debug",
            "StartTime": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "TimeLimit": self.limit,
        }

    def may_raise_time_limits(self) -> bool:
        self.calls.append(("may_raise",))
        return self.operator

    def partitions(self) -> list[Partition]:
        nodes = ("n1", "n2")
        return [
            Partition("debug", True, None, nodes, "UP", "REQUEUE", 1, 4),
            Partition("urgent", False, None, nodes, "UP", "OFF", 2, 4),
        ]

    def _stop(self, event: str, step: int = 34) -> None:
        _append(self.metrics, kind="train", step=step)
        _append(self.events, event="signal", step=step, restart_count=0, received_at=time.time())
        _append(self.events, event=event, step=step, restart_count=0)
        _append(self.events, event="checkpoint", step=step, restart_count=0)

    def submit(self, script: Path, args: list[str]) -> str:
        self.calls.append(("submit", tuple(args)))
        self._stop("preempted")
        self.state, self.restarts = "PENDING", 1
        return "99"

    def set_time_limit(self, job_id: str, limit: str) -> None:
        self.calls.append(("time_limit", limit))
        if limit == "00:20:00" and self.limit != limit and not self.operator:
            raise SlurmCommandError(["scontrol"], 1, "Access/permission denied")
        self.limit = limit if ":" in limit else f"00:{int(limit):02d}:00"
        if limit != "00:20:00":
            self._stop("timeout")
            self.state, self.restarts = "PENDING", 1

    def cancel(self, ids: list[str], signal: str | None = None, **kw: Any) -> None:
        self.calls.append(("cancel", signal))
        if signal == "ABRT":
            _append(self.metrics, kind="train", step=37)
            self.state = "FAILED"
        else:
            self._stop("cancelled")
            self.state = "CANCELLED"

    def requeue(self, job_id: str) -> None:
        self.calls.append(("requeue",))
        self.state, self.restarts = "PENDING", self.restarts + 1

    def release(self, job_id: str) -> None:
        self.calls.append(("release",))
        self.state = "RUNNING"
        step = 30 if self.kind == "fail" else 34  # a hard kill resumes from the last save
        _append(self.events, event="resume", step=step, restart_count=self.restarts)
        _append(self.metrics, kind="train", step=step + 1)


@pytest.mark.parametrize("kind", ["preempt", "timeout", "fail"])
def test_drill_comes_back_and_counts_what_was_lost(tmp_path: Path, kind: str) -> None:
    fake = FakeCluster(tmp_path, kind)
    report = Drill(_record(tmp_path), fake, kind, poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert report.outcome.startswith("back: resumed at step")
    if kind == "fail":
        assert (report.last_completed_step, report.resumed_from_step, report.steps_lost) == (
            37,
            30,
            7,
        )
        assert report.stop_event is None and report.notes
        assert ("cancel", "ABRT") in fake.calls and ("requeue",) in fake.calls
    else:
        assert (report.last_completed_step, report.resumed_from_step, report.steps_lost) == (
            34,
            34,
            0,
        )
        assert report.stop_event == ("preempted" if kind == "preempt" else "timeout")
        assert report.checkpoint_step == 34 and report.signal_to_checkpoint_s is not None
    assert report.restart_to_first_step_s is not None
    if kind == "preempt":
        (submit,) = [c for c in fake.calls if c[0] == "submit"]
        assert "--partition=urgent" in submit[1] and "--nodelist=n1" in submit[1]
    if kind == "timeout":  # lowered, then put back before the restart
        limits = [c[1] for c in fake.calls if c[0] == "time_limit"]
        assert limits[-1] == "00:20:00" and len(limits) == 2


class ExpeditedCluster(FakeCluster):
    """A cluster whose requeue starts the job again at once (``--requeue=expedite``, 26.05
    here): the job is never seen PENDING, there is nothing to release."""

    def _started_again(self) -> None:
        self.state = "RUNNING"
        step = 30 if self.kind == "fail" else 34
        _append(self.events, event="resume", step=step, restart_count=self.restarts)
        _append(self.metrics, kind="train", step=step + 1)

    def submit(self, script: Path, args: list[str]) -> str:
        job = super().submit(script, args)
        self._started_again()
        return job

    def set_time_limit(self, job_id: str, limit: str) -> None:
        super().set_time_limit(job_id, limit)
        if self.state == "PENDING":
            self._started_again()

    def requeue(self, job_id: str) -> None:
        super().requeue(job_id)
        self._started_again()

    def release(self, job_id: str) -> None:
        raise AssertionError("an expedited requeue has nothing to release")


@pytest.mark.parametrize("kind", ["preempt", "timeout", "fail"])
def test_a_drill_of_an_expedited_requeue_sees_it_back_without_a_release(
    tmp_path: Path, kind: str
) -> None:
    fake = ExpeditedCluster(tmp_path, kind)
    report = Drill(_record(tmp_path), fake, kind, poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert report.outcome.startswith("back: resumed at step"), report.outcome
    if kind == "timeout":  # lowered, then put back
        limits = [c[1] for c in fake.calls if c[0] == "time_limit"]
        assert limits[-1] == "00:20:00" and len(limits) == 2


def test_cancel_drill_stays_cancelled(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path, "cancel")
    report = Drill(_record(tmp_path), fake, "cancel", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert report.outcome == "cancelled, not requeued"
    assert report.steps_lost == 0 and report.resumed_from_step is None
    assert ("release",) not in fake.calls


def test_a_drill_counts_only_the_steps_of_the_attempt_it_stopped(tmp_path: Path) -> None:
    """An earlier attempt got further (it crashed at 40 and restarted in place from its save at
    30): a cancel at 34 saves 34 and loses nothing; the 40 is that crash's loss, not this one's."""
    fake = FakeCluster(tmp_path, "cancel")
    _append(fake.metrics, kind="train", step=40)
    time.sleep(0.01)
    _append(fake.events, event="resume", step=30, restart_count=0, in_place=1)
    time.sleep(0.01)
    _append(fake.metrics, kind="train", step=32)
    report = Drill(_record(tmp_path), fake, "cancel", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert (report.last_completed_step, report.checkpoint_step, report.steps_lost) == (34, 34, 0)


def test_a_drill_waits_for_the_attempt_running_now_to_train(tmp_path: Path) -> None:
    """Just after a restart in place only the earlier attempt's steps are on record: the drill
    does not act until the new attempt trains (else it would stop a run still starting)."""
    fake = FakeCluster(tmp_path, "cancel")
    time.sleep(0.01)
    _append(fake.events, event="resume", step=30, restart_count=0, in_place=1)
    drill = Drill(_record(tmp_path), fake, "cancel", poll_s=0.01, timeout_s=5)  # type: ignore[arg-type]
    assert not drill._training()
    time.sleep(0.01)
    _append(fake.metrics, kind="train", step=31)
    assert drill._training()


def test_drill_gives_up_with_one_line(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path, "preempt")
    fake.submit = lambda script, args: "99"  # type: ignore[method-assign]  # nothing happens
    with pytest.raises(Exception, match="gave up after 0 s waiting for the job to be requeued"):
        run_drill(_record(tmp_path), fake, "preempt", timeout_s=0.2)  # type: ignore[arg-type]


def test_drill_refuses_what_it_cannot_drill(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path, "preempt")
    with pytest.raises(UsageError, match="local run"):
        Drill(_record(tmp_path, executor="local"), fake, "preempt")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="job array"):
        Drill(_record(tmp_path, array_size=4), fake, "preempt")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="choose one of"):
        Drill(_record(tmp_path), fake, "explode")  # type: ignore[arg-type]
    fake.state = "COMPLETED"
    with pytest.raises(Exception, match="already ended"):
        Drill(_record(tmp_path), fake, "preempt", poll_s=0.01).run()  # type: ignore[arg-type]


def test_report_text_and_json() -> None:
    r = DrillReport(
        "r-1", "42", "preempt", outcome="back", steps_lost=0, signal_to_checkpoint_s=2.5
    )
    text = "\n".join(r.lines())
    assert "steps lost              0" in text and "2.5 s" in text
    # issue 45: a row the drill cannot know is left out, never printed as n/a
    assert "n/a" not in text and "resumed from step" not in text
    assert json.loads(json.dumps(r.to_dict()))["steps_lost"] == 0


def test_cli_drill_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drill", "x", "--kind", "bogus"], io.StringIO()) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_dry_run_says_which_python_a_command_runs(tmp_path: Path) -> None:
    import sys

    spec = tmp_path / "byo.yaml"
    spec.write_text(
        "name: byo\nresources: {partition: debug, nodes: 1}\n"
        "entrypoint: {command: [python, train.py, --lr, '0.1']}\n"
    )
    out = io.StringIO()
    assert main(["submit", str(spec), "--dry-run", "--runs-dir", str(tmp_path / "runs")], out) == 0
    text = out.getvalue()
    assert f"# entrypoint.command runs as: {sys.executable} train.py --lr 0.1" in text
    assert "interpreter of the environment jobs runs in" in text


def test_timeout_drill_where_a_limit_cannot_be_raised_again_is_refused_before_acting(
    tmp_path: Path,
) -> None:
    fake = FakeCluster(tmp_path, "timeout", operator=False)
    with pytest.raises(UsageError, match=r"^drill --kind timeout: only an operator may raise") as e:
        Drill(_record(tmp_path), fake, "timeout", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert "time out again at every restart" in str(e.value) and "\n" not in str(e.value)
    assert [c for c in fake.calls if c[0] == "time_limit"] == [] and fake.limit == "00:20:00"


def test_timeout_drill_whose_cost_was_accepted_says_the_limit_stayed_short(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path, "timeout", operator=False)
    drill = Drill(
        _record(tmp_path), fake, "timeout", poll_s=0.01, timeout_s=5, accept_short_limit=True
    )  # type: ignore[arg-type]
    report = drill.run()
    assert report.stop_event == "timeout"
    assert report.notes[0].startswith("accepted before acting: only an operator")
    assert any("not the original 00:20:00" in n for n in report.notes)
    assert fake.limit != "00:20:00"  # what the user accepted, and what the report says


def test_timeout_drill_restores_and_reads_back_the_limit(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path, "timeout")
    report = Drill(_record(tmp_path), fake, "timeout", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert (
        fake.limit == "00:20:00" and "time limit restored to 00:20:00 (read back)" in report.notes
    )


def test_a_timeout_drill_that_gives_up_puts_the_limit_back(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path, "timeout")
    fake.set_time_limit = lambda job_id, limit: setattr(fake, "limit", limit)  # type: ignore[method-assign]
    with pytest.raises(DrillError, match="gave up"):
        Drill(_record(tmp_path), fake, "timeout", poll_s=0.01, timeout_s=0.2).run()  # type: ignore[arg-type]
    assert fake.limit == "00:20:00"  # never requeued, yet not left short


class FakeCommandRun(FakeCluster):
    """A run of the user's own command: its steps only in what it reports (train.report)."""

    def __init__(self, run_dir: Path, *, reports: bool, resumes: bool) -> None:
        self.reports, self.resumes = reports, resumes
        self.run_dir, self.kind, self.operator = run_dir, "preempt", True
        self.limit, self.state, self.restarts = "00:20:00", "RUNNING", 0
        self.calls = []
        self.events, self.metrics = run_dir / "events.jsonl", run_dir / "metrics.jsonl"
        _append(self.events, event="start", step=None, restart_count=0, entrypoint=["python"])
        for step in (10, 20, 30, 40):
            self._report(step)

    def _report(self, step: int) -> None:
        if self.reports:
            _append(self.metrics, kind="report", step=step, scalars={"loss": 1.0})

    def _stop(self, event: str, step: int = 34) -> None:
        _append(self.events, event=event, step=None, restart_count=0)

    def release(self, job_id: str) -> None:
        self.calls.append(("release",))
        self.state = "RUNNING"
        time.sleep(0.01)
        _append(self.events, event="start", step=None, restart_count=1, entrypoint=["python"])
        for step in (50, 60) if self.resumes else (10, 20):
            self._report(step)


@pytest.mark.parametrize("resumes", [True, False])
def test_a_command_that_reports_its_steps_is_told_where_it_resumed(
    tmp_path: Path, resumes: bool
) -> None:
    """Issue 45: a drill of a command said "back: restarted" and six rows of n/a."""
    fake = FakeCommandRun(tmp_path, reports=True, resumes=resumes)
    report = Drill(_record(tmp_path), fake, "preempt", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    text = "\n".join(report.lines())
    assert "n/a" not in text
    assert report.last_completed_step == 40 and report.report_interval == 10
    if resumes:
        assert report.outcome == "back: resumed (first step reported after the restart: 50)"
        assert report.first_step_after_restart == 50 and report.steps_lost == 9
        assert "last completed step     40 (+-10: reported every 10)" in text
    else:
        assert report.outcome.startswith("back: started over")
        assert report.first_step_after_restart == 10 and report.steps_lost == 40


def test_a_command_that_reports_nothing_is_not_said_to_have_resumed(tmp_path: Path) -> None:
    fake = FakeCommandRun(tmp_path, reports=False, resumes=True)
    report = Drill(_record(tmp_path), fake, "preempt", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    text = "\n".join(report.lines())
    assert report.outcome == "back: restarted; whether your code resumed is not known"
    assert "n/a" not in text and "steps lost" not in text and "train.report(step)" in text


class OthersJob(FakeCluster):
    """The same job, but Slurm says another user submitted it."""

    def show_job(self, job_id: str) -> dict[str, str]:
        return {**super().show_job(job_id), "UserId": "root(0)"}


@pytest.mark.parametrize("kind", ["preempt", "timeout", "fail", "cancel"])
def test_a_drill_of_another_users_job_is_refused_in_one_line_before_acting(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A colleague's run directory (``jobs drill DIR``): Slurm would refuse each action to a
    user halfway through; the drill refuses before it does anything (exit 2 in the CLI)."""
    monkeypatch.setattr("os.geteuid", lambda: 1001)
    fake = OthersJob(tmp_path, kind, operator=False)
    with pytest.raises(
        UsageError, match=r"^drill: job 42 \(r-1\) belongs to root, not to you"
    ) as e:
        Drill(_record(tmp_path), fake, kind, poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
    assert [c for c in fake.calls if c[0] != "may_raise"] == []
    assert fake.state == "RUNNING" and fake.limit == "00:20:00"


def test_a_drill_of_ones_own_job_by_uid_goes_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)  # root may drill any job
    report = run_drill(_record(tmp_path), OthersJob(tmp_path, "preempt"), "preempt", timeout_s=5)  # type: ignore[arg-type]
    assert report.outcome.startswith("back")


def test_a_preempt_drill_that_cannot_write_its_script_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCluster(tmp_path, "preempt")

    def refuse(*args: object, **kw: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("jobs.drill.make_dirs", refuse)
    with pytest.raises(
        DrillError, match=r"cannot write .*preempt.sbatch \(Permission denied\); nothing"
    ):
        Drill(_record(tmp_path), fake, "preempt", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert [c for c in fake.calls if c[0] == "submit"] == []


class HeldCluster(FakeCluster):
    """Slurm's requeue hold: the requeued job waits in BeginTime until 130 s from now."""

    def show_job(self, job_id: str) -> dict[str, str]:
        info = super().show_job(job_id)
        if self.state == "PENDING":
            held = time.localtime(time.time() + 130)
            info.update(Reason="BeginTime", StartTime=time.strftime("%Y-%m-%dT%H:%M:%S", held))
        return info


def test_a_drill_says_what_a_real_stop_would_cost_the_hold_included(tmp_path: Path) -> None:
    # Issue 46: the drill releases the hold (3 s, goodput 0.94) where a real preemption of the
    # same script waits 120-148 s more: it says so, with the hold it released
    fake = HeldCluster(tmp_path, "preempt")
    report = Drill(_record(tmp_path), fake, "preempt", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert report.held_s is not None and 125 <= report.held_s <= 130
    assert ("release",) in fake.calls
    assert any("a real stop also waits Slurm's requeue hold" in n for n in report.notes)
    # and says what cuts it (jobs.chain: a successor queued ahead)
    assert any("requeue.mode: fastest queues a successor ahead" in n for n in report.notes)
    assert any(ln.strip().startswith("Slurm's requeue hold") for ln in report.lines())


class Dropping(FakeCluster):
    """The cluster behind a connection that drops: ``lose[name]`` says how the next call of
    that action goes: "before" (never reached Slurm), "after" (done there, the reply lost)."""

    def __init__(self, run_dir: Path, kind: str, lose: dict[str, str], shows_lost: int = 0):
        super().__init__(run_dir, kind)
        self.lose, self.shows_lost = dict(lose), shows_lost

    def _maybe(self, name: str, do: Any) -> Any:
        from cluster.ssh import SshConnectionError

        how = self.lose.pop(name, None)
        if how == "before":
            raise SshConnectionError("login1", "Connection closed by 127.0.0.1 port 22")
        got = do()
        if how == "after":
            raise SshConnectionError("login1", "Connection reset by 127.0.0.1 port 22")
        return got

    def show_job(self, job_id: str) -> dict[str, str]:
        if self.shows_lost > 0:
            from cluster.ssh import SshConnectionError

            self.shows_lost -= 1
            raise SshConnectionError("login1", "Connection refused")
        return super().show_job(job_id)

    def submit(self, script: Path, args: list[str]) -> str:
        return str(self._maybe("submit", lambda: super(Dropping, self).submit(script, args)))

    def cancel(self, ids: list[str], signal: str | None = None, **kw: Any) -> None:
        self._maybe("cancel", lambda: super(Dropping, self).cancel(ids, signal, **kw))

    def requeue(self, job_id: str) -> None:
        self._maybe("requeue", lambda: super(Dropping, self).requeue(job_id))


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("jobs.follow.RETRY_S", (0.01, 0.02))


@pytest.mark.usefixtures("quick_backoff")
def test_a_lost_scancel_reply_is_checked_in_slurm_not_sent_again(tmp_path: Path) -> None:
    fake = Dropping(tmp_path, "cancel", {"cancel": "after"})
    said: list[str] = []
    drill = Drill(_record(tmp_path), fake, "cancel", poll_s=0.01, timeout_s=5, say=said.append)  # type: ignore[arg-type]
    report = drill.run()
    assert report.outcome == "cancelled, not requeued"
    assert [c for c in fake.calls if c[0] == "cancel"] == [("cancel", None)]  # once
    assert any("Slurm shows it took effect" in line for line in said)


@pytest.mark.usefixtures("quick_backoff")
def test_an_action_that_never_reached_slurm_is_sent_again(tmp_path: Path) -> None:
    fake = Dropping(tmp_path, "cancel", {"cancel": "before"})
    report = Drill(_record(tmp_path), fake, "cancel", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert report.outcome == "cancelled, not requeued"
    assert [c for c in fake.calls if c[0] == "cancel"] == [("cancel", None)]


@pytest.mark.usefixtures("quick_backoff")
def test_a_lost_abort_is_never_sent_twice(tmp_path: Path) -> None:
    """--kind fail: a second ABRT could kill the restarted step; where the reply is lost the
    drill does not send it again and waits to see what the first did."""
    fake = Dropping(tmp_path, "fail", {"cancel": "after", "requeue": "after"})
    report = Drill(_record(tmp_path), fake, "fail", poll_s=0.01, timeout_s=5).run()  # type: ignore[arg-type]
    assert report.outcome.startswith("back: resumed")
    assert [c for c in fake.calls if c[0] in ("cancel", "requeue")] == [
        ("cancel", "ABRT"),
        ("requeue",),
    ]
    assert any("not sent again" in n for n in report.notes)


@pytest.mark.usefixtures("quick_backoff")
def test_slurm_unreachable_for_a_while_is_waited_out_in_one_line(tmp_path: Path) -> None:
    fake = Dropping(tmp_path, "preempt", {}, shows_lost=3)
    said: list[str] = []
    drill = Drill(_record(tmp_path), fake, "preempt", poll_s=0.01, timeout_s=5, say=said.append)  # type: ignore[arg-type]
    assert drill.run().outcome == "back: resumed at step 34"
    assert sum("trying again with back-off" in line for line in said) == 1
    assert sum("connected again" in line for line in said) == 1


@pytest.mark.usefixtures("quick_backoff")
def test_a_connection_gone_past_the_timeout_ends_the_drill_in_one_line(tmp_path: Path) -> None:
    fake = Dropping(tmp_path, "preempt", {}, shows_lost=10**6)
    with pytest.raises(DrillError, match="gave up after 0 s without a connection"):
        Drill(_record(tmp_path), fake, "preempt", poll_s=0.01, timeout_s=0.3).run()  # type: ignore[arg-type]
