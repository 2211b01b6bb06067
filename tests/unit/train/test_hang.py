"""The hang watchdog without Slurm (issues 15 and 25): node-local heartbeats and their phases,
the timeout and allowances, the verdict as a table, and end to end with 'rank' processes (no
torch, no process group) on two simulated nodes: a frozen rank, a frozen node (rank and watcher
together), and a long declared evaluation that must not be a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from train.hang.evidence import NodeView, RankView, judge
from train.hang.heartbeat import (
    BUSY_FLOOR_S,
    HANG_FLOOR_S,
    Heartbeat,
    Watchdog,
    allowance,
    auto_timeout,
    node_local_dir,
    read_beat,
    read_beats,
)
from train.history import RunHistory
from train.procfs import STEP_BACK_NICE

REPO = Path(__file__).resolve().parents[3]


def test_heartbeat_is_read_back_with_its_phase_and_a_short_file_is_no_beat(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path, 1, {"rank": 1, "pid": 7, "node": "n2"})
    assert read_beats(tmp_path, 2) == {}  # created, nothing written yet
    before = time.time()
    hb.beat(41)
    hb.write(42, "eval", 3)
    beats = read_beats(tmp_path, 2)
    assert list(beats) == [1]
    assert (beats[1].step, beats[1].phase, beats[1].pulses) == (42, "eval", 3)
    assert beats[1].time >= before
    assert json.loads((tmp_path / "rank-1.json").read_text())["node"] == "n2"
    (tmp_path / "rank-0").write_bytes(b"\x01\x02")  # torn / foreign: ignored
    assert list(read_beats(tmp_path, 2)) == [1]
    hb.write(43, "my own long thing")  # a phase of the user's: reported as busy
    assert read_beat(tmp_path / "rank-1", 1).phase == "busy"  # type: ignore[union-attr]
    hb.close()
    hb.beat(44)  # after close: a no-op, not an error


def test_timeout_derives_from_step_time_and_busy_phases_get_at_least_the_busy_floor() -> None:
    assert auto_timeout(None, 0.0) == HANG_FLOOR_S
    assert auto_timeout(0.05, 1.0) == HANG_FLOOR_S
    assert auto_timeout(10.0, 1.0) == 200.0  # slow steps: 20 x the mean
    assert auto_timeout(0.05, 40.0) == 120.0  # long pauses between steps: 3 x the gap
    # the 98 s evaluation under the default timeout: allowed
    assert allowance("train", HANG_FLOOR_S) == HANG_FLOOR_S
    for phase in ("eval", "save", "start", "compile", "busy"):
        assert allowance(phase, HANG_FLOOR_S) == BUSY_FLOOR_S > 98
    assert allowance("eval", 4000.0) == 4000.0  # a longer timeout wins
    assert allowance("start", 10.0, command=True) == 10.0
    # waiting for the other ranks is no work of its own: the timeout, as in training
    assert allowance("wait", HANG_FLOOR_S) == HANG_FLOOR_S


def test_heartbeats_are_node_local_never_in_the_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    local = node_local_dir(run, "7-0", "n1")
    assert run not in local.parents and local.name == "n1"
    assert node_local_dir(run, "7-0", "n1") == local  # every rank of the node finds it
    assert node_local_dir(tmp_path / "other", "7-0", "n1") != local  # one per run
    assert node_local_dir(run, "7-1", "n1") != local  # and attempt
    wd = Watchdog(
        run, rank=3, world_size=4, job_id="7", restart_count=0, timeout_s=5.0, budgets={},
        node="n1", local_rank=1, local_world_size=2, local_root=tmp_path / "shm",
    )  # fmt: skip
    try:
        path = wd.local_dir / "rank-3"
        assert (tmp_path / "shm") in path.parents
        assert read_beat(path, 3).phase == "start"  # type: ignore[union-attr]
        wd.beat(10)
        with wd.busy("eval"):
            wd.pulse()
            seen = read_beat(path, 3)
            assert seen is not None and (seen.step, seen.phase, seen.pulses) == (10, "eval", 1)
        after = read_beat(path, 3)
        assert after is not None and (after.step, after.phase) == (10, "train")
        with wd.busy("eval"), wd.waiting():  # the all-reduce that ends an evaluation
            assert read_beat(path, 3).phase == "wait"  # type: ignore[union-attr]
        with wd.busy("save"):
            with wd.waiting(within=("save",)):  # rank 0 collects the others' files
                assert read_beat(path, 3).phase == "wait"  # type: ignore[union-attr]
            assert read_beat(path, 3).phase == "save"  # type: ignore[union-attr]
        with wd.waiting(within=("save",)):  # a background save's wait: training goes on
            assert read_beat(path, 3).phase == "train"  # type: ignore[union-attr]
        assert read_beat(path, 3).phase == "train"  # type: ignore[union-attr]
        # in the run directory: who ran where, written once; no heartbeat
        names = sorted(p.name for p in (run / ".progress" / "7-0").iterdir())
        assert names == ["rank-3.json"], names
    finally:
        wd.close()
    assert not (wd.local_dir / "rank-3").exists()


def _nice_of(pid: int) -> tuple[int | None, int | None]:
    """(nice, its autogroup's nice) of process ``pid``; None where /proc does not say."""
    nice = group = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        nice = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    with contextlib.suppress(OSError, ValueError, IndexError):
        group = int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    return nice, group


def test_the_watcher_steps_back_for_the_ranks(tmp_path: Path) -> None:
    # Issue 46: the node's watcher starts beside the ranks' own start (a command's import of
    # torch); it takes the CPU they leave: its nice, and its own session's autogroup
    run = tmp_path / "run"
    # a runner that is itself at a nice above 0 (CI's is) keeps it: a nice only goes up
    want = max(os.getpriority(os.PRIO_PROCESS, 0), STEP_BACK_NICE)
    wd = Watchdog(
        run, rank=0, world_size=1, job_id=None, restart_count=0, timeout_s=60.0, budgets={},
        node="n1", local_rank=0, local_root=tmp_path / "shm", poll_s=5.0,
    )  # fmt: skip
    try:
        assert wd._watcher is not None
        pid = wd._watcher.pid
        deadline = time.monotonic() + 60
        # the watcher steps back as it starts: its nice, then its autogroup (a change the
        # kernel takes once per 100 ms on the machine: it may try a few times)
        while (
            _nice_of(pid) not in ((want, None), (want, STEP_BACK_NICE))
            and time.monotonic() < deadline
            and wd._watcher.poll() is None
        ):
            time.sleep(0.05)
        nice, group = _nice_of(pid)
        assert nice == want, (nice, wd._watcher.poll())
        assert group in (None, STEP_BACK_NICE)  # None: a kernel without autogroups
        assert os.getsid(pid) == pid  # its own session: its autogroup holds only itself
    finally:
        wd.close()


def test_the_watcher_starts_without_the_spec_models() -> None:
    # Issue 46: the watcher starts beside the ranks' own start; the spec models (pydantic, most
    # of its imports) wait for a hang, the one time it asks for the run's budgets
    probe = (
        "import sys, train.hang.watcher; "
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'train.spec'))))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[]"


