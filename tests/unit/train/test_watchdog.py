"""The hang watchdog (issue 15) without Slurm: heartbeats, the timeout, and a frozen rank.

The end-to-end case runs two plain 'rank' processes that beat every 50 ms (no torch, no
process group), freezes one with SIGSTOP from outside, and checks what the watchers do: the
live rank's stacks are dumped (its spinning frame visible), the frozen one is recorded as
stopped, one ``hang`` event names it, and both ranks are ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from train.hang.heartbeat import (
    HANG_FLOOR_S,
    Beat,
    Heartbeat,
    auto_timeout,
    read_beats,
    stuck_ranks,
)
from train.history import RunHistory

REPO = Path(__file__).resolve().parents[3]


def test_heartbeat_is_read_back_and_a_short_file_is_no_beat(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path, 1, {"rank": 1, "pid": 7, "node": "n2"})
    assert read_beats(tmp_path, 2) == {}  # created, no step yet
    before = time.time()
    hb.beat(41)
    hb.beat(42)
    beats = read_beats(tmp_path, 2)
    assert list(beats) == [1] and beats[1].step == 42 and beats[1].time >= before
    assert json.loads((tmp_path / "rank-1.json").read_text())["node"] == "n2"
    (tmp_path / "rank-0").write_bytes(b"\x01\x02")  # torn / foreign: ignored
    assert list(read_beats(tmp_path, 2)) == [1]
    hb.close()
    hb.beat(43)  # after close: a no-op, not an error


def test_timeout_derives_from_step_time_with_a_floor() -> None:
    assert auto_timeout(None, 0.0) == HANG_FLOOR_S
    assert auto_timeout(0.05, 1.0) == HANG_FLOOR_S
    assert auto_timeout(10.0, 1.0) == 200.0  # slow steps: 20 x the mean
    assert auto_timeout(0.05, 40.0) == 120.0  # long evaluations/checkpoints seen: 3 x the gap


def test_stuck_ranks_are_those_without_a_step_for_the_timeout() -> None:
    now = 1000.0
    beats = {0: Beat(0, 50, now - 1), 1: Beat(1, 49, now - 30), 2: Beat(2, 50, now - 2)}
    assert stuck_ranks(beats, now, 10) == [1]
    assert stuck_ranks(beats, now, 60) == []
    assert stuck_ranks(beats, now, 0.5) == [0, 1, 2]


RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from train.hang.heartbeat import Watchdog

    rank = int(sys.argv[2])
    wd = Watchdog(Path(sys.argv[1]), rank=rank, world_size=2, job_id=None, restart_count=0,
                  timeout_s=1.5, budgets={"max_hangs": 2}, poll_s=0.2)

    def spin_in_training_step(step):
        time.sleep(0.05)

    step = 0
    while step < 100000:
        spin_in_training_step(step)
        step += 1
        wd.beat(step)
    """
)


def _wait(pred: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_a_frozen_rank_is_detected_dumped_recorded_and_ended(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(r)], env=env)
        for r in (0, 1)
    ]
    try:
        progress = tmp_path / "run" / ".progress" / "local-0"
        assert _wait(lambda: len(read_beats(progress, 2)) == 2, 30), "ranks never beat"
        frozen_at = time.monotonic()
        os.kill(procs[1].pid, signal.SIGSTOP)
        # both ranks end (the watchers SIGKILL them) within timeout + poll + dump wait
        assert _wait(lambda: all(p.poll() is not None for p in procs), 30)
        latency = time.monotonic() - frozen_at
        assert [p.returncode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    hangs = tmp_path / "run" / "hangs" / "local-0"
    events = [e for e in RunHistory(tmp_path / "run").events() if e["event"] == "hang"]
    assert len(events) == 1, events
    hang = events[0]
    assert hang["ranks"] == [1] and hang["no_stacks"] == [1] and hang["kind"] == "hang"
    assert hang["timeout_s"] == 1.5 and hang["stacks_dir"] == str(hangs)
    observed = {o["rank"]: o for o in hang["observed"]}
    assert observed[1]["stopped"] and observed[1]["state"] == "T"
    assert not observed[0]["stopped"]
    stacks = (hangs / "rank-0.stacks").read_text()
    assert "spin_in_training_step" in stacks, stacks  # the frame the rank was in
    assert not (hangs / "rank-1.stacks").exists()  # a stopped process cannot dump
    assert json.loads((hangs / "decided").read_text())["ranks"] == [1]
    assert latency < 1.5 + 15, latency
