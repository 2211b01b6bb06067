"""Chains of jobs (jobs.chain, issue 48): where requeue works, the links as submitted, the
link hooks (done-check, no progress, top-up, the end), and one run for status/logs/cancel."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from cluster.client import SlurmClient
from cluster.models import ClusterLimits, JobInfo
from jobs import records
from jobs.chain import (
    chain_state,
    hold_against_successor,
    link_end,
    link_start,
    requeue_problem,
    requeue_support,
)
from jobs.errors import SubmitError
from jobs.load import load_text
from jobs.monitor import cancel, print_logs, states_many
from jobs.records import RunRecord
from jobs.submit import _chain_or_requeue, make_plan, submit, submit_slurm
from train.history import RunHistory

SPEC = "name: ch\ntrain: {max_steps: 5}\n"


def _loaded(tmp_path: Path, *overrides: str, text: str = SPEC) -> Any:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_text(text, str(path), overrides)


@pytest.mark.parametrize(
    ("job_requeue", "mode", "works"),
    [
        ("1", "REQUEUE", True),
        ("1", "OFF", True),
        ("1", "SUSPEND,GANG", True),
        ("0", "REQUEUE", False),
        ("1", "CANCEL", False),
        ("1", "cancel", False),
        ("", "", True),
    ],
)
def test_where_requeue_works(job_requeue: str, mode: str, works: bool) -> None:
    assert (requeue_problem(job_requeue, mode) is None) == works


class SettingsClient:
    """What the mode decision reads: JobRequeue and the partition's PreemptMode, counted."""

    def __init__(self, modes: dict[str, str], job_requeue: str = "1") -> None:
        self.modes, self.job_requeue, self.asked = modes, job_requeue, 0

    def conf_stamp(self) -> str:
        return "/etc/slurm/slurm.conf:100:1.0"

    def requeue_settings(self, partition: str) -> tuple[str, str]:
        self.asked += 1
        return self.job_requeue, self.modes[partition]


def test_the_settings_are_asked_once_per_slurm_conf(tmp_path: Path) -> None:
    client = SettingsClient({"debug": "REQUEUE", "cancel": "CANCEL"})
    assert requeue_support(client, "debug", tmp_path) is None  # type: ignore[arg-type]
    why = requeue_support(client, "cancel", tmp_path)  # type: ignore[arg-type]
    assert why is not None and why.startswith("partition cancel: its PreemptMode is CANCEL")
    assert requeue_support(client, "debug", tmp_path) is None  # type: ignore[arg-type]
    assert requeue_support(client, "cancel", tmp_path) == why  # type: ignore[arg-type]
    assert client.asked == 2
    (tmp_path / "requeue-support.json").write_text("{damaged")
    assert requeue_support(client, "debug", tmp_path) is None  # type: ignore[arg-type]
    assert client.asked == 3


def test_auto_is_a_chain_where_requeue_does_not_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = SettingsClient({"cancel": "CANCEL", "debug": "REQUEUE"})
    loaded, why = _chain_or_requeue(_loaded(tmp_path), client, "cancel", HELD)  # type: ignore[arg-type]
    assert loaded.spec.requeue.mode == "chain"
    assert why.startswith("requeue does not work here: partition cancel")
    assert all(t.spec.requeue.mode == "chain" for t in loaded.tasks)
    assert "the run goes as a chain of jobs" in capsys.readouterr().err
    # auto (the default) keeps a requeue where it works, whatever the hold
    loaded, _ = _chain_or_requeue(_loaded(tmp_path), client, "debug", HELD)  # type: ignore[arg-type]
    assert loaded.spec.requeue.mode == "requeue"
    forced = _loaded(tmp_path, "requeue.mode=requeue")
    assert _chain_or_requeue(forced, client, "cancel", HELD)[0].spec.requeue.mode == "requeue"  # type: ignore[arg-type]


#: Slurm's defaults, every local cluster's: a requeued job held 120 s (cred_expire), a newly
#: eligible job started by the next pass within 30 s (bf_interval)
HELD = ClusterLimits()


