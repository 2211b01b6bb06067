"""Issue 46's figures against the floor (bench/bench_goodput.py, bench/goodput_hold.py,
bench/bench_inplace.py): the pure parts that turn what a run recorded into ratios and splits
(no timing assertions: not a benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.bench_goodput import Row, _floor_figures, _hold_figures, _table, exit_to_requeue
from bench.bench_inplace import _split
from bench.goodput_hold import HoldRow, hold_table


def _limit(per: float, first: float) -> Row:
    limit = Row("physical limit", completed=True)
    limit.restart_s, limit.first_step_s = [per], first
    return limit


def test_every_row_per_preemption_and_first_start_against_the_floor() -> None:
    ours = Row("ours: plain script, no recipe", restart_s=[10.0, 12.0], first_step_s=6.0)
    ours.split = [(1.0, 5.0, 4.0), (1.5, 6.0, 4.5)]
    ours.first_split = (0.5, 3.25, 2.25)
    peer = Row("submitit Checkpointable", restart_s=[8.0], first_step_s=3.0)
    figures = {f.name: f for f in _floor_figures([ours, peer], _limit(10.0, 4.0))}
    per = figures["per preemption vs the floor: ours: plain script, no recipe"]
    assert per.ratio == pytest.approx(1.1) and per.status == "fail"  # 11 s vs 10 s: > 1.05x
    assert "1.0 / 5.0 / 4.0; 1.5 / 6.0 / 4.5" in per.note
    first = figures["first start vs the floor: ours: plain script, no recipe"]
    assert first.ratio == pytest.approx(1.5) and first.goal is not None
    assert "0.50 / 3.25 / 2.25" in first.note
    assert "| 6.0 | 0.50 / 3.25 / 2.25 |" in _table([ours, peer], _limit(10.0, 4.0))
    assert "| 3.0 | - |" in _table([ours, peer], _limit(10.0, 4.0))  # no split recorded
    # a peer is measured the same way, with no goal of ours
    assert figures["first start vs the floor: submitit Checkpointable"].goal is None
    assert figures["per preemption vs the floor: submitit Checkpointable"].ratio == 0.8


def test_the_torch_ddp_rows_against_their_scripts_own_floor() -> None:
    # the plain script and the peers run torch's DDP and optimizer (its compiler imported):
    # their restart against a trivial job's + that script's start under a plain srun
    limit = _limit(10.0, 4.0)
    limit.trivial_restart_s, limit.script_start_s, limit.trivial_first_s = 4.0, 3.5, 0.5
    ours = Row("ours: plain script, no recipe", restart_s=[7.0, 8.0], first_step_s=4.4)
    recipe = Row("ours: entrypoint.command", restart_s=[7.0])
    peer = Row("submitit Checkpointable", restart_s=[7.5])
    figures = {f.name: f for f in _floor_figures([ours, recipe, peer], limit)}
    own = figures["per preemption vs its script's floor: ours: plain script, no recipe"]
    assert own.ratio == pytest.approx(1.0) and own.status == "pass"  # 7.5 s vs 7.5 s
    assert "3.50 s" in own.note
    first = figures["first start vs its script's floor: ours: plain script, no recipe"]
    assert first.ratio == pytest.approx(1.1) and first.status == "fail"  # 4.4 s vs 0.5 + 3.5 s
    assert figures["per preemption vs its script's floor: submitit Checkpointable"].goal is None
    # the recipe's script imports no compiler: only the import-torch floor applies
    assert "per preemption vs its script's floor: ours: entrypoint.command" not in figures
    # without the uninterrupted run's start, no such figure
    assert not any("its script's floor" in n for n in
                   {f.name for f in _floor_figures([ours], _limit(10.0, 4.0))})  # fmt: skip


def test_a_commands_exit_to_its_requeue_from_the_runs_own_events(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    lines = [
        {"time": 10.0, "event": "preempted", "job_id": "5"},
        {"time": 12.25, "event": "requeue", "via": "scontrol", "exited_at": 12.0},
        {"time": 20.0, "event": "requeue", "via": "command"},  # not ours: no figure
        {"time": 31.5, "event": "requeue", "via": "scontrol"},  # an older run: no exited_at
        {"time": 40.75, "event": "requeue", "via": "scontrol", "exited_at": 40.0},
    ]
    events.write_text("".join(json.dumps(e) + "\n" for e in lines) + "not json\n")
    assert exit_to_requeue(events) == [0.25, 0.75]
    row = Row("ours: plain script, no recipe", exit_to_requeue=[0.25, 0.75])
    figures = {f.name: f for f in _floor_figures([row], _limit(10.0, 4.0))}
    slowest = figures["command exit -> requeued (the slowest stop): ours: plain script, no recipe"]
    assert slowest.ours == 0.75 and slowest.status == "fail"  # the goal: 0.5 s
    assert "0.250, 0.750" in slowest.note
    assert "| 0.25, 0.75 |" in _table([row], _limit(10.0, 4.0))
    fast = Row("ours: entrypoint.command", exit_to_requeue=[0.2])
    assert _floor_figures([fast], _limit(10.0, 4.0))[0].status == "pass"


def test_the_successor_against_the_requeue_with_its_hold() -> None:
    held = HoldRow("hold kept: requeue (the same job)", "requeue", 140.0, (1.0, 130.0, 9.0))
    held.reasons = {"BeginTime"}
    fast = HoldRow("hold kept: fastest (successor queued ahead)", "fastest", 14.0,
                   (1.0, 4.0, 9.0), used="chain: requeue.mode: fastest: ...")  # fmt: skip
    figures = {f.name: f for f in _hold_figures([held, fast], _limit(10.0, 4.0))}
    versus = figures["hold kept: fastest (successor) vs requeue"]
    assert versus.ratio == pytest.approx(0.1) and versus.status == "pass"
    kept = figures["preemption -> training, hold kept: requeue (the same job)"]
    assert kept.ratio == pytest.approx(14.0) and "['BeginTime']" in kept.note
    table = hold_table([held, fast])
    assert "| 140.0 | 1.0 / 130.0 / 9.0 | BeginTime |" in table
    failed = HoldRow("hold kept: requeue (the same job)", "requeue", note="error: x")
    assert _hold_figures([failed], _limit(10.0, 4.0))[0].status == "skipped"


def test_a_restart_in_place_split_from_the_runs_events() -> None:
    events = [
        {"time": 90.0, "event": "start"},
        {"time": 101.0, "event": "failure"},
        {"time": 102.0, "event": "restart_in_place"},
        {"time": 106.0, "event": "resume", "startup": {"import": 1.5, "group": 0.5}},
    ]
    events[-1]["startup"] = {"main": 0.4, "imports": 1.5, "restored": 0.5}
    assert _split(events, 100.0, 107.0) == (2.0, 5.0, "main 0.40, imports 1.50, restored 0.50")
    assert _split(events[:2], 100.0, 107.0) is None  # no restart in place recorded


def test_a_process_start_is_read_from_proc_on_the_wall_clock() -> None:
    """The first start's split needs when the process running the user's code began: read from
    /proc (its start after boot) against the boot clock, on the wall clock the bench uses."""
    before = time.time()
    code = "from bench.goodput_work import process_start; print(process_start())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    after = time.time()
    began = float(out)
    assert before - 0.05 <= began <= after  # 10 ms ticks; the interpreter started in between