def _r(rank: int, node: str, step: int, phase: str = "train", idle: float = 100.0,
       state: str | None = "S", timeout: float = 10.0) -> RankView:  # fmt: skip
    return RankView(rank, node, step, phase, idle, allowance(phase, timeout), timeout, state)


# (name, nodes, command, hang, suspect ranks, suspect nodes)
VERDICTS = [
    ("node frozen with its watcher: the healthy node's rank, idle in the collective, is its victim",
     [NodeView("n1", (_r(0, "n1", 50),)), NodeView("n2", (_r(1, "n2", 50, idle=5),), alive=False)],
     False, True, (1,), ("n2",)),
    ("a stopped process (its watcher alive)",
     [NodeView("n1", (_r(0, "n1", 50),)), NodeView("n2", (_r(1, "n2", 50, state="T"),))],
     False, True, (1,), ("n2",)),
    ("a stopped process whose last beat is a moment younger than the timeout, its peer waiting "
     "on it past its allowance (seen on a loaded machine): the stopped one is named",
     [NodeView("n1", (_r(0, "n1", 62, idle=11),)),
      NodeView("n2", (_r(1, "n2", 62, idle=9.96, state="T"),))],
     False, True, (1,), ("n2",)),
    ("a process stopped for less than the timeout while its peers progress: no hang yet",
     [NodeView("n1", (_r(0, "n1", 62, idle=3),)),
      NodeView("n2", (_r(1, "n2", 62, idle=5, state="T"),))],
     False, False, (), ()),
    ("a stopped process, and a healthy node's watcher late to answer (a loaded machine): only "
     "the stopped one is named",
     [NodeView("n1", (_r(0, "n1", 50),), alive=False),
      NodeView("n2", (_r(1, "n2", 50, state="T"),))],
     False, True, (1,), ("n2",)),
    ("a rank behind the step its peers wait at",
     [NodeView("n1", (_r(0, "n1", 50), _r(1, "n1", 50))), NodeView("n2", (_r(2, "n2", 49),))],
     False, True, (2,), ("n2",)),
    ("a rank still in a save after step 50 while its peers wait in step 51",
     [NodeView("n1", (_r(0, "n1", 50),)),
      NodeView("n2", (_r(1, "n2", 50, "save", idle=BUSY_FLOOR_S + 1),))],
     False, True, (1,), ("n2",)),
    ("a rank waiting in the all-reduce that ends an evaluation, its peer's node frozen with "
     "its watcher: the frozen node is named within the timeout, not after the busy allowance",
     [NodeView("n1", (_r(0, "n1", 48, "wait", idle=11),)),
      NodeView("n2", (_r(1, "n2", 47, idle=11),), alive=False)],
     False, True, (1,), ("n2",)),
    ("a rank waiting in a collective for a peer that is still evaluating: no hang",
     [NodeView("n1", (_r(0, "n1", 48, "wait", idle=40),)),
      NodeView("n2", (_r(1, "n2", 48, "eval", idle=40),))],
     False, False, (), ()),
    ("a rank waiting at the end of a save for a peer behind it: the peer is named",
     [NodeView("n1", (_r(0, "n1", 40, "wait", idle=15),)),
      NodeView("n2", (_r(1, "n2", 39, idle=15),))],
     False, True, (1,), ("n2",)),
    ("no evidence: every rank at the same step, nothing stopped, every watcher answered",
     [NodeView("n1", (_r(0, "n1", 50),)), NodeView("n2", (_r(1, "n2", 50),))],
     False, True, (), ()),
    ("a peer busy within its allowance (rank 0 alone evaluates): the waiting ranks are no hang",
     [NodeView("n1", (_r(0, "n1", 50, "eval", idle=100),)), NodeView("n2", (_r(1, "n2", 50),))],
     False, False, (), ()),
    ("every rank in a long evaluation: no hang",
     [NodeView("n1", (_r(0, "n1", 50, "eval", idle=98, timeout=60),)),
      NodeView("n2", (_r(1, "n2", 50, "eval", idle=98, timeout=60),))],
     False, False, (), ()),
    ("a node whose ranks ended on their own is no suspect",
     [NodeView("n1", (_r(0, "n1", 50),)), NodeView("n2", (_r(1, "n2", 50),), alive=False,
                                                    ended=True)],
     False, True, (), ()),
    ("command: no rank wrote for the timeout, nothing stopped: a hang, no node named",
     [NodeView("n1", (_r(0, "n1", 9),)), NodeView("n2", (_r(1, "n2", 7),))],
     True, True, (), ()),
    ("command: one rank still writes: no hang",
     [NodeView("n1", (_r(0, "n1", 9),)), NodeView("n2", (_r(1, "n2", 7, idle=1),))],
     True, False, (), ()),
    ("command: a stopped process",
     [NodeView("n1", (_r(0, "n1", 9),)), NodeView("n2", (_r(1, "n2", 7, state="T"),))],
     True, True, (1,), ("n2",)),
    ("command: a rank that never wrote does not hold the verdict off",
     [NodeView("n1", (_r(0, "n1", 9),)), NodeView("n2", (_r(1, "n2", -1, "start", idle=1),))],
     True, True, (), ()),
    ("command: a node frozen with its watcher",
     [NodeView("n1", (_r(0, "n1", 9),)), NodeView("n2", (_r(1, "n2", 7, idle=1),), alive=False)],
     True, True, (1,), ("n2",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "command", "hang", "ranks", "suspects"),
    [v[1:] for v in VERDICTS],
    ids=[v[0] for v in VERDICTS],
)
def test_verdict(
    nodes: list[NodeView],
    command: bool,
    hang: bool,
    ranks: tuple[int, ...],
    suspects: tuple[str, ...],
) -> None:
    verdict = judge(nodes, command=command)
    assert (verdict.hang, verdict.ranks, verdict.nodes) == (hang, ranks, suspects), verdict
    assert set(verdict.evidence) == set(suspects)
    assert verdict.hang or not verdict.nodes  # no hang names no one


# ------------------------------------------------------------------------ end to end

RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from train.hang.heartbeat import Watchdog

    run, rank, node, eval_s = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    evaluates = rank in [int(r) for r in sys.argv[6].split(",")]
    wd = Watchdog(run, rank=rank, world_size=2, job_id=None, restart_count=0, timeout_s=1.5,
                  budgets={"max_hangs": 2}, poll_s=0.2, node=node, local_rank=0,
                  local_root=run / "shm", summary_s=float(sys.argv[5]))

    coll = run / "collective"
    coll.mkdir(parents=True, exist_ok=True)

    def all_reduce(step):  # stands in for DDP's: wait until the peer reached this step
        (coll / f"rank-{rank}").write_text(str(step))
        peer = coll / f"rank-{1 - rank}"
        while True:
            try:  # one read: the peer truncates and rewrites its file every step
                seen = int(peer.read_text())
            except (FileNotFoundError, ValueError):  # not written yet, or read mid-rewrite
                seen = -1
            if seen >= step:
                return
            time.sleep(0.005)

    def spin_in_training_step(step):
        time.sleep(0.05)
        all_reduce(step)

    step = 0
    while step < 100000:
        spin_in_training_step(step)
        step += 1
        wd.beat(step)
        if step == 20 and eval_s and evaluates:
            with wd.busy("eval"):
                time.sleep(eval_s)   # longer than the timeout: an evaluation, not a hang
            print("evaluated", flush=True)
            wd.close()
            break
    """
)


def _wait(pred: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == str(pid):
                out.append(int(entry.name))
    return out


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Callable[[float], list[subprocess.Popen[bytes]]]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    started: list[subprocess.Popen[bytes]] = []
    frozen: list[int] = []

    def start(
        eval_s: float = 0.0, summary_s: float = 1.0, evaluating: str = "0,1"
    ) -> list[subprocess.Popen[bytes]]:
        for r, node in ((0, "a"), (1, "b")):
            argv = [sys.executable, str(script), str(tmp_path / "run"), str(r), node, str(eval_s),
                    str(summary_s), evaluating]  # fmt: skip
            started.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE))
        return started

    start.frozen = frozen  # type: ignore[attr-defined]
    yield start
    for pid in frozen:  # never leave a stopped process behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _hang(run: Path) -> dict[str, object]:
    events = [e for e in RunHistory(run).events() if e["event"] == "hang"]
    assert len(events) == 1, events
    return events[0]


def _stepping(run: Path) -> bool:
    nodes = run / ".progress" / "local-0" / "nodes"
    seen = []
    for path in nodes.glob("*.json") if nodes.is_dir() else ():
        # a summary is rewritten in place (one write): met mid-write, or just created, it is
        # torn or empty, and read again at the next poll (as the watchers themselves do)
        with contextlib.suppress(OSError, ValueError):
            seen.append(json.loads(path.read_text()))
    steps = [r["step"] for s in seen for r in s["ranks"]]
    return len(steps) == 2 and min(steps) >= 5


def test_a_frozen_rank_is_detected_dumped_recorded_and_ended(tmp_path: Path, ranks: Any) -> None:
    procs = ranks()
    run = tmp_path / "run"
    assert _wait(lambda: _stepping(run), 30), "ranks never beat"
    os.kill(procs[1].pid, signal.SIGSTOP)
    ranks.frozen.append(procs[1].pid)
    assert _wait(lambda: all(p.poll() is not None for p in procs), 40)
    assert [p.returncode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    hangs = run / "hangs" / "local-0"
    hang = _hang(run)
    assert hang["ranks"] == [1] and hang["nodes"] == ["b"]
    # the stopped rank cannot dump its stacks; a live rank's arrive unless its node's watcher
    # is late (a loaded machine, seen in CI with the unit tests in parallel)
    assert 1 in hang["no_stacks"]
    assert "stopped" in hang["evidence"]["b"]  # type: ignore[index]
    assert hang["timeout_s"] == 1.5 and hang["stacks_dir"] == str(hangs)
    observed = {o["rank"]: o for o in hang["observed"]}  # type: ignore[attr-defined]
    assert observed[1]["stopped"] and observed[1]["state"] == "T"
    assert not observed[0]["stopped"]
    stacks = (hangs / "rank-0.stacks").read_text()
    assert "spin_in_training_step" in stacks, stacks  # the frame the rank was in
    assert not (hangs / "rank-1.stacks").exists()  # a stopped process cannot dump
    assert json.loads((hangs / "decided").read_text())["ranks"] == [1]


def test_a_stopped_rank_is_judged_without_waiting_for_the_other_nodes_summaries(
    tmp_path: Path, ranks: Any
) -> None:
    """Rank 0 evaluates (busy, within its allowance: its watcher sees nothing wrong) while
    rank 1, waiting for it, is stopped. Rank 1's own watcher sees the process stopped: a hang
    whatever the other node says, so it decides on that node's last summary instead of waiting
    a summary period (here 120 s) for it to publish again."""
    procs = ranks(eval_s=100.0, summary_s=120.0, evaluating="0")
    run = tmp_path / "run"
    assert _wait(lambda: _in_eval(run), 30), "rank 0 never evaluated"
    os.kill(procs[1].pid, signal.SIGSTOP)
    ranks.frozen.append(procs[1].pid)
    assert _wait(lambda: any(e["event"] == "hang" for e in RunHistory(run).events()), 30)
    hang = _hang(run)
    assert hang["ranks"] == [1] and hang["nodes"] == ["b"], hang
    assert "stopped" in hang["evidence"]["b"]  # type: ignore[index]


def _in_eval(run: Path) -> bool:
    from train.hang.heartbeat import read_beats

    shm = run / "shm"
    return any(b.phase == "eval" for d in shm.glob("*/*/*") for b in read_beats(d, 2).values())


def test_a_frozen_node_is_blamed_not_the_healthy_one(tmp_path: Path, ranks: Any) -> None:
    procs = ranks()
    run = tmp_path / "run"
    assert _wait(lambda: _stepping(run), 30), "ranks never beat"
    watcher = _children(procs[1].pid)
    assert len(watcher) == 1, watcher
    for pid in (*watcher, procs[1].pid):  # the whole node: its rank and its watcher
        os.kill(pid, signal.SIGSTOP)
        ranks.frozen.append(pid)
    assert _wait(lambda: procs[0].poll() is not None, 40)
    hang = _hang(run)
    assert hang["nodes"] == ["b"] and hang["ranks"] == [1], hang
    assert "watcher is silent" in hang["evidence"]["b"]  # type: ignore[index]
    assert 0 not in hang["ranks"]  # type: ignore[operator]
    assert "spin_in_training_step" in (run / "hangs" / "local-0" / "rank-0.stacks").read_text()


def test_a_declared_evaluation_longer_than_the_timeout_is_no_hang(
    tmp_path: Path, ranks: Any
) -> None:
    procs = ranks(4.0)  # 4 s of evaluation, timeout 1.5 s
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0 and b"evaluated" in out
    assert not (tmp_path / "run" / "hangs").exists()
    assert not [e for e in RunHistory(tmp_path / "run").events() if e["event"] == "hang"]


# Two supervisors of a command (one per simulated node). Rank 1 falls silent first; rank 0 goes
# on writing for a while (its log, a save), then blocks too: the job hangs only then (a command
# hangs when every rank is quiet), and node b's watcher has already judged "not a hang" once.
COMMAND_RANK = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    from train.hang.heartbeat import Watchdog

    run, rank, node = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    quiet_after = float(sys.argv[4])
    command = subprocess.Popen(["sleep", "3600"], start_new_session=True)  # the user's command
    (run / f"command-{rank}").parent.mkdir(parents=True, exist_ok=True)
    (run / f"command-{rank}").write_text(str(command.pid))
    wd = Watchdog(run, rank=rank, world_size=2, job_id=None, restart_count=0, timeout_s=1.5,
                  budgets={"max_hangs": 2}, poll_s=0.2, node=node, local_rank=0,
                  local_root=run / "shm", summary_s=float(sys.argv[5]), command_pid=command.pid)
    go = run / "go"
    beats = 0
    while not go.exists():  # both write until the test says go
        beats += 1
        wd.beat(beats)
        time.sleep(0.1)
    start = time.time()
    while time.time() - start < quiet_after:
        beats += 1
        wd.beat(beats)
        time.sleep(0.1)
    quiet = run / f"quiet-{rank}"
    quiet.with_suffix(".tmp").write_text(str(time.time()))
    os.replace(quiet.with_suffix(".tmp"), quiet)  # whole or absent: the test reads it at once
    time.sleep(3600)
    """
)