@pytest.mark.parametrize(
    ("limits", "sooner", "said"),
    [
        (HELD, True, "Slurm holds a requeued job 120 s in BeginTime (cred_expire); a successor "
                     "queued ahead waits at most 30 s"),
        # the expedited requeue of 25.11+ lifts the hold after a node failure only
        (ClusterLimits(expedited_requeue=True), True, "120 s in BeginTime (cred_expire)"),
        (ClusterLimits(requeue_delay_s=5), False,
         "holds a requeued job 5 s (requeue_delay), no longer than a successor"),
        (ClusterLimits(cred_expire_s=30, successor_wait_s=30), False, "30 s (cred_expire)"),
        (ClusterLimits(cred_expire_s=300, successor_wait_s=60), True, "at most 60 s"),
    ],
)  # fmt: skip
def test_a_successor_is_back_sooner_where_the_hold_is_longer_than_a_pass(
    limits: ClusterLimits, sooner: bool, said: str
) -> None:
    got, why = hold_against_successor(limits)
    assert got is sooner and said in why


def test_fastest_queues_a_successor_ahead_where_it_is_back_sooner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 46: requeue.mode fastest on a cluster with Slurm's default hold: a chain, and
    why; where requeue_delay is short: a requeue; where requeue does not work: a chain; a
    sweep (no chains yet): a requeue that says so."""
    client = SettingsClient({"cancel": "CANCEL", "debug": "REQUEUE"})
    fastest = _loaded(tmp_path, "requeue.mode=fastest")
    loaded, why = _chain_or_requeue(fastest, client, "debug", HELD)  # type: ignore[arg-type]
    assert loaded.spec.requeue.mode == "chain"
    assert all(t.spec.requeue.mode == "chain" for t in loaded.tasks)
    assert why.startswith("requeue.mode: fastest: Slurm holds a requeued job 120 s")
    err = capsys.readouterr().err
    assert err.startswith("jobs: a successor queued ahead is back sooner than a requeue here")
    assert len(err.splitlines()) == 1
    short = ClusterLimits(requeue_delay_s=5)
    loaded, why = _chain_or_requeue(fastest, client, "debug", short)  # type: ignore[arg-type]
    assert loaded.spec.requeue.mode == "requeue" and "no longer than" in why
    loaded, why = _chain_or_requeue(fastest, client, "cancel", short)  # type: ignore[arg-type]
    assert loaded.spec.requeue.mode == "chain" and "PreemptMode is CANCEL" in why
    text = (
        "name: sw\ntrain: {}\nrequeue: {mode: fastest}\nsweep:\n  grid:\n    train.seed: [1, 2]\n"
    )
    loaded, why = _chain_or_requeue(_loaded(tmp_path, text=text), client, "debug", HELD)  # type: ignore[arg-type]
    assert loaded.spec.requeue.mode == "requeue" and why.endswith("a sweep cannot be a chain yet")


def test_the_record_and_jobs_status_say_how_the_run_comes_back(
    tmp_path: Path, stub_slurm: Path
) -> None:
    """Issue 46: run.json keeps the restart mode used and why; jobs status shows it."""
    from jobs.statusview import restart_mode_line

    loaded = _loaded(tmp_path, "requeue.mode=chain")
    why = "requeue.mode: fastest: Slurm holds a requeued job 120 s in BeginTime (cred_expire)"
    record = submit_slurm(loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient(),
                          restart_reason=why)  # fmt: skip
    saved = records.load_record(record.run_dir)
    assert (saved.restart_mode, saved.restart_reason) == ("chain", why)
    assert restart_mode_line(saved.restart_mode, saved.restart_reason) == (
        f"  restarts: a successor queued ahead (chain of jobs): {why}"
    )
    plain = _loaded(tmp_path, "requeue.mode=requeue")
    record = submit_slurm(plain, make_plan(plain, tmp_path / "runs2"), SlurmClient())
    saved = records.load_record(record.run_dir)
    assert (saved.restart_mode, saved.restart_reason) == ("requeue", "requeue.mode: requeue")


def test_a_sweep_as_a_chain_is_refused_in_one_line(tmp_path: Path) -> None:
    text = "name: sw\ntrain: {}\nrequeue: {mode: chain}\nsweep:\n  grid:\n    train.seed: [1, 2]\n"
    loaded = _loaded(tmp_path, text=text)
    with pytest.raises(SubmitError, match=r"spec.yaml:3:\d+: requeue.mode: a sweep cannot run"):
        _chain_or_requeue(loaded, SettingsClient({}), "debug", HELD)  # type: ignore[arg-type]


def test_a_chain_is_its_links_queued_afternotok(tmp_path: Path, stub_slurm: Path) -> None:
    loaded = _loaded(tmp_path, "requeue.mode=chain", "requeue.chain_depth=2")
    record = submit_slurm(loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient())
    assert record.chain_job_ids == ["4242", "4243", "4244"] and record.job_id == "4242"
    args = [(stub_slurm / f"sbatch-args-{n}.txt").read_text().split() for n in range(3)]
    assert not any(a.startswith("--dependency") for a in args[0])
    assert "--dependency=afternotok:4242" in args[1]
    assert "--dependency=afternotok:4243" in args[2]
    script = (stub_slurm / "submitted-0.sh").read_text()
    assert (stub_slurm / "submitted-2.sh").read_text() == script
    lines = script.splitlines()
    assert "#SBATCH --no-requeue" in lines and "#SBATCH --requeue" not in lines
    assert any("-m jobs.chain link-start" in ln for ln in lines)
    assert "trap link_end EXIT" in lines
    assert lines.index("trap link_end EXIT") < next(
        i for i, ln in enumerate(lines) if ln.startswith("  srun ")
    )
    slurm = Path(record.run_dir) / "slurm"
    for jid in record.chain_job_ids:
        assert (slurm / f"{jid}_submitted.pkl").exists()
    assert "mode: chain" in (Path(record.run_dir) / "resolved.yaml").read_text()
    assert records.load_record(record.run_dir).chain_job_ids == record.chain_job_ids


def test_a_refused_requeue_resubmits_as_a_chain(
    tmp_path: Path, stub_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sbatch = stub_slurm.parent / "stub-bin" / "sbatch"
    text = sbatch.read_text().replace(
        'cp "$script"',
        "if grep -q -- '^#SBATCH --requeue' \"$script\"; then\n"
        "  echo 'sbatch: error: --requeue is not allowed on this cluster' >&2; exit 1\nfi\n"
        'cp "$script"',
    )
    sbatch.write_text(text)
    loaded = _loaded(tmp_path)
    record = submit(loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient(), "slurm",
                    preflight=False)  # fmt: skip
    assert record.chain_job_ids == ["4242", "4243", "4244"]
    assert "sbatch refused --requeue" in capsys.readouterr().err


class LinkClient:
    def __init__(self) -> None:
        self.submitted: list[list[str]] = []
        self.cancelled: list[str] = []

    def submit(self, script: Path, args: list[str]) -> str:
        self.submitted.append(list(args))
        return str(100 + len(self.submitted))

    def cancel(self, ids: list[str], *, no_requeue: bool = False) -> None:
        assert no_requeue
        self.cancelled.extend(ids)


def _chain_run(tmp_path: Path, ids: list[str], stall: int = 3) -> RunRecord:
    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    (run / "resolved.yaml").write_text(
        f"name: ch\ntrain: {{}}\nrequeue: {{mode: chain, chain_depth: 2, "
        f"chain_stall_links: {stall}}}\n"
    )
    (run / "slurm" / f"{ids[0]}_submitted.pkl").write_bytes(pickle.dumps("task"))
    rec = RunRecord(
        "ch-1", "ch", str(run), "slurm", job_id=ids[0],
        tasks=[records.TaskRecord(0, str(run), {})], chain_job_ids=list(ids),
    )  # fmt: skip
    records.save_record(rec)
    return rec


def test_a_link_that_starts_records_itself_and_queues_one_more(tmp_path: Path) -> None:
    rec = _chain_run(tmp_path, ["1", "2", "3"])
    client = LinkClient()
    assert link_start(Path(rec.run_dir), "1", client) == "run"  # type: ignore[arg-type]
    assert client.submitted == []  # two queued behind it already
    RunHistory(rec.run_dir).append("checkpoint", step=10)
    assert link_start(Path(rec.run_dir), "2", client) == "resume 1"  # type: ignore[arg-type]
    assert client.submitted == [["--dependency=afternotok:3"]]
    assert records.load_record(rec.run_dir).chain_job_ids == ["1", "2", "3", "101"]
    slurm = Path(rec.run_dir) / "slurm"
    assert (slurm / "101_submitted.pkl").read_bytes() == (slurm / "1_submitted.pkl").read_bytes()
    starts = [e for e in RunHistory(rec.run_dir).events() if e["event"] == "link_started"]
    assert [(e["job_id"], e["link"], e["checkpoint_step"]) for e in starts] == [
        ("1", 0, None), ("2", 1, 10),
    ]  # fmt: skip


def test_a_completed_run_ends_the_chain_at_the_next_start(tmp_path: Path) -> None:
    rec = _chain_run(tmp_path, ["1", "2", "3"])
    RunHistory(rec.run_dir).append("complete", step=5)
    client = LinkClient()
    assert link_start(Path(rec.run_dir), "2", client) == "exit 0"  # type: ignore[arg-type]
    assert client.cancelled == ["3"] and client.submitted == []
    end = [e for e in RunHistory(rec.run_dir).events() if e["event"] == "chain_ended"]
    assert end and end[0]["reason"] == "completed"


def test_links_without_checkpoint_progress_end_the_chain(tmp_path: Path) -> None:
    rec = _chain_run(tmp_path, ["1", "2", "3", "4", "5"], stall=2)
    history = RunHistory(rec.run_dir)
    history.append("checkpoint", step=10)
    client = LinkClient()
    assert link_start(Path(rec.run_dir), "1", client) == "run"  # type: ignore[arg-type]
    assert link_start(Path(rec.run_dir), "2", client) == "resume 1"  # type: ignore[arg-type]
    assert link_start(Path(rec.run_dir), "3", client) == "exit 3"  # type: ignore[arg-type]
    assert client.cancelled == ["5", "4"]
    end = [e for e in history.events() if e["event"] == "chain_ended"][-1]
    assert end["reason"].startswith(
        "no progress: 2 links in a row ended at the checkpoint of step 10"
    )


def test_a_spent_budget_ends_the_chain(tmp_path: Path) -> None:
    rec = _chain_run(tmp_path, ["1", "2", "3"])
    client = LinkClient()
    assert link_start(Path(rec.run_dir), "1", client) == "run"  # type: ignore[arg-type]
    RunHistory(rec.run_dir).append("budget_exhausted", reason="preempted 20x")
    link_end(Path(rec.run_dir), "1", 3, client)  # type: ignore[arg-type]
    assert client.cancelled == ["3", "2"]


def test_a_link_stopped_to_be_resumed_leaves_the_chain_to_the_next(tmp_path: Path) -> None:
    rec = _chain_run(tmp_path, ["1", "2", "3"])
    client = LinkClient()
    link_end(Path(rec.run_dir), "1", 75, client)  # type: ignore[arg-type]
    link_end(Path(rec.run_dir), "1", 143, client)  # type: ignore[arg-type]  # killed by Slurm
    assert client.cancelled == []
    RunHistory(rec.run_dir).append("complete", step=5)
    link_end(Path(rec.run_dir), "2", 0, client)  # type: ignore[arg-type]
    assert client.cancelled == ["3"]


def _infos(**states: str) -> dict[str, JobInfo]:
    return {j.lstrip("j"): JobInfo(j.lstrip("j"), s) for j, s in states.items()}


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (_infos(j1="RUNNING", j2="PENDING", j3="PENDING"), ("RUNNING", "1")),
        (_infos(j1="PREEMPTED", j2="RUNNING", j3="PENDING"), ("RUNNING", "1")),
        (_infos(j1="CANCELLED", j2="PENDING", j3="PENDING"), ("PENDING", "1")),
        (_infos(j1="PREEMPTED", j2="COMPLETED", j3="CANCELLED"), ("COMPLETED", "1")),
        (_infos(j1="PREEMPTED", j2="FAILED", j3="CANCELLED"), ("FAILED", "1")),
        (_infos(j1="CANCELLED", j2="CANCELLED", j3="CANCELLED"), ("CANCELLED", "1")),
    ],
)
def test_a_chain_has_one_state(
    tmp_path: Path, states: dict[str, JobInfo], expected: tuple[str, str]
) -> None:
    rec = RunRecord("c", "c", str(tmp_path), "slurm", job_id="1", chain_job_ids=["1", "2", "3"])
    info = chain_state(rec, states)
    assert info is not None and (info.state, info.job_id) == expected


class StateClient:
    def __init__(self, states: dict[str, str]) -> None:
        self.states, self.asked, self.cancelled = states, [], []  # type: ignore[var-annotated]

    def cluster_name(self) -> str:  # cluster.Slurm: the state cache's key ("": none named)
        return ""

    def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
        self.asked.append(sorted(ids))
        return {j: JobInfo(j, s, name="c") for j, s in self.states.items() if j in ids}

    def cancel(self, ids: list[str], *, no_requeue: bool = False) -> None:
        self.cancelled.extend(ids)


def test_status_logs_and_cancel_see_one_run_across_its_links(tmp_path: Path) -> None:
    rec = RunRecord(
        "c", "c", str(tmp_path), "slurm", job_id="1", chain_job_ids=["1", "2", "3"],
        tasks=[records.TaskRecord(0, str(tmp_path), {})],
    )  # fmt: skip
    client = StateClient({"1": "PREEMPTED", "2": "RUNNING", "3": "PENDING"})
    states = states_many([rec], lambda: client, ttl_s=0)  # type: ignore[arg-type,return-value]
    assert client.asked == [["1", "2", "3"]]
    assert list(states) == ["1"] and states["1"].state == "RUNNING"
    assert cancel(rec, lambda: client) == ["3", "2", "1"]  # type: ignore[arg-type,return-value]
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "1_0_log.out").write_text("link one\n")
    (tmp_path / "slurm" / "2_0_log.out").write_text("link two\n")
    out = io.StringIO()
    assert print_logs(rec, 0, None, out) == 2
    assert "link one" in out.getvalue() and "link two" in out.getvalue()
    assert json.loads(rec.to_json())["chain_job_ids"] == ["1", "2", "3"]
    assert rec.slurm_job_ids() == ["1", "2", "3"]


def test_the_ledger_sees_one_run_and_the_waits_between_links(tmp_path: Path) -> None:
    """One ``sacct -D`` for every link; each link that ran is one attempt in the order they
    ran; the wait from a link's end to the next link's start is its own part (links), and the
    parts still add up to the wall time."""
    from cluster.models import JobAttempt
    from jobs.goodputview import run_ledger

    rec = RunRecord(
        "c", "c", str(tmp_path), "slurm", job_id="1", chain_job_ids=["1", "2", "3", "4"],
        tasks=[records.TaskRecord(0, str(tmp_path), {})], submitted_at=100.0,
    )  # fmt: skip
    lines = [
        {"time": 101.0, "event": "link_started", "job_id": "1", "link": 0},
        {"time": 110.0, "event": "start", "step": 0, "restart_count": 0, "job_id": "1"},
        {"time": 150.0, "event": "preempted", "step": 40, "restart_count": 0, "job_id": "1"},
        {"time": 181.0, "event": "link_started", "job_id": "2", "link": 1},
        {"time": 190.0, "event": "resume", "step": 40, "restart_count": 0, "job_id": "2"},
        {"time": 250.0, "event": "complete", "step": 100, "restart_count": 0, "job_id": "2"},
        {"time": 251.0, "event": "chain_ended", "job_id": "2", "reason": "completed"},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))

    class Sacct:
        asked: list[str] = []  # noqa: RUF012

        def attempt_times(self, job_id: str) -> list[JobAttempt]:
            self.asked.append(job_id)
            return [
                JobAttempt("1", "PREEMPTED", 100.0, 100.0, 101.0, 155.0),
                JobAttempt("2", "COMPLETED", 100.0, 155.0, 180.0, 252.0),
                JobAttempt("3", "CANCELLED", 100.0, None, None, 252.0),
                JobAttempt("4", "CANCELLED", 181.0, None, None, 252.0),
            ]

    led = run_ledger(rec, Sacct, now=400.0)
    assert Sacct.asked == ["1,2,3,4"]
    assert led.parts["links"] == pytest.approx(180.0 - 155.0)
    assert led.parts["held"] == 0.0 and led.parts["queued"] == pytest.approx(1.0)
    assert sum(led.parts.values()) == pytest.approx(252.0 - 100.0)
    assert led.parts["unaccounted"] == 0.0


@pytest.mark.parametrize(
    ("answer", "code", "link"),
    [("run", 0, ""), ("resume 2", 0, "2"), ("resume", 0, "1"), ("exit 3", 3, None)],
)
def test_the_link_hook_in_the_batch_script(
    tmp_path: Path, answer: str, code: int, link: str | None
) -> None:
    """What the script does with link-start's answer: run the step, run it as a resume
    (SLURM_TRAIN_LINK for train: env.resumed), or end the link; link-end runs at the exit."""
    import subprocess

    from jobs.render import chain_lines
    from train.env import DistEnv

    stub = tmp_path / "python"
    calls = tmp_path / "calls"
    stub.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\ncase "$*" in *link-start*) echo \'{answer}\' ;; esac\n'
    )
    stub.chmod(0o755)
    script = "\n".join(
        [*chain_lines(tmp_path / "run dir", python=str(stub)),
         f"echo \"step link=${{SLURM_TRAIN_LINK-unset}}\" >> {calls}", "exit 0"]
    )  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77"}
    proc = subprocess.run(["bash", "-c", script], env=env, check=False)
    assert proc.returncode == code
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("-P -m jobs.chain link-start ") and "run dir" in lines[0]
    end = f"-P -m jobs.chain link-end {tmp_path / 'run dir'} --job-id 77 --exit-code {code}"
    # a link told to exit ends before its exit hook is set: link-start ended the chain itself
    assert (lines[-1] == end) == (link is not None)
    steps = [ln for ln in lines if ln.startswith("step ")]
    if link is None:
        assert steps == []
    else:
        assert steps == [f"step link={link or 'unset'}"]
        env_of_step = {"SLURM_TRAIN_LINK": link} if link else {}
        assert DistEnv.from_env(env_of_step).resumed == bool(link)


@pytest.mark.parametrize(("code", "ends"), [(75, False), (0, True), (3, True), (1, True)])
def test_a_link_stopped_for_the_next_leaves_without_the_link_end_interpreter(
    tmp_path: Path, code: int, ends: bool
) -> None:
    """Issue 46: a link that exits 75 (stopped for its successor, which resumes) leaves its
    nodes without starting link-end (which would do nothing for 75); every other end runs it,
    and the script keeps the step's exit code."""
    import subprocess

    from jobs.render import chain_lines

    stub = tmp_path / "python"
    calls = tmp_path / "calls"
    answer = 'case "$*" in *link-start*) echo run ;; esac'
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n{answer}\n')
    stub.chmod(0o755)
    script = "\n".join([*chain_lines(tmp_path / "run", python=str(stub)), f"exit {code}"])
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77"}
    assert subprocess.run(["bash", "-c", script], env=env, check=False).returncode == code
    lines = calls.read_text().splitlines()
    assert any("link-end" in ln for ln in lines) is ends


