"""The hang watcher process of :mod:`train.hang.heartbeat` (``python -m train.hang.watcher``, no
torch).

Started by each rank in its own session, so freezing the rank does not freeze it. It polls the
heartbeats of every rank and, on a hang, asks its rank for its stacks, records what it saw, and
(the first watcher to claim the attempt) records the ``hang`` event and requeues
within ``requeue.max_hangs``; then it ends its rank. See :mod:`train.hang.heartbeat` for the whole
protocol.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.hang.heartbeat import (
    COMMAND_FLOOR_S,
    DUMP_SIGNAL,
    Beat,
    auto_timeout,
    proc_state,
    read_beats,
    stuck_ranks,
)
from train.runfiles import open_fd, write_text

__all__ = ["main"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Args:
    run_dir: Path
    attempt: str
    rank: int
    world_size: int
    pid: int
    timeout: float | None
    poll: float | None
    budgets: dict[str, int]
    job_id: str | None
    restart_count: int
    command_pid: int | None = None  # the rank supervises this entrypoint.command


def _watch(a: _Args) -> int:
    """Poll the heartbeats until the rank ends (0) or a hang is handled (1)."""
    progress = a.run_dir / ".progress" / a.attempt
    first: dict[int, Beat] = {}
    last_change: dict[int, float] = {}
    last_seen: dict[int, Beat] = {}
    longest_gap = 0.0
    while True:
        if os.getppid() != a.pid or proc_state(a.pid) in (None, "Z"):
            return 0  # the rank (this process's parent) is gone
        now = time.time()
        beats = read_beats(progress, a.world_size)
        for r, b in beats.items():
            first.setdefault(r, b)
            prev = last_seen.get(r)
            if prev is None or b.step != prev.step:
                if prev is not None:
                    longest_gap = max(longest_gap, b.time - prev.time)
                # when THIS watcher saw the step change: its own clock, so a skew between the
                # nodes' clocks cannot fake or hide a hang
                last_change[r] = now
            last_seen[r] = b
        if a.command_pid is not None and beats:
            # a command: armed once any rank's command wrote something; a hang is NO rank's
            # command writing anything for the timeout (often only rank 0 prints)
            timeout = a.timeout or auto_timeout(None, longest_gap, COMMAND_FLOOR_S)
            if now - max(last_change.values()) > timeout:
                _handle_hang(a, beats, timeout, now)
                return 1
            poll = a.poll or min(5.0, max(0.2, timeout / 10))
        elif len(beats) == a.world_size:  # armed once every rank made a first step
            steps = sum(b.step - first[r].step for r, b in beats.items())
            span = sum(b.time - first[r].time for r, b in beats.items())
            mean = span / steps if steps > 0 else None
            timeout = a.timeout or auto_timeout(mean, longest_gap)
            observed = {r: Beat(r, b.step, last_change[r]) for r, b in beats.items()}
            stuck = stuck_ranks(observed, now, timeout)
            if stuck:
                _handle_hang(a, beats, timeout, now)
                return 1
            poll = a.poll or min(5.0, max(0.2, timeout / 10))
        else:
            poll = a.poll or 1.0
        time.sleep(poll)


def _handle_hang(a: _Args, beats: dict[int, Beat], timeout: float, now: float) -> None:
    # `scontrol requeue` makes Slurm SIGTERM every process of the step, this one included, at
    # once (SIGKILL only after KillWait): finish the record and the quarantine first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hangs = a.run_dir / "hangs" / a.attempt
    hangs.mkdir(parents=True, exist_ok=True)
    meta = _read_json(a.run_dir / ".progress" / a.attempt / f"rank-{a.rank}.json")
    command = a.command_pid if a.command_pid is not None and _ours(a.command_pid, a.pid) else None
    state = proc_state(command if command is not None else a.pid)
    written = a.run_dir / ".progress" / a.attempt / f"rank-{a.rank}.stacks"
    stacks = hangs / f"rank-{a.rank}.stacks"
    dumped = False
    if command is not None:
        # not our Python: what the kernel says of each of the command's processes
        dumped = _describe_processes(command, stacks)
        with contextlib.suppress(OSError):
            os.killpg(command, signal.SIGSTOP)  # its own session: pgid == its pid
    elif state != "T":
        with contextlib.suppress(OSError):
            os.kill(a.pid, DUMP_SIGNAL)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not dumped:
            time.sleep(0.1)
            dumped = written.exists() and written.stat().st_size > 0
        if dumped:
            time.sleep(0.3)  # faulthandler writes from its signal handler: let it finish
        # Freeze it until it is ended: a live rank must not react to its peers' end (a
        # 'connection closed' failure) before the hang is recorded.
        with contextlib.suppress(OSError):
            os.kill(a.pid, signal.SIGSTOP)
        if dumped:
            try:
                shutil.copyfile(written, stacks)
            except OSError as exc:
                log.warning("could not copy %s to %s: %s", written, stacks, exc)
                dumped = False
    mine = beats.get(a.rank)
    seen = {
        "rank": a.rank,
        "node": meta.get("node"),
        "pid": a.pid,
        "state": state,
        "stopped": state == "T",
        "step": mine.step if mine else None,
        "idle_s": round(now - mine.time, 1) if mine else None,
        "stacks": str(stacks) if dumped else None,
    }
    tmp = hangs / f".rank-{a.rank}.json.tmp"
    write_text(tmp, json.dumps(seen))
    tmp.replace(hangs / f"rank-{a.rank}.json")
    try:
        fd = open_fd(hangs / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
        claimed = True
    except FileExistsError:
        claimed = False
    if claimed:
        _record_and_requeue(a, hangs, timeout)
    else:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (hangs / "decided").exists():
            time.sleep(0.2)
    # End the step: the job is requeued (or its budget is spent); nothing of this attempt may
    # go on. A stopped rank dies of SIGKILL too; so does the command it supervises.
    if command is not None and _ours(command, a.pid):
        with contextlib.suppress(OSError):
            os.killpg(command, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(a.pid, signal.SIGKILL)


def _ours(pid: int, parent: int) -> bool:
    """Whether ``pid`` is (still) a child of ``parent``: proof before a signal to its group."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return len(fields) > 1 and fields[1] == str(parent)