def test_a_command_hang_is_found_soon_after_its_last_rank_falls_silent(tmp_path: Path) -> None:
    """Node b's rank falls silent 6 s before node a's: b's watcher judges "not a hang" (a's rank
    still writes) and its next periodic summary is far away (here 60 s; a's is 2 s). Once a's
    rank is silent too, a's watcher needs b's word about its ranks: b gives it every quarter of
    the timeout while its ranks are silent, so the hang is found within seconds and b is not
    taken for a frozen node (a watcher that does not answer in time is silent)."""
    script = tmp_path / "rank.py"
    script.write_text(COMMAND_RANK)
    run = tmp_path / "run"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    procs = []
    for rank, node, quiet, summary in ((0, "a", "6", "2"), (1, "b", "0", "60")):
        argv = [sys.executable, str(script), str(run), str(rank), node, quiet, summary]
        procs.append(subprocess.Popen(argv, env=env))
    try:
        nodes = run / ".progress" / "local-0" / "nodes"
        assert _wait(lambda: len(list(nodes.glob("*.json"))) == 2, 30), "no summaries"
        (run / "go").write_text("")
        assert _wait(lambda: (run / "quiet-0").exists(), 30)
        last_write = float((run / "quiet-0").read_text())
        assert _wait(lambda: any(e["event"] == "hang" for e in RunHistory(run).events()), 40)
        hang = _hang(run)
        # the last rank's silence (1.5 s), b's next word (<= 1 s) and polls: not 60 s
        assert hang["time"] - last_write < 15, hang  # type: ignore[operator]
        # nothing is stopped and no watcher is silent: the evidence names no one
        assert hang["ranks"] == [] and hang["nodes"] == [], hang
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for rank in (0, 1):  # the watchers killed the commands; else they are ours to end
            with contextlib.suppress(OSError, ValueError):
                pid = int((run / f"command-{rank}").read_text())
                if "sleep" in Path(f"/proc/{pid}/cmdline").read_text():
                    os.killpg(pid, signal.SIGKILL)