@pytest.mark.parametrize("chain", [True, False])
def test_a_link_stopped_for_the_next_exits_without_the_after_step_interpreter(
    tmp_path: Path, chain: bool
) -> None:
    """Issue 46: the step of a link exits 75 (stopped for its successor): the script ends with
    75 at once, starting neither the after-step question nor link-end; a job that is not a
    link asks the after-step as before (a requeue Slurm refused is retried there)."""
    import subprocess

    from jobs.executor import in_place_loop
    from jobs.render import chain_lines

    stub = tmp_path / "python"
    calls = tmp_path / "calls"
    answer = 'case "$*" in *link-start*) echo run ;; *after-step*) echo "exit 75" ;; esac'
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n{answer}\n')
    stub.chmod(0o755)
    hooks = chain_lines(tmp_path / "run", python=str(stub)) if chain else []
    loop = in_place_loop("sh -c 'exit 75'", tmp_path / "run" / "slurm", python=str(stub))
    script = "\n".join([*hooks, loop])
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77"}
    assert subprocess.run(["bash", "-c", script], env=env, check=False).returncode == 75
    asked = calls.read_text().splitlines() if calls.exists() else []
    assert any("--after-step" in ln for ln in asked) is not chain
    assert not any("link-end" in ln for ln in asked)


