"""The node's hang watcher (``python -m train.hang.watcher``, no torch): see
:mod:`train.hang.heartbeat` for the protocol and :mod:`train.hang.evidence` for the verdict.

Started by the node's first local rank in its own session, so freezing that rank does not
freeze it. It reads its node's heartbeats (node-local) every poll, publishes one summary of its
node every ``SUMMARY_S`` into ``RUN_DIR/.progress/ATTEMPT/nodes/``, and when a local rank is
silent past its allowance reads the other nodes' summaries, judges, and on a hang records,
requeues (the first to claim the attempt) and ends its node's ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.env import exported_release, job_hosts
from train.hang.evidence import NodeView, RankView, Verdict, judge, node_view
from train.hang.heartbeat import (
    COMMAND_FLOOR_S,
    DUMP_SIGNAL,
    SUMMARY_S,
    Beat,
    allowance,
    auto_timeout,
    read_beat,
)
from train.procfs import describe_tree, is_child, proc_state, process_tree, step_forward
from train.runfiles import (
    HANGS,
    PROGRESS,
    atomic_write,
    make_dirs,
    open_fd,
    remove_own_tree,
    write_text,
)
from train.stop import Decider, claim_hang, hang_dir, is_claimed, request_requeue

__all__ = ["main"]

log = logging.getLogger(__name__)

_RANK_FILE = re.compile(r"rank-(\d+)")
#: ``observed`` in the hang event lists every rank up to this many, else the suspects only.
_OBSERVED_MAX = 64


@dataclass(frozen=True)
class _Args:
    run_dir: Path
    attempt: str
    node: str
    local_dir: Path
    world_size: int
    local_world_size: int
    pid: int  # the rank that started this watcher (its parent)
    timeout: float | None
    poll: float | None
    summary: float
    budgets: dict[str, Any]  # the run's requeue: section (RequeueConfig as JSON)
    job_id: str | None
    restart_count: int
    command: bool = False  # the ranks supervise an entrypoint.command
    in_place: int = 0  # restarts in place within the same allocation (DistEnv.in_place)
    in_place_supervised: bool = False  # a batch script restarts steps in place (DistEnv's)

    @property
    def shared(self) -> Path:
        return self.run_dir / PROGRESS / self.attempt

    @property
    def hangs(self) -> Path:
        return hang_dir(self.run_dir, self.attempt)


@dataclass
class _Track:
    """One local rank as this watcher saw it (its own monotonic clock for silences)."""

    rank: int
    pid: int | None = None
    command_pid: int | None = None
    beat: Beat | None = None
    changed: float = field(default_factory=time.monotonic)
    busy_since_step: bool = False

    def idle(self, now: float) -> float:
        return now - self.changed


class _Node:
    """The node's ranks, the timeout they imply, and its published summary."""

    def __init__(self, a: _Args) -> None:
        self.a = a
        self.tracks: dict[int, _Track] = {}
        self.steps = 0
        self.span = 0.0
        self.longest_gap = 0.0
        self.seq = 0
        self.size = 0  # bytes of the longest summary written

    # -- the node's heartbeats (node-local) -----------------------------------------------------
    def poll(self, now: float) -> None:
        if len(self.tracks) < self.a.local_world_size:
            self._discover()
        for t in self.tracks.values():
            beat = read_beat(self.a.local_dir / f"rank-{t.rank}", t.rank)
            if beat is None:
                continue
            prev = t.beat
            key = (beat.step, beat.phase, beat.pulses)
            if prev is not None and key == (prev.step, prev.phase, prev.pulses):
                continue
            t.changed = now
            if beat.phase != "train" and not self.a.command:
                t.busy_since_step = True
            if prev is not None and beat.step > prev.step and prev.step >= 0:
                gap = beat.time - prev.time
                # a pause that a busy phase explains is not a step's time (an evaluation, a save)
                if not t.busy_since_step and prev.phase == "train" and gap >= 0:
                    self.steps += beat.step - prev.step
                    self.span += gap
                    self.longest_gap = max(self.longest_gap, gap)
                t.busy_since_step = beat.phase != "train" and not self.a.command
            t.beat = beat

    def _discover(self) -> None:
        try:
            names = os.listdir(self.a.local_dir)
        except OSError:
            return
        for name in names:
            m = _RANK_FILE.fullmatch(name)
            if m is None or int(m.group(1)) in self.tracks:
                continue
            meta = _read_json(self.a.local_dir / f"{name}.json")
            pid = meta.get("pid")
            cpid = meta.get("command_pid")
            self.tracks[int(m.group(1))] = _Track(
                int(m.group(1)),
                pid if isinstance(pid, int) else None,
                cpid if isinstance(cpid, int) else None,
            )

    def timeout(self) -> float:
        if self.a.timeout:
            return self.a.timeout
        if self.a.command:
            return auto_timeout(None, self.longest_gap, COMMAND_FLOOR_S)
        return auto_timeout(self.span / self.steps if self.steps else None, self.longest_gap)

    def suspicious(self, now: float) -> bool:
        """A local rank is silent past its allowance (a command: every local rank that wrote)."""
        timeout = self.timeout()
        seen = [t for t in self.tracks.values() if t.beat is not None]
        if self.a.command:
            written = [t for t in seen if t.beat is not None and t.beat.phase != "start"]
            return bool(written) and all(t.idle(now) > timeout for t in written)
        return any(
            t.idle(now) > allowance(t.beat.phase, timeout) for t in seen if t.beat is not None
        )

    # -- the summary (shared) ----------------------------------------------------------------
    def view(self, now: float, *, full: bool = False) -> NodeView:
        timeout = self.timeout()
        ranks = []
        for t in sorted(self.tracks.values(), key=lambda t: t.rank):
            if t.beat is None:
                continue
            state = None
            if self.a.command and t.command_pid is not None:
                state = _command_state(t.command_pid, full)
            elif t.pid is not None:
                state = proc_state(t.pid)
            phase = t.beat.phase
            ranks.append(
                RankView(
                    rank=t.rank, node=self.a.node, step=t.beat.step, phase=phase,
                    idle_s=t.idle(now), allowed_s=allowance(phase, timeout, command=self.a.command),
                    timeout_s=timeout, state=state, pid=t.pid,
                )
            )  # fmt: skip
        return NodeView(self.a.node, tuple(ranks))

    def publish(self, now: float, *, ended: bool = False, full: bool = False) -> NodeView:
        """Write this node's summary (one small file, replaced whole)."""
        view = self.view(now, full=full)
        self.seq += 1
        data = {
            "node": self.a.node, "seq": self.seq, "ended": ended, "command": self.a.command,
            "ranks": [{**r.to_json(), "timeout_s": round(r.timeout_s, 1), "pid": r.pid}
                      for r in view.ranks],
        }  # fmt: skip
        # one write system call: rewritten in place, padded to the longest summary so far (a
        # reader that meets a torn one keeps the last it could read)
        raw = json.dumps(data).encode()
        self.size = max(self.size, len(raw))
        path = self.a.shared / "nodes" / f"{_safe(self.a.node)}.json"
        try:
            try:
                fd = open_fd(path, os.O_WRONLY | (os.O_CREAT if self.seq == 1 else 0))
            except FileNotFoundError:
                fd = open_fd(path, os.O_WRONLY | os.O_CREAT)
            try:
                os.pwrite(fd, raw.ljust(self.size), 0)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("could not publish the node's summary: %s", exc)
        return view


