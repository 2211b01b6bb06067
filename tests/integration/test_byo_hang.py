"""A hung bring-your-own command on the real local cluster (issue 15): the torchrun-style DDP
script (examples/byo/plain_ddp.py, 2 nodes) has rank 1's process frozen from outside with
``kill -STOP``. Rank 0 then blocks in its all-reduce and nothing writes any more: the job must
see the hang (a command's progress is what its processes write), describe the processes, name
rank 1 and its node (its process is stopped), requeue within ``max_hangs``, keep off that node,
resume from the script's own last save and end COMPLETED."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from byo_helpers import REPO, ByoRun, open_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A command's hang clock starts at its first write (a rendezvous socket), and a DDP script is
# then silent while torch's DDP imports the compiler: ~2 s alone, but 10 s was seen with five
# test clusters and the unit half on these 2 cores (a false hang before any freeze). Users'
# default is max(1800 s, 3 x the longest silence).
TIMEOUT_S = 20
# long enough that the supervisors are set up well before the end on loaded cores (their set-up
# waits behind the command's start, up to train.command.prestart.WAIT_CAP_S)
STEPS = 300


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


def _command_of(supervisor: int, script: str) -> int | None:
    """The supervisor's child running ``script`` (the command), or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == str(supervisor) and script in cmdline:
            return int(entry.name)
    return None


@pytest.mark.long(74)
def test_frozen_command_rank_is_a_hang_requeued_off_its_node_and_completes(
    run: ByoRun,
) -> None:
    argv = ["python", str(REPO / "examples" / "byo" / "plain_ddp.py"), "--steps", str(STEPS),
            "--step-time", "0.1", "--save-every", "10"]  # fmt: skip
    run.submit(
        {
            "name": "byo-hang-it",
            "resources": {"partition": "debug", "nodes": 2, "cpus_per_task": 1, "time": "00:10:00"},
            "environment": {"variables": {"OMP_NUM_THREADS": 1}},
            "requeue": {"hang_timeout_s": TIMEOUT_S, "max_hangs": 1},
            "entrypoint": {"command": argv},
        }
    )
    frozen = 0
    try:
        run.wait("step 25", lambda: run.steps_done() >= 25, 300)
        attempt = run.attempt_dir((1,))  # the first, unless the job restarted (then shown below)
        meta = json.loads((attempt / "rank-1.json").read_text())
        command = _command_of(int(meta["pid"]), "plain_ddp.py")
        assert command is not None, meta
        os.kill(command, signal.SIGSTOP)
        frozen, frozen_at = command, time.time()
        run.wait("the hang", lambda: any(e["event"] == "hang" for e in run.events()), 120)
        run.release_when_requeued()
        final = run.wait_final()
    finally:
        if frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
    assert final == "COMPLETED", run.log()
    events = run.events()
    (hang,) = [e for e in events if e["event"] == "hang"]
    assert hang["ranks"] == [1] and hang["nodes"] == [meta["node"]], hang
    assert TIMEOUT_S <= hang["time"] - frozen_at < TIMEOUT_S + 15, hang
    report = (Path(hang["stacks_dir"]) / "rank-1.stacks").read_text()
    assert f"pid {command} state T" in report and "plain_ddp.py" in report, report
    (quarantine,) = [e for e in events if e["event"] == "quarantine"]
    assert quarantine["nodes"] == [meta["node"]], quarantine
    second = run.run_dir / ".progress" / f"{run.job_id}-1"
    nodes = {json.loads((second / f"rank-{r}.json").read_text())["node"] for r in (0, 1)}
    assert meta["node"] not in nodes, nodes
    names = [e["event"] for e in events]
    # the hang and nothing else: Slurm's TERM after the watcher's requeue is no preemption
    assert names == ["start", "hang", "requeue", "quarantine", "start", "complete"], names
    assert quarantine["reason"] == "hang", quarantine
    starts = [p for p in run.progress() if p.get("event") == "start"]
    assert [s["restart"] for s in starts] == [0, 1] and starts[1]["step"] >= 20  # its own save
    assert run.steps_done() == STEPS


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                    out.append(int(entry.name))
    return out


def test_a_stuck_worker_under_torchrun_is_a_hang(run: ByoRun) -> None:
    """Issue 25: torchrun's agent writes rendezvous keep-alive every 5 s whether its workers
    train or not; a worker frozen under it (the other then blocks in its all-reduce) must be
    seen within the timeout, as fast as without torchrun, and its node named."""
    argv = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            str(REPO / "examples" / "byo" / "plain_ddp.py"), "--steps", "2000",
            "--step-time", "0.1", "--save-every", "10"]  # fmt: skip
    run.submit(
        {
            "name": "byo-torchrun-hang",
            "resources": {"partition": "debug", "nodes": 1, "cpus_per_task": 2, "time": "00:10:00"},
            "environment": {"variables": {"OMP_NUM_THREADS": 1}},
            "requeue": {"hang_timeout_s": TIMEOUT_S, "max_hangs": 1},
            "entrypoint": {"command": argv},
        }
    )
    frozen = 0
    try:
        run.wait("step 25", lambda: run.steps_done() >= 25, 300)
        found: dict[str, Any] = {}

        def two_workers() -> bool:  # the agent's children, in the attempt running now
            found["meta"] = json.loads((run.attempt_dir((0,)) / "rank-0.json").read_text())
            found["workers"] = _children(int(found["meta"]["command_pid"]))
            return len(found["workers"]) == 2

        run.wait("torchrun's two workers", two_workers, 60)  # says the events when not
        meta, workers = found["meta"], found["workers"]
        os.kill(workers[-1], signal.SIGSTOP)
        frozen, frozen_at = workers[-1], time.time()
        run.wait("the hang", lambda: any(e["event"] == "hang" for e in run.events()), 120)
    finally:
        if frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
        run.cleanup()
    (hang,) = [e for e in run.events() if e["event"] == "hang"]
    # as fast as the same worker run directly (test above): the timeout, a poll, the records
    assert TIMEOUT_S <= hang["time"] - frozen_at < TIMEOUT_S + 15, hang
    assert hang["nodes"] == [meta["node"]], hang  # a process of the command is stopped
    report = (Path(hang["stacks_dir"]) / "rank-0.stacks").read_text()
    assert f"pid {frozen} state T" in report and "torch.distributed.run" in report, report