def test_follow_reads_every_links_log_in_turn(tmp_path: Path) -> None:
    from jobs.follow import ChainTail

    rec = RunRecord("c", "c", str(tmp_path), "slurm", job_id="1", chain_job_ids=["1", "2", "3"])
    records.save_record(rec)
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "1_0_log.out").write_text("one\n")
    tail = ChainTail(rec, 0)
    assert tail.read() == ["one"] and tail.read() == []
    rec.chain_job_ids.append("4")  # link 2 queued link 4; link 3 never ran
    records.save_record(rec)
    (tmp_path / "slurm" / "2_0_log.out").write_text("two\n")
    (tmp_path / "slurm" / "4_0_log.out").write_text("four\n")
    assert tail.read() == ["two"] and tail.read() == ["four"] and tail.read() == []


def test_the_plot_names_each_link_of_a_chain_as_its_attempt(tmp_path: Path) -> None:
    from jobs.plot import read_series

    history = RunHistory(tmp_path)
    for k, jid in enumerate(("1", "2")):
        history.append("link_started", job_id=jid, link=k)
        history.append("start" if k == 0 else "resume", step=10 * k, restart_count=0, job_id=jid)
    history.append("complete", step=20, restart_count=0, job_id="2")
    life = read_series(tmp_path, "run").life
    assert [(e, a) for _, e, a in life if e in ("start", "resume", "complete")] == [
        ("start", "(link 0)"), ("resume", "(link 1)"), ("complete", "(link 1)"),
    ]  # fmt: skip