def _safe(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", node) or "node"


def _command_state(pid: int, full: bool) -> str | None:
    """The command's state: ``T`` when any of its processes is stopped (``full``: the whole
    tree, a /proc scan; else only its first process)."""
    state = proc_state(pid)
    if full and any(proc_state(p) == "T" for p in process_tree(pid)):
        return "T"
    return state


_Summaries = dict[str, tuple[int, dict[str, Any]]]


def _read_summaries(a: _Args, before: _Summaries | None = None) -> _Summaries:
    """Every node's summary by file name; one that cannot be read (torn while rewritten,
    damaged) keeps what ``before`` had of it."""
    folder = a.shared / "nodes"
    out: _Summaries = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return dict(before or {})
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        data = _read_json(folder / name)
        node, seq = data.get("node"), data.get("seq")
        if isinstance(node, str) and isinstance(seq, int):
            out[name] = (seq, data)
        elif before and name in before:
            out[name] = before[name]
    return out


def _stopped_here(a: _Args, node: _Node) -> bool:
    """A local rank of the built-in trainer or a function is stopped past the timeout (local
    /proc reads only)."""
    if a.command:
        return False
    view = node.view(time.monotonic())
    return any(r.state == "T" and r.idle_s > r.timeout_s for r in view.ranks)


def _confirm(a: _Args, node: _Node) -> list[NodeView] | None:
    """Publish now, then wait (at most one summary period and a bit) until every other node's
    watcher published again: the views to judge, a node that did not marked silent. None: a
    hang was claimed meanwhile (another watcher decides; this one only records its node)."""
    node.publish(time.monotonic(), full=True)
    before = _read_summaries(a)
    mine = f"{_safe(a.node)}.json"
    advanced = {mine}
    deadline = time.monotonic() + a.summary + 3.0
    current = before
    while True:
        for name, (seq, data) in current.items():
            if name not in before or seq != before[name][0] or data.get("ended"):
                advanced.add(name)
        if _stopped_here(a, node):
            # a local rank stopped (state T) past the timeout is a hang and its own suspect
            # whatever the other nodes say (evidence.judge): judge now on their last
            # summaries, not up to a summary period later
            advanced |= set(current)
        if set(current) <= advanced or time.monotonic() > deadline:
            break
        # as often as the watcher polls (a tenth of the timeout, 0.2-1 s): another node's
        # claim is seen, and this node's record of its ranks written, that much sooner
        time.sleep(a.poll or min(1.0, max(0.2, node.timeout() / 10)))
        if is_claimed(a.hangs):
            return None
        current = _read_summaries(a, current)
    views = [node.view(time.monotonic(), full=True)]
    for name, (_, data) in current.items():
        if name == mine:
            continue
        view = node_view(data, alive=name in advanced)
        if view is not None:
            views.append(view)
    return views


def _quick(a: _Args, node: _Node) -> float:
    """How often a node whose ranks are silent (judged "not a hang") publishes its summary."""
    return min(a.summary, max(1.0, node.timeout() / 4))


def _watch(a: _Args) -> int:
    """Watch the node until its first rank ends (0) or a hang is handled (1)."""
    node = _Node(a)
    make_dirs(a.run_dir, PROGRESS, a.attempt, "nodes")  # never through a planted link
    next_publish = next_judge = next_claim_check = 0.0
    ended = True  # the node's ranks end on their own (or are stopped by Slurm): say so
    try:
        while True:
            if os.getppid() != a.pid or proc_state(a.pid) in (None, "Z"):
                return 0  # the rank (this process's parent) is gone
            now = time.monotonic()
            node.poll(now)
            suspicious = node.suspicious(now)
            if now >= next_publish:
                node.publish(now)
                # while its ranks are silent past their allowance (judged "not a hang": a
                # peer elsewhere still works), the node tells it every quarter of a short
                # timeout (>= 1 s; the default keeps one write per node per 10 s): the peer's
                # watcher, once its own ranks fall silent too, waits that long for this
                # node's word, not up to a whole summary period
                next_publish = now + (_quick(a, node) if suspicious else a.summary)
            if now >= next_claim_check:
                # whether another node's watcher took charge: every summary period, sooner
                # under a short timeout (a quarter of it, >= 1 s: one stat per node), so that
                # its record of this node's ranks (stacks) does not hold the decision long
                next_claim_check = now + min(a.summary, max(1.0, node.timeout() / 4))
                if is_claimed(a.hangs):
                    ended = False
                    _at_hang(a, node, None, [])
                    return 1
            if now >= next_judge and suspicious:
                views = _confirm(a, node)
                verdict = judge(views, command=a.command) if views is not None else None
                if verdict is None or verdict.hang:
                    ended = False
                    _at_hang(a, node, verdict, views or [])
                    return 1
                log.info("ranks %s silent, not a hang: %s", verdict.stalled, verdict.why)
                next_judge = time.monotonic() + a.summary
                next_publish = time.monotonic() + _quick(a, node)
            timeout = node.timeout()
            time.sleep(a.poll or min(5.0, max(0.2, timeout / 10)))
    finally:
        if ended:
            with contextlib.suppress(Exception):
                node.publish(time.monotonic(), ended=True)
        # only what is ours, never through a link (not shutil.rmtree: a planted parent)
        remove_own_tree(a.local_dir)
        with contextlib.suppress(OSError):
            a.local_dir.parent.rmdir()  # the attempt's folder, once no node of it is left


def _at_hang(a: _Args, node: _Node, verdict: Verdict | None, views: list[NodeView]) -> None:
    """The hang's record, requeue and end, at a full share of the CPU: the watcher stepped back
    for the ranks (``python -m train.hang``), and on a node whose cores other sessions keep busy
    what it does now (the spec models' import, the stop decision's Slurm calls) would wait
    behind them for seconds; the ranks are silent (train.procfs.step_forward)."""
    # `scontrol requeue` makes Slurm SIGTERM every process of the step, this one included, at
    # once (SIGKILL only after KillWait): finish the record and the quarantine first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step_forward(lambda: _handle_hang(a, node, verdict, views))


def _handle_hang(a: _Args, node: _Node, verdict: Verdict | None, views: list[NodeView]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    make_dirs(a.run_dir, HANGS, a.attempt)  # never through a planted link
    claimed = False
    if verdict is not None:
        claimed = claim_hang(a.hangs)
    _record_local(a, node)
    if claimed:
        assert verdict is not None
        _record_and_requeue(a, node, verdict, views)
    else:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (a.hangs / "decided").exists():
            time.sleep(0.2)
    # End the step: the job is requeued (or its budget is spent); nothing of this attempt may
    # go on. A stopped rank dies of SIGKILL too; so does the command it supervises.
    for t in node.tracks.values():
        if t.command_pid is not None and t.pid is not None and is_child(t.command_pid, t.pid):
            with contextlib.suppress(OSError):
                os.killpg(t.command_pid, signal.SIGKILL)
        if t.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(t.pid, signal.SIGKILL)


def _record_local(a: _Args, node: _Node) -> None:
    """Each local rank's stacks (or its command's processes) and what this watcher saw of it;
    then the ranks are frozen until they are ended."""
    now = time.monotonic()
    views = {v.rank: v for v in node.view(now, full=True).ranks}
    dumped: dict[int, bool] = {}
    asked: list[_Track] = []
    for t in node.tracks.values():
        if t.pid is None:
            continue
        stacks = a.hangs / f"rank-{t.rank}.stacks"
        command = t.command_pid
        if command is not None and not is_child(command, t.pid):
            command = None
        if command is not None:
            # not our Python: what the kernel says of each of the command's processes
            dumped[t.rank] = _describe_processes(command, stacks)
            with contextlib.suppress(OSError):
                os.killpg(command, signal.SIGSTOP)  # its own session: pgid == its pid
        elif proc_state(t.pid) != "T":
            with contextlib.suppress(OSError):
                os.kill(t.pid, DUMP_SIGNAL)
            asked.append(t)
    written = {t.rank: a.local_dir / f"rank-{t.rank}.stacks" for t in asked}
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not all(_nonempty(p) for p in written.values()):
        time.sleep(0.1)
    if any(_nonempty(p) for p in written.values()):
        time.sleep(0.3)  # faulthandler writes from its signal handler: let it finish
    for t in asked:
        # Freeze it until it is ended: a live rank must not react to its peers' end (a
        # 'connection closed' failure) before the hang is recorded.
        with contextlib.suppress(OSError):
            os.kill(t.pid or 0, signal.SIGSTOP)
        dumped[t.rank] = False
        if _nonempty(written[t.rank]):
            try:
                # not shutil.copyfile: it opens the copy through a link planted there
                dump = written[t.rank].read_bytes()
                atomic_write(a.hangs / f"rank-{t.rank}.stacks", dump, durable=False)
                dumped[t.rank] = True
            except OSError as exc:
                log.warning("could not copy the stacks of rank %s: %s", t.rank, exc)
    for t in node.tracks.values():
        v = views.get(t.rank)
        seen = {
            **(v.to_json() if v is not None else {"rank": t.rank, "node": a.node}),
            "pid": t.pid,
            "stacks": str(a.hangs / f"rank-{t.rank}.stacks") if dumped.get(t.rank) else None,
        }
        atomic_write(a.hangs / f"rank-{t.rank}.json", json.dumps(seen), durable=False)


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _describe_processes(root: int, out: Path) -> bool:
    """Write state, wait channel, command line and (root only) kernel stack of ``root`` and its
    descendants to ``out``; True when something was written."""
    lines = describe_tree(root)
    if not lines:
        return False
    write_text(out, "\n".join(lines) + "\n")
    return True


def _record_and_requeue(a: _Args, node: _Node, verdict: Verdict, views: list[NodeView]) -> None:
    # the live nodes' watchers record their ranks too (they see the claim within a summary
    # period, or reached the verdict themselves): wait a little for them
    expected = {r.rank for v in views if v.alive and not v.ended for r in v.ranks}
    deadline = time.monotonic() + a.summary + 3.0
    while time.monotonic() < deadline:
        if all((a.hangs / f"rank-{r}.json").exists() for r in expected):
            break
        time.sleep(0.2)
    ranks = sorted({r.rank for v in views for r in v.ranks})
    no_stacks = [r for r in ranks if not (a.hangs / f"rank-{r}.stacks").exists()]
    observed = [r.to_json() for v in views for r in v.ranks]
    if len(observed) > _OBSERVED_MAX:
        observed = [o for o in observed if o["rank"] in verdict.ranks]
    known_steps = [r.step for v in views for r in v.ranks if r.step >= 0]
    step = None if a.command or not known_steps else min(known_steps)
    timeout = node.timeout()
    details = {
        "ranks": list(verdict.ranks),
        "nodes": list(verdict.nodes),
        "evidence": verdict.evidence,
        "why": verdict.why,
        "stalled": list(verdict.stalled),
        "timeout_s": round(timeout, 1),
        "stacks_dir": str(a.hangs),
        "no_stacks": no_stacks,
        "observed": sorted(observed, key=lambda o: int(o["rank"])),
    }
    log.error(
        "hang: suspects rank(s) %s on %s (%s); stacks in %s",
        list(verdict.ranks), list(verdict.nodes), verdict.why, a.hangs,
    )  # fmt: skip
    # the one stop decision, with the facts a rank would give it: the hang event, its budget,
    # a restart in place (no suspect, a batch script that restarts steps, budget left) or the
    # requeue and the suspects' nodes
    from train.spec import RequeueConfig  # here: the spec models (pydantic) are most of what
    # a watcher would import at its start, beside the ranks' own start (issue 46)

    env = Decider(
        a.job_id,
        a.restart_count,
        a.in_place,
        in_place_supervised=a.in_place_supervised,
        world_size=a.world_size,
        hosts=job_hosts(os.environ),
        node_name=a.node,
        slurm_release=exported_release(os.environ),
    )
    code = request_requeue(
        env,
        a.run_dir,
        RequeueConfig.model_validate(a.budgets),
        "hang",
        step=step,
        details=details,
        suspects=tuple(verdict.nodes),
    )
    write_text(a.hangs / "decided", json.dumps({"exit_code": code, **details}))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.hang.watcher", description=__doc__)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--attempt", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--local-dir", type=Path, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--local-world-size", type=int, default=1)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--timeout", type=float)
    p.add_argument("--poll", type=float)
    p.add_argument("--summary", type=float, default=SUMMARY_S)
    p.add_argument("--budgets", type=json.loads, default={})
    p.add_argument("--job-id", default="")
    p.add_argument("--restart-count", type=int, default=0)
    p.add_argument("--in-place", type=int, default=0)
    p.add_argument("--in-place-supervised", action="store_true")
    p.add_argument("--command", action="store_true")
    ns = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [watchdog {ns.node}] %(message)s", datefmt="%X"
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args = _Args(
        ns.run_dir, ns.attempt, ns.node, ns.local_dir, ns.world_size, ns.local_world_size,
        ns.pid, ns.timeout, ns.poll, ns.summary, ns.budgets, ns.job_id or None,
        ns.restart_count, ns.command, ns.in_place, ns.in_place_supervised,
    )  # fmt: skip
    return _watch(args)


if __name__ == "__main__":
    sys.exit(main())