def _describe_processes(root: int, out: Path) -> bool:
    """Write state, wait channel, command line and (root only) kernel stack of ``root`` and its
    descendants to ``out``; True when something was written."""
    from train.command.processes import process_tree  # torch-free

    lines: list[str] = []
    for pid in sorted(process_tree(root)):
        proc = Path(f"/proc/{pid}")
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        wchan = _read(proc / "wchan") or "-"
        lines.append(f"pid {pid} state {proc_state(pid)} wchan {wchan}: {cmdline.strip()}")
        stack = _read(proc / "stack")
        lines.extend(f"    {frame}" for frame in stack.splitlines() if frame.strip())
    if not lines:
        return False
    write_text(out, "\n".join(lines) + "\n")
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _record_and_requeue(a: _Args, hangs: Path, timeout: float) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if all((hangs / f"rank-{r}.json").exists() for r in range(a.world_size)):
            break
        time.sleep(0.1)
    seen = [_read_json(hangs / f"rank-{r}.json") for r in range(a.world_size)]
    known = [s for s in seen if isinstance(s.get("rank"), int)]
    stopped = [s for s in known if s.get("stopped")]
    if a.command_pid is not None and not stopped:
        pass  # a command's output says nothing of which rank stopped first: no node named
    elif not stopped and known:
        low = min(s["step"] for s in known if isinstance(s.get("step"), int))
        stopped = [s for s in known if s.get("step") == low]
    ranks = sorted(s["rank"] for s in stopped)
    nodes = sorted({str(s.get("node")) for s in stopped})
    step = min((s["step"] for s in known if isinstance(s.get("step"), int)), default=None)
    if a.command_pid is not None:
        step = None  # a command's beats count its writes, not training steps
    details = {
        "ranks": ranks,
        "nodes": nodes,
        "timeout_s": round(timeout, 1),
        "stacks_dir": str(hangs),
        "no_stacks": sorted(s["rank"] for s in known if not s.get("stacks")),
        "observed": known,
    }
    log.error(
        "hang: rank(s) %s on %s made no progress for %.0f s (stacks in %s)",
        ranks, nodes, timeout, hangs,
    )  # fmt: skip
    from train.stop.act import request_requeue  # torch-free

    # the one stop decision: the hang event, its budget, the requeue and the suspects' nodes
    code = request_requeue(
        _MainEnv(a.job_id, a.restart_count, a.world_size),
        a.run_dir,
        _Budget(a.budgets),
        "hang",
        step=step,
        details=details,
        suspects=tuple(nodes),
        hang_claimed=False,
    )
    write_text(hangs / "decided", json.dumps({"exit_code": code, **details}))


@dataclass(frozen=True)
class _MainEnv:
    """The watcher acts as rank 0 for the requeue (one claimant per attempt)."""

    job_id: str | None
    restart_count: int
    world_size: int
    is_main: bool = True


_DEFAULT_BUDGETS = {
    "max_preemptions": 20, "max_timeouts": 10, "max_failures": 3, "max_hangs": 2,
    "signal_delay_s": 90,
}  # fmt: skip


class _Budget:
    """The run's ``requeue:`` budgets, as :func:`train.stop.act.request_requeue` reads them."""

    def __init__(self, budgets: dict[str, int]) -> None:
        values = {**_DEFAULT_BUDGETS, **budgets}
        self.max_preemptions = values["max_preemptions"]
        self.max_timeouts = values["max_timeouts"]
        self.max_failures = values["max_failures"]
        self.max_hangs = values["max_hangs"]
        self.signal_delay_s = values["signal_delay_s"]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.hang.watcher", description=__doc__)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--attempt", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--timeout", type=float)
    p.add_argument("--poll", type=float)
    p.add_argument("--budgets", type=json.loads, default={})
    p.add_argument("--job-id", default="")
    p.add_argument("--restart-count", type=int, default=0)
    p.add_argument("--command-pid", type=int)
    ns = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [watchdog {ns.rank}] %(message)s", datefmt="%X"
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args = _Args(
        ns.run_dir, ns.attempt, ns.rank, ns.world_size, ns.pid, ns.timeout, ns.poll,
        ns.budgets, ns.job_id or None, ns.restart_count, ns.command_pid,
    )  # fmt: skip
    return _watch(args)


if __name__ == "__main__":
    sys.exit(main())