def test_progress_counts_the_checkpoints_on_disk_too(tmp_path: Path) -> None:
    """Interval saves record no event: a link that saved step-30 on disk made progress."""
    from jobs.chain import last_checkpoint_step

    events = [{"event": "checkpoint", "step": 10}, {"event": "resume", "step": 20}]
    assert last_checkpoint_step(events) == 20
    (tmp_path / "checkpoints" / "step-30.b1").mkdir(parents=True)
    (tmp_path / "checkpoints" / ".step-40.tmp").mkdir()  # being written, not committed
    assert last_checkpoint_step(events, tmp_path) == 30
    assert last_checkpoint_step([], tmp_path / "missing") is None


def test_an_expedited_submission_records_the_hold_its_requeue_skips(
    tmp_path: Path, stub_slurm: Path
) -> None:
    """Issue 43: where the cluster allows it the job asks --requeue=expedite, and run.json
    keeps the hold a plain requeue waits there (the goodput ledger shows what was saved); a
    chain (--no-requeue) asks nothing and records none."""
    from cluster import ClusterLimits

    levers = ClusterLimits(expedited_requeue=True, cred_expire_s=90, slurm_version="26.05.5")
    loaded = _loaded(tmp_path, "requeue.mode=requeue")
    record = submit_slurm(
        loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient(), cluster=levers
    )
    assert "#SBATCH --requeue=expedite" in (stub_slurm / "submitted-0.sh").read_text()
    assert records.load_record(record.run_dir).expedited_hold_s == 90
    chain = _loaded(tmp_path, "requeue.mode=chain", "requeue.chain_depth=1")
    record = submit_slurm(chain, make_plan(chain, tmp_path / "runs"), SlurmClient(), cluster=levers)
    assert records.load_record(record.run_dir).expedited_hold_s is None
