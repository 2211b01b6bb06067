"""The goodput ledger as a table: recorded event/metric sequences -> seconds per part."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from jobs.goodput import PARTS, Ledger, compute, sum_ledgers


@dataclass(frozen=True)
class A:  # a Slurm attempt (cluster.models.JobAttempt's times)
    submit: float | None
    start: float | None
    end: float | None


def ev(t: float, name: str, step: int | None = None, restart: int = 0, **kw: Any) -> dict:
    return {"time": t, "event": name, "step": step, "restart_count": restart, **kw}


def steps(t0: float, first: int, last: int, dt: float = 1.0) -> list[dict]:
    return [
        {"time": t0 + (s - first + 1) * dt, "kind": "train", "step": s}
        for s in range(first, last + 1)
    ]


UP = {"main": 1.0, "imports": 1.5}  # 2.5 s from the process start to the start event

CASES: dict[str, tuple[list[dict], list[dict], list[A], dict[str, float], int]] = {
    "uninterrupted": (
        [ev(5, "start", 0, startup=UP), ev(105, "complete", 100)],
        [
            *steps(5, 1, 49, dt=1.0),
            {"time": 55.5, "kind": "eval", "step": 50, "seconds": 1.0},
            {"time": 56.0, "kind": "train", "step": 50, "checkpoint_s": 0.5},
        ],
        [A(0, 2, 106)],
        {"queued": 2, "startup": 3, "eval": 1, "checkpoint": 0.5, "productive": 98.5, "stop": 1},
        0,
    ),
    "preempted, resumed from an older checkpoint": (
        [
            ev(5, "start", 0, startup=UP),
            ev(20.1, "signal", 15, signal="SIGUSR2", received_at=20.0),
            ev(20.8, "checkpoint", 15),
            ev(21, "preempted", 15, kind="preemption"),
            ev(21.5, "requeue", 15, via="scontrol"),
            ev(50, "resume", 10, restart=1, startup=UP),
            ev(70, "complete", 30, restart=1),
        ],
        steps(5, 1, 15),
        [A(0, 2, 30), A(30, 45, 80)],
        {
            "queued": 2,
            "held": 15,
            "startup": 8,
            "redone": 15.1 * 5 / 15,
            "productive": 15.1 * 10 / 15 + 20,
            "stop": 19.9,
        },
        5,
    ),
    "hang restarted in place": (
        [
            ev(5, "start", 0, startup=UP),
            ev(50, "hang", 15, timeout_s=30),
            ev(51, "restart_in_place", 15),
            ev(56, "resume", 15, startup={"main": 1.0, "imports": 2.0}),
            ev(70, "complete", 29),
        ],
        steps(5, 1, 15),
        [A(0, 2, 71)],
        {"queued": 2, "startup": 6, "productive": 29, "hang": 30, "stop": 4},
        0,
    ),
    "local run: no Slurm times": (
        [
            ev(5, "start", 0, startup=UP),
            ev(20, "signal", 15, received_at=20),
            ev(21, "preempted", 15),
            ev(21.5, "requeue", 15, via="exit_code"),
            ev(30, "resume", 15, restart=1, startup=UP),
            ev(40, "complete", 25, restart=1),
        ],
        steps(5, 1, 15),
        [],
        {"unaccounted": 2.5 + 6, "startup": 5, "productive": 25, "stop": 1.5},
        0,
    ),
    "still running": (
        [ev(5, "start", 0, startup=UP)],
        steps(5, 1, 30),
        [A(0, 2, None)],
        {"queued": 2, "startup": 3, "productive": 35},
        0,
    ),
    "Slurm's End truncated to the second": (
        [
            ev(5, "start", 0, startup=UP),
            ev(20.2, "preempted", 15),
            ev(20.9, "requeue", 15, via="scontrol"),
            ev(30, "resume", 15, restart=1, startup=UP),
            ev(40, "complete", 25, restart=1),
        ],
        steps(5, 1, 15),
        [A(0, 2, 20), A(20, 28, 41)],  # End 20: the requeue at 20.9 was cut to the second
        {"queued": 2, "held": 7.1, "startup": 3 + 2, "productive": 15.2 + 10, "stop": 0.7 + 1},
        0,
    ),
    "stopping now": (
        [ev(5, "start", 0, startup=UP), ev(30, "signal", 25, received_at=30)],
        steps(5, 1, 25),
        [A(0, 2, None)],
        {"queued": 2, "startup": 3, "productive": 25, "stop": 10},
        0,
    ),
    "held by Slurm now": (
        [
            ev(5, "start", 0, startup=UP),
            ev(20, "signal", 15, received_at=20),
            ev(21, "preempted", 15),
        ],
        steps(5, 1, 15),
        [A(0, 2, 22), A(22, None, None)],
        {"queued": 2, "held": 18, "startup": 3, "productive": 15, "stop": 2},
        0,
    ),
    "died without a record": (
        [
            ev(5, "start", 0, startup=UP),
            ev(40, "resume", 10, restart=1, startup=UP),
            ev(50, "complete", 20, restart=1),
        ],
        steps(5, 1, 12),
        [A(0, 2, 30), A(30, 35, 51)],
        {
            "queued": 2,
            "held": 5,
            "startup": 3 + 5,
            "productive": 12 - 2 + 10,
            "redone": 2,
            "unaccounted": 30 - 17,
            "stop": 1,
        },
        2,
    ),
}


def _recorded_late(dt: float) -> tuple[list[dict], list[dict], list[A], dict[str, float], int]:
    """ "died without a record", whose node failure the next attempt recorded (late: true),
    ``dt`` s after its own resume event (or before): it ends attempt 0, never the attempt
    writing it, and what was unaccounted there is stop overhead (the failure's cost)."""
    events, metrics, attempts, want, redone = CASES["died without a record"]
    late = ev(40 + dt, "node_fail", None, nodes=["n2"], late=True)
    parts = {k: v for k, v in want.items() if k != "unaccounted"}
    parts["stop"] += want["unaccounted"]
    return [*events[:2], late, *events[2:]], metrics, attempts, parts, redone


CASES.update(
    {
        f"node failure recorded late, {when} the next resume": _recorded_late(dt)
        for when, dt in (("before", -0.1), ("after", 0.3))
    }
)


@pytest.mark.parametrize("name", list(CASES))
def test_ledger_table(name: str) -> None:
    events, metrics, attempts, want, redone = CASES[name]
    led = compute(events, metrics, attempts, submitted_at=0.0, now=40.0)
    got = {k: round(v, 6) for k, v in led.parts.items() if v}
    assert got == pytest.approx({k: float(v) for k, v in want.items()}), name
    assert led.steps_redone == redone
    end = attempts[-1].end if attempts and attempts[-1].end else None
    wall = end or (
        40.0
        if name in ("still running", "stopping now", "held by Slurm now")
        else events[-1]["time"]
    )
    assert led.wall_s == pytest.approx(wall)  # the parts add up to the wall time


def test_goodput_line_names_the_biggest_loss() -> None:
    events, metrics, attempts, _, _ = CASES["preempted, resumed from an older checkpoint"]
    led = compute(events, metrics, attempts, now=0.0)
    assert led.line() == "goodput 0.38 (biggest loss: stop overhead 20 s)"
    data = led.to_dict()
    assert set(data["parts_s"]) == set(PARTS) and data["goodput"] == pytest.approx(
        (15.1 * 10 / 15 + 20) / 80, abs=1e-4
    )


def test_a_command_records_no_steps() -> None:
    events = [
        ev(5, "start", None, startup=UP, entrypoint=["python", "x.py"]),
        ev(30, "complete", None, exit_code=0),
    ]
    led = compute(events, [], [A(0, 2, 31)], now=99.0)
    assert led.parts["productive"] == 25 and led.steps_redone == 0
    assert any("command" in n for n in led.notes)


def test_a_commands_start_up_runs_to_its_first_output_in_each_process_run() -> None:
    """Each segment's start-up ends at its own first output (``first_output_at`` on the
    supervisor's events of that process run); stopped before its first output: start-up until
    the stop. Without it (a silent command, an older run's record) training starts at the start
    event, as before; an older segment's value never moves a later one."""
    events = [
        ev(5, "start", None, startup=UP),
        ev(20, "signal", None, signal="USR2", first_output_at=9),
        ev(21, "requeue", None, reason="preempted", first_output_at=9),
        ev(30, "resume", None, restart=1, startup=UP),
        ev(50, "complete", None, restart=1, exit_code=0, first_output_at=34.5),
    ]
    led = compute(events, [], [A(0, 2, 22), A(22, 28, 50)], now=99.0)
    # startup: 2 -> 9 and 28 -> 34.5; productive: 9 -> 20 and 34.5 -> 50
    assert led.parts["startup"] == pytest.approx(7 + 6.5)
    assert led.parts["productive"] == pytest.approx(11 + 15.5)
    assert sum(led.parts.values()) == pytest.approx(50)
    stale = [*events[:3], ev(30, "resume", None, restart=1), ev(50, "complete", None, restart=1)]
    led = compute(stale, [], [A(0, 2, 22), A(22, 28, 50)], now=99.0)
    assert led.parts["startup"] == pytest.approx(7 + 2)
    late = [ev(5, "start", None), ev(7, "signal", None, first_output_at=7.5)]
    led = compute([*late, ev(8, "requeue", None)], [], [A(0, 2, 9)], now=99.0)
    assert led.parts["productive"] == 0 and led.parts["startup"] == 5
    assert sum(led.parts.values()) == pytest.approx(9)
    silent = [ev(5, "start", None), ev(7, "signal", None), ev(8, "requeue", None)]
    led = compute(silent, [], [A(0, 2, 9)], now=99.0)
    assert led.parts["productive"] == 2 and led.parts["startup"] == 3


def test_a_first_output_never_moves_a_built_in_runs_start() -> None:
    """The built-in trainer's segments carry their step: training starts at their event."""
    events = [ev(5, "start", 0), ev(15, "complete", 10, first_output_at=6)]
    led = compute(events, steps(5, 1, 10), [A(0, 2, 15)], now=99.0)
    assert led.parts["startup"] == 3 and led.parts["productive"] == 10


@pytest.mark.parametrize(
    "events",
    [
        [],
        [{"event": "start"}, {"time": "x", "event": "resume"}, "not a dict"[:0] or {}],
        [{"time": 1.0, "event": "checkpoint"}],  # nothing opened a segment
    ],
)
def test_damaged_or_empty_records_give_an_empty_or_unaccounted_ledger(events: list) -> None:
    led = compute(events, [{"time": None}], [], submitted_at=0.0, now=10.0)
    assert led.wall_s == pytest.approx(10.0) and led.parts["unaccounted"] == pytest.approx(10.0)
    assert compute(events, [], [], now=10.0).wall_s == 0.0  # no origin at all: nothing to say


def test_sweep_sums_tasks() -> None:
    a = compute(*CASES["uninterrupted"][:3], now=0.0)
    b = compute(*CASES["hang restarted in place"][:3], now=0.0)
    total = sum_ledgers([a, b])
    assert total.wall_s == pytest.approx(a.wall_s + b.wall_s)
    assert total.parts["hang"] == 30 and total.goodput == pytest.approx((98.5 + 29) / (106 + 71))
    assert Ledger().line() == ""


def _write_run(tmp_path: Any, events: list[dict], metrics: list[dict]) -> Any:
    import json

    from jobs.records import RunRecord, TaskRecord, save_record

    run = tmp_path / "run"
    run.mkdir()
    for name, lines in (("events.jsonl", events), ("metrics.jsonl", metrics)):
        text = "".join(json.dumps(x) + "\n" for x in lines)
        (run / name).write_text(text + "{torn line\n", encoding="utf-8")  # a damaged line
    record = RunRecord(
        run_id="r", name="r", run_dir=str(run), executor="slurm", job_id="4",
        submitted_at=1.0, tasks=[TaskRecord(index=0, run_dir=str(run), values={})],
    )  # fmt: skip
    save_record(record)
    return run


def test_status_view_reads_the_run_and_slurm_times(tmp_path: Any) -> None:
    from pathlib import Path

    from cluster.parse import parse_sacct_attempts
    from jobs.goodputview import dir_ledger

    recorded = (Path(__file__).parents[1] / "cluster/data/sacct_attempts.txt").read_text()
    asked: list[str] = []

    class Recorded:  # answers one sacct -D from the recorded output
        def attempt_times(self, job_id: str) -> list[Any]:
            asked.append(job_id)
            return [a for a in parse_sacct_attempts(recorded) if a.job_id == job_id]

    four = [a for a in parse_sacct_attempts(recorded) if a.job_id == "4"]
    t0 = four[0].start
    events = [ev(t0 + 1, "start", 0, startup=UP), ev(t0 + 2.5, "signal", 2, received_at=t0 + 2.5),
              ev(t0 + 2.6, "preempted", 2)]  # fmt: skip
    run = _write_run(tmp_path, events, steps(t0 + 1, 1, 2, dt=0.5))
    led = dir_ledger(run, Recorded, now=0.0)
    assert asked == ["4"]  # one query for the run
    assert led.wall_s == pytest.approx(four[-1].end - four[0].submit)
    assert led.parts["startup"] == pytest.approx(1.0) and led.parts["productive"] == 1.5
    assert led.parts["unaccounted"] > 60  # attempts 1-3 ran without writing a record
    assert led.line().startswith("goodput 0.")


def test_a_run_that_never_started_is_all_queued_without_a_second_query(tmp_path: Any) -> None:
    """jobs status has the states already: every task pending, never restarted, no event since
    the submission -> its time so far is queued, and Slurm is not asked for attempt times. A
    task that started (an event), was requeued, or has no state -> Slurm is asked."""
    from cluster.models import JobInfo
    from jobs.goodputview import run_ledger
    from jobs.records import RunRecord, TaskRecord

    asked: list[str] = []

    class Counting:
        def attempt_times(self, job_id: str) -> list[Any]:
            asked.append(job_id)
            return []

    runs = [tmp_path / f"t{i}" for i in range(2)]
    for r in runs:
        r.mkdir()
    (runs[1] / "events.jsonl").write_text('{"time": 5.0, "event": "start"}\n')  # an old run's
    record = RunRecord(
        run_id="sweep", name="sweep", run_dir=str(tmp_path), executor="slurm", job_id="7",
        array_size=2, submitted_at=100.0,
        tasks=[TaskRecord(index=i, run_dir=str(r), values={}) for i, r in enumerate(runs)],
    )  # fmt: skip
    ids = record.job_ids()
    pending = {j: JobInfo(j, "PENDING", restarts=0) for j in ids}
    led = run_ledger(record, Counting, now=160.0, states=pending)
    assert asked == [] and led.wall_s == pytest.approx(120.0)
    assert led.parts["queued"] == pytest.approx(120.0) and led.goodput == 0.0
    # any sign of an attempt: Slurm is asked (once per array)
    (runs[0] / "events.jsonl").write_text('{"time": 120.0, "event": "start"}\n')
    run_ledger(record, Counting, now=160.0, states=pending)
    (runs[0] / "events.jsonl").unlink()
    run_ledger(record, Counting, now=160.0, states={**pending, ids[1]: JobInfo(ids[1], "RUNNING")})
    requeued = {**pending, ids[0]: JobInfo(ids[0], "PENDING", restarts=1)}
    run_ledger(record, Counting, now=160.0, states=requeued)
    run_ledger(record, Counting, now=160.0, states={ids[0]: pending[ids[0]]})
    run_ledger(record, Counting, now=160.0)
    assert asked == ["7"] * 5


# -- a hang is measured from the last progress (issue 44 item 3) ------------------------------


def _command_hang(observed: list[dict] | None) -> Any:
    """A command (no steps, no metrics) that trained 5 h, then hung; the watcher declared it
    after 300 s of silence (timeout_s), having seen 600 s of it."""
    hang = ev(5 + 18000, "hang", None, timeout_s=300.0)
    if observed is not None:
        hang["observed"] = observed
    events = [ev(5, "start", None, startup=UP), hang, ev(18006, "requeue", None)]
    return compute(events, [], [A(0, 2, 18010)], now=0.0)


def test_a_commands_hang_counts_from_its_last_write_not_its_start() -> None:
    """Was: 'goodput 0.00 (biggest loss: undetected hangs 18000 s)'. The watcher's silence of
    the first rank that stopped writing (the longest) is the hang."""
    led = _command_hang([{"rank": 0, "idle_s": 410.0}, {"rank": 1, "idle_s": 600.0}])
    assert led.parts["hang"] == pytest.approx(600.0)
    assert led.parts["productive"] == pytest.approx(18000 - 600)
    assert led.wall_s == pytest.approx(18010)
    # a record without the watcher's view: at least the timeout it waited, not the whole run
    assert _command_hang(None).parts["hang"] == pytest.approx(300.0)


def test_the_built_in_trainers_hang_starts_at_its_last_step_not_its_last_logged_one() -> None:
    """Metrics every 10 steps (1 s a step); it hung after step 47: the hang starts at step 47's
    time (carried forward from step 40's line), never later than the event less timeout_s."""
    metrics = [{"time": 5.0 + s, "kind": "train", "step": s} for s in range(10, 50, 10)]
    events = [ev(5, "start", 0), ev(5 + 47 + 60, "hang", 47, timeout_s=30.0)]
    led = compute(events, metrics, [A(0, 2, 113)], now=0.0)
    assert led.parts["hang"] == pytest.approx(60.0)  # was 67: from step 40's line
    # the watcher's own view wins where it was recorded
    events[1] = {**events[1], "observed": [{"rank": 0, "idle_s": 58.0}]}
    assert compute(events, metrics, [A(0, 2, 113)], now=0.0).parts["hang"] == pytest.approx(58.0)


# -- lines that make sense for any run (issue 45) ----------------------------------------------


def test_the_first_queue_wait_is_not_a_requeue_hold() -> None:
    led = compute(*CASES["uninterrupted"][:3], now=0.0)
    assert led.parts["queued"] == 2 and led.parts["held"] == 0
    requeued = compute(*CASES["held by Slurm now"][:3], now=40.0)
    assert requeued.parts["queued"] == 2 and requeued.parts["held"] == 18
    assert "requeue holds 18 s" in requeued.line()
    first = compute([], [], [A(0, None, None)], now=30.0)
    assert first.line().startswith("goodput 0.00 (biggest loss: first queue wait 30 s")


def test_a_short_run_says_it_is_mostly_start_up() -> None:
    """The demo's 7 s run: goodput 0.40 and a word why."""
    events = [ev(2, "start", 0, startup={"imports": 2.0}), ev(7, "complete", 3)]
    led = compute(events, [], [A(0, 0.5, 7)], now=0.0)
    assert led.goodput == pytest.approx(5 / 7)
    assert "a 7 s run: its start-up and first queue wait weigh more" in led.line()
    long = compute(*CASES["uninterrupted"][:3], now=0.0)  # 106 s, but start-up 5 %
    assert "weigh more" not in long.line()


def test_a_local_run_explains_its_launch_and_its_restarts() -> None:
    """No Slurm (the local executor): the launcher's start is start-up, the wait between a
    recorded stop and the next start a requeue hold; nothing unaccounted."""
    events, metrics, _, _, _ = CASES["local run: no Slurm times"]
    led = compute(events, metrics, [], submitted_at=0.0, now=40.0, slurm=False)
    assert led.parts["unaccounted"] == 0 and led.parts["held"] == pytest.approx(6.0)
    assert led.parts["startup"] == pytest.approx(5 + 2.5)


def _sweep(tmp_path: Any, n: int, submitted_at: float) -> Any:
    from jobs.records import RunRecord, TaskRecord

    runs = [tmp_path / f"t{i}" for i in range(n)]
    for r in runs:
        r.mkdir()
    return RunRecord(
        run_id="sweep", name="sweep", run_dir=str(tmp_path), executor="slurm", job_id="7",
        array_size=n, submitted_at=submitted_at,
        tasks=[TaskRecord(index=i, run_dir=str(r), values={}) for i, r in enumerate(runs)],
    )  # fmt: skip


def test_a_sweep_cancelled_in_the_queue_is_not_unaccounted_later(tmp_path: Any) -> None:
    """Six tasks cancelled 10 s after the submission, asked 5 min later (was: 'goodput 0.00
    (biggest loss: unaccounted 1766 s)'): sacct's one line for the array tasks that never
    started ('7_[0-5]') gives each its wait; the line says task time and the sweep's span."""
    from cluster.models import JobAttempt, JobInfo
    from jobs.goodputview import run_ledger

    record = _sweep(tmp_path, 6, 100.0)

    class Sacct:
        def attempt_times(self, job_id: str) -> list[Any]:
            return [JobAttempt("7_[0-5]", "CANCELLED", 100.0, 100.0, None, 110.0)]

    cancelled = {j: JobInfo(j, "CANCELLED") for j in record.job_ids()}
    led = run_ledger(record, Sacct, now=400.0, states=cancelled)
    assert led.parts["unaccounted"] == 0 and led.parts["queued"] == pytest.approx(60.0)
    assert led.line() == (
        "goodput 0.00 over 6 tasks (60 s of task time in 10 s) "
        "(biggest loss: first queue wait 60 s; a 10 s run: its start-up and first queue wait "
        "weigh more than in a long run)"
    )

    class Nothing:  # sacct kept nothing of them: no time is invented
        def attempt_times(self, job_id: str) -> list[Any]:
            return []

    led = run_ledger(record, Nothing, now=400.0, states=cancelled)
    assert led.wall_s == 0 and "never started (CANCELLED while queued)" in led.notes


def test_a_sweep_just_submitted_is_queued_not_unaccounted(tmp_path: Any) -> None:
    """Task 0 started, the others wait (was: 'unaccounted 32 s')."""
    from cluster.models import JobAttempt, JobInfo
    from jobs.goodputview import run_ledger

    record = _sweep(tmp_path, 3, 100.0)
    ids = record.job_ids()
    (tmp_path / "t0" / "events.jsonl").write_text(
        '{"time": 104.0, "event": "start", "step": 0, "restart_count": 0, "job_id": "7_0"}\n'
    )

    class Sacct:
        def attempt_times(self, job_id: str) -> list[Any]:
            return [JobAttempt("7_0", "RUNNING", 100.0, 100.0, 103.0, None)]

    states = {ids[0]: JobInfo(ids[0], "RUNNING"), **{j: JobInfo(j, "PENDING") for j in ids[1:]}}
    led = run_ledger(record, Sacct, now=116.0, states=states)
    assert led.parts["unaccounted"] == 0
    assert led.parts["queued"] == pytest.approx(3 + 16 + 16)


def test_records_stamped_before_the_submission_by_a_skewed_clock_count(tmp_path: Any) -> None:
    """A node's clock 20 s behind the controller's: its events (this job's id) are this run's,
    not an earlier run's, and the metrics from its first event on with them."""
    import json

    from jobs.goodputview import run_ledger
    from jobs.records import RunRecord, TaskRecord

    run = tmp_path / "run"
    run.mkdir()
    old = {"time": 10.0, "event": "complete", "job_id": "3", "restart_count": 0}  # a run before
    events = [
        old,
        {**ev(85, "start", 0), "job_id": "4"},
        {**ev(185, "complete", 100), "job_id": "4"},
    ]
    metrics = [{"time": 5.0, "kind": "train", "step": 999, "checkpoint_s": 50.0}]
    metrics += [{"time": 85.0 + s, "kind": "train", "step": s, "checkpoint_s": 0.5}
                for s in (50, 100)]  # fmt: skip
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    record = RunRecord(
        run_id="r", name="r", run_dir=str(run), executor="slurm", job_id="4",
        submitted_at=100.0, tasks=[TaskRecord(index=0, run_dir=str(run), values={})],
    )  # fmt: skip
    led = run_ledger(record, None, now=300.0)
    assert led.parts["checkpoint"] == pytest.approx(1.0)  # its own saves, not the old run's
    assert led.parts["productive"] == pytest.approx(84.0)  # 100 -> 185 less the saves
    assert led.parts["unaccounted"] == 0
    assert any("clock" in n for n in led.notes)


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_attempts_are_keyed_by_sluid_where_the_release_prints_one(release: str) -> None:
    """Issue 43: each release's recorded ``sacct -D`` of a requeued job (its times, and the
    SLUID of each run where the release has one: 24.11, 26.05). A run whose restart count does
    not match its row's position (Slurm counted a restart that accounting shows no row for) is
    placed on its own row by its SLUID; on 22.05, by restart count: that row is not there, so
    the hold before it is not Slurm's (no attempt found)."""
    from pathlib import Path

    from cluster.parse import parse_sacct_attempts

    folder = Path(__file__).parents[1] / "cluster" / "data" / release
    lines = (folder / "sacct_attempts.txt").read_text().splitlines()
    named = folder / "sacct_sluid.txt"
    if named.exists():  # JobID|SLUID|State of the same job, from the same accounting
        rows = [line.split("|") for line in named.read_text().splitlines()]
        assert [(r[0], r[2]) for r in rows] == [tuple(line.split("|")[:2]) for line in lines]
        lines = [f"{line}|{r[1]}" for line, r in zip(lines, rows, strict=True)]
    first, second = parse_sacct_attempts("\n".join(lines))
    assert bool(first.sluid and second.sluid) is (release != "22.05")
    assert first.sluid != second.sluid or release == "22.05"
    assert first.start is not None and second.start is not None and second.end is not None

    def named_by(a: Any) -> dict[str, Any]:
        return {"sluid": a.sluid} if a.sluid else {}

    t0, t1 = first.start, second.start
    events = [
        {"time": t0, "event": "start", "step": 0, "restart_count": 0, **named_by(first)},
        {"time": t0 + 0.5, "event": "preempted", "step": 1, "restart_count": 0},
        {"time": t0 + 0.6, "event": "requeue", "step": 1, "restart_count": 0, "via": "slurm"},
        {"time": t1 + 0.5, "event": "resume", "step": 1, "restart_count": 2, **named_by(second)},
        {"time": second.end, "event": "complete", "step": 2, "restart_count": 2},
    ]
    held = compute(events, [], [first, second], now=second.end + 60).parts["held"]
    unnamed = [{k: v for k, v in e.items() if k != "sluid"} for e in events]
    by_restart = compute(unnamed, [], [first, second], now=second.end + 60).parts["held"]
    assert by_restart == 0.0  # restart 2 has no row: no wait is called Slurm's hold
    if release == "22.05":
        assert held == 0.0
    else:  # the resumed run's own row: Slurm's hold before it, up to its Start
        assert held > 0


def test_sacct_is_asked_for_sluids_only_when_the_run_recorded_one(tmp_path: Any) -> None:
    """The ranks record ``SLURM_JOB_SLUID`` (24.11+) in their start events: then the ledger's
    one ``sacct -D`` asks for the SLUID too; a run without one (22.05) never asks for a field
    its release refuses."""
    from jobs.goodputview import dir_ledger
    from train.env import DistEnv

    assert DistEnv.from_env({"SLURM_JOB_SLUID": "s1WNM8F9N7NW00"}).sluid == "s1WNM8F9N7NW00"
    assert DistEnv.from_env({}).sluid == ""
    asked: list[bool] = []

    class Asked:
        def attempt_times(self, job_id: str, sluid: bool = False) -> list[Any]:
            asked.append(sluid)
            return []

    for sluid in ("", "s1WNM8F9N7NW00"):
        named = {"sluid": sluid} if sluid else {}
        folder = tmp_path / (sluid or "none")
        folder.mkdir()
        run = _write_run(folder, [ev(1, "start", 0, **named)], [])
        dir_ledger(run, Asked, now=5.0)
    assert asked == [False, True]


# -- expedited requeues (issue 43: 25.11+'s --requeue=expedite) ---------------------------------
def test_an_expedited_node_failure_requeue_shows_the_hold_it_skipped() -> None:
    """A run submitted with --requeue=expedite on a cluster that holds a requeue 120 s: the
    attempt after the node failure waited 5 s (its Submit -> Start), so 115 s were saved; the
    parts are the same as without it (it is shown, never booked twice)."""
    events, metrics, attempts, _, _ = _recorded_late(0.3)
    plain = compute(events, metrics, attempts, submitted_at=0.0, now=40.0)
    led = compute(events, metrics, attempts, submitted_at=0.0, now=40.0, expedited_hold_s=120)
    assert led.parts == plain.parts and plain.expedited == []
    assert [e.to_dict() for e in led.expedited] == [
        {"attempt": 1, "waited_s": 5.0, "hold_s": 120.0, "saved_s": 115.0}
    ]
    data = led.to_dict()
    assert data["expedite_saved_s"] == 115.0 and len(data["expedited_requeues"]) == 1
    assert "attempt 1" in led.expedited[0].line() and "saved 115 s" in led.expedited[0].line()


def test_only_a_node_failure_requeue_counts_as_expedited() -> None:
    """A preemption's requeue is not expedited (Slurm expedites a node failure's only); nor is
    a node failure whose next attempt has not started yet."""
    events, metrics, attempts, _, _ = CASES["preempted, resumed from an older checkpoint"]
    led = compute(events, metrics, attempts, submitted_at=0.0, now=40.0, expedited_hold_s=120)
    assert led.expedited == []
    events, metrics, _, _, _ = _recorded_late(0.3)
    pending = [A(0, 2, 30), A(30, None, None)]
    led = compute(events[:3], metrics, pending, submitted_at=0.0, now=40.0, expedited_hold_s=120)
    assert led.expedited == []


def test_a_sweeps_ledger_keeps_every_tasks_expedited_requeues() -> None:
    events, metrics, attempts, _, _ = _recorded_late(0.3)
    one = compute(events, metrics, attempts, submitted_at=0.0, now=40.0, expedited_hold_s=60)
    total = sum_ledgers([one, one])
    assert [e.saved_s for e in total.expedited] == [55.0, 55.0]
    assert total.to_dict()["expedite_saved_s"] == 110.0


def test_status_shows_each_expedited_requeue_of_a_run(tmp_path: Any) -> None:
    """The run recorded the hold at submission (run.json's expedited_hold_s); its ledger, read
    with the one sacct -D, shows one line per expedited requeue under the goodput line."""
    import io
    import json

    from cluster.models import JobAttempt
    from jobs.goodputview import run_ledger, write_goodput
    from jobs.records import RunRecord, TaskRecord

    events, _, _, _, _ = _recorded_late(0.3)
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    record = RunRecord(
        run_id="r", name="r", run_dir=str(tmp_path), executor="slurm", job_id="7",
        submitted_at=0.0, tasks=[TaskRecord(0, str(tmp_path), {})], expedited_hold_s=120,
    )  # fmt: skip

    class Sacct:
        def attempt_times(self, job_id: str) -> list[Any]:
            return [
                JobAttempt("7", "NODE_FAIL", 0.0, 0.0, 2.0, 30.0),
                JobAttempt("7", "COMPLETED", 30.0, 30.0, 33.0, 51.0),
            ]

    out = io.StringIO()
    data = write_goodput(run_ledger(record, Sacct, now=60.0), out)
    assert out.getvalue().splitlines()[1] == (
        "  expedited requeue: attempt 1 started 3 s after a node failure's requeue, where a "
        "plain requeue is held 120 s (saved 117 s)"
    )
    assert data["expedite_saved_s"] == 117.0
    record.expedited_hold_s = None  # submitted without --requeue=expedite
    out = io.StringIO()
    assert write_goodput(run_ledger(record, Sacct, now=60.0), out)["expedited_requeues"] == []
    assert len(out.getvalue().splitlines()) == 1