# A rank of a submitted job (SLURM_JOB_ID) under a batch script that restarts steps in place
# (SLURM_TRAIN_IN_PLACE), started the way the session starts it; it stops beating at step 20 and
# sleeps: every rank at its step, none behind, so the hang names no node.
SILENT_RANK = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from train.env import DistEnv
    from train.hang.heartbeat import start_watchdog
    from train.spec.config import RequeueConfig

    requeue = RequeueConfig(hang_timeout_s=1.5, max_restarts_in_place=1)
    wd = start_watchdog(requeue, DistEnv.from_env(os.environ), Path(sys.argv[1]))
    for step in range(1, 21):
        time.sleep(0.05)
        wd.beat(step)
    time.sleep(3600)
    """
)


def test_a_hang_that_names_no_node_restarts_in_place_while_the_budget_allows(
    tmp_path: Path,
) -> None:
    """Issue 44.5: the watcher decides with the run's whole requeue: section and an environment
    with the in-place facts (a Decider), so a hang with no suspect node restarts in place (no
    trip through the queue) like a failure does; before, it was always requeued."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "squeue", "sacct", "sinfo"):  # never ask a real cluster
        stub = bin_dir / name
        stub.write_text("#!/bin/sh\necho 'no Slurm here' >&2\nexit 1\n")
        stub.chmod(0o755)
    script = tmp_path / "rank.py"
    script.write_text(SILENT_RANK)
    run = tmp_path / "run"
    env = {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_ID": "4242",
        "SLURM_TRAIN_IN_PLACE": "0",
    }
    rank = subprocess.Popen([sys.executable, str(script), str(run)], env=env)
    try:
        assert _wait(lambda: rank.poll() is not None, 60), "the hang was never handled"
    finally:
        if rank.poll() is None:
            rank.kill()
        rank.wait()
    assert rank.returncode == -signal.SIGKILL  # the watcher ended the step
    hang = _hang(run)
    assert hang["nodes"] == [] and hang["job_id"] == "4242"
    assert hang["action"] == "restart_in_place"
    assert [e["event"] for e in RunHistory(run).events()] == ["hang"]  # no requeue
