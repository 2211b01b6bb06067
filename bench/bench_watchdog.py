"""Hang watchdog (issues 15 and 25): what it costs per step, how fast it notices a frozen rank,
and what it costs the shared file system.

- Cost: training steps of the example's ``tinycnn`` (batch 128, 1 thread, CPU) with one
  heartbeat per step (:meth:`train.hang.heartbeat.Heartbeat.beat`, a 32-byte ``pwrite`` into
  node-local memory) against the same steps without, interleaved rounds. Goal: within 1%.
- Latency: two heartbeat-writing 'rank' processes (no torch) on two simulated nodes, in
  lockstep through a stand-in for DDP's all-reduce, under the real watchers
  (``python -m train.hang.watcher``); one is frozen with SIGSTOP and the time until the ``hang``
  event is recorded is compared with the configured timeout. The watcher polls every
  timeout/10 (at least 0.2 s) and gives a live rank up to 3 s to write its stacks.
- A hang's record under other sessions' load (issue 46): the watcher steps back for the ranks
  (nice 10, its session's autogroup); at a hang it records and requeues from a child leading a
  session of its own (:func:`train.procfs.step_forward`). The CPU work of that record (the spec
  models' and the stop decision's imports, ~0.1 CPU-s) timed in a stepped-back interpreter,
  in place against in such a child, with four spinning sessions per core beside it. Goal: at
  most half the time.
- File operations on the run directory (issue 25): 4 and 16 simulated ranks (2 per node, each
  beating every 0.1 s through the real :class:`~train.hang.heartbeat.Watchdog` and node
  watchers, default settings) run under ``strace -f``; every system call that names a path in
  the run directory (or an open file there) in a window after start-up is counted. Goal: the
  count per rank per minute does not grow with the number of ranks, and at most one write
  (a file created, written or renamed) per rank per 10 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import REPO, Figure, Goal, Options, interleave, skipped
from train.hang.heartbeat import SUMMARY_S

SECTION = "Hang watchdog (issues 15, 25)"

RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from train.hang.heartbeat import Watchdog

    run, rank = Path(sys.argv[1]), int(sys.argv[2])
    wd = Watchdog(run, rank=rank, world_size=2, job_id=None, restart_count=0,
                  timeout_s=float(sys.argv[3]), budgets={"max_hangs": 9}, node=f"n{rank}",
                  local_root=run / "shm")
    coll = run / "collective"
    coll.mkdir(parents=True, exist_ok=True)
    def peer_step(peer):
        try:  # read once; the peer truncates and rewrites it: an empty read is "not yet"
            return int(peer.read_text().strip() or -1)
        except (OSError, ValueError):
            return -1

    step = 0
    while True:
        time.sleep(0.02)
        step += 1
        (coll / f"rank-{rank}").write_text(str(step))  # a stand-in for DDP's all-reduce
        peer = coll / f"rank-{1 - rank}"
        while peer_step(peer) < step:
            time.sleep(0.005)
        wd.beat(step)
    """
)

# A rank of the file-operations count: 2 ranks per simulated node, default settings.
SIM_RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from train.hang.heartbeat import Watchdog

    run, rank, world, shm = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    wd = Watchdog(run, rank=rank, world_size=world, job_id="bench", restart_count=0,
                  timeout_s=None, budgets={}, node=f"sim{rank // 2}", local_rank=rank % 2,
                  local_world_size=2, local_root=shm)
    step = 0
    while True:
        time.sleep(0.1)
        step += 1
        wd.beat(step)
    """
)
# system calls that create, write or rename (an open counts when it creates)
_WRITES = ("openat", "open", "creat", "write", "pwrite64", "writev", "rename", "renameat",
           "renameat2", "mkdir", "mkdirat", "unlink", "unlinkat", "ftruncate")  # fmt: skip


def _cost(opts: Options, repeats: int) -> Figure:
    import torch

    from train.hang.heartbeat import Heartbeat
    from train.loop.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("tinycnn", width=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 3, 32, 32)
    y = torch.randint(0, 10, (128,))
    folder = Path(tempfile.mkdtemp(prefix="watchdog-", dir=opts.workdir))
    hb = Heartbeat(folder, 0, {"rank": 0})
    steps = 5 if opts.quick else 15

    def train(beat: bool) -> float:
        t0 = time.perf_counter()
        for step in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if beat:
                hb.beat(step)
        return (time.perf_counter() - t0) / steps

    samples = interleave(
        {"on": lambda: train(True), "off": lambda: train(False)}, repeats, opts.warmup
    )
    n = 100_000
    t0 = time.perf_counter()
    for i in range(n):
        hb.beat(i)
    beat_us = (time.perf_counter() - t0) / n * 1e6
    hb.close()
    step_ms = 1e3 * sorted(samples["off"])[len(samples["off"]) // 2]
    return Figure.measured(
        SECTION,
        "training step with the heartbeat (tinycnn, batch 128, CPU)",
        "s",
        samples["on"],
        samples["off"],
        baseline_name="the same steps without it",
        goal=Goal("<=", 1.01),
        note=f"one beat alone: {beat_us:.2f} us = {100 * beat_us / 1e3 / step_ms:.4f}% of a "
        f"{step_ms:.1f} ms step",
    )


def _latency_once(folder: Path, timeout: float) -> float:
    script = folder / "rank.py"
    script.write_text(RANK)
    run = folder / f"run-{time.monotonic_ns()}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(run), str(r), str(timeout)], env=env)
        for r in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list((run / "shm").glob("*/*/*/rank-?"))) < 2:
            time.sleep(0.1)
        time.sleep(1.0)  # a few beats, so the watchers are armed
        frozen = time.time()
        os.kill(procs[1].pid, signal.SIGSTOP)
        events = run / "events.jsonl"
        deadline = time.monotonic() + timeout + 60
        while time.monotonic() < deadline:
            if events.exists():
                for line in events.read_text().splitlines():
                    record = json.loads(line)
                    if record.get("event") == "hang":
                        return float(record["time"]) - frozen
            time.sleep(0.05)
        raise RuntimeError(f"no hang event within {timeout + 60:g}s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _latency(opts: Options, timeout: float, repeats: int) -> Figure:
    folder = Path(tempfile.mkdtemp(prefix="watchdog-", dir=opts.workdir))
    ours = [_latency_once(folder, timeout) for _ in range(repeats)]
    return Figure.measured(
        SECTION,
        f"detection latency, SIGSTOP to the hang event (timeout {timeout:g} s)",
        "s",
        ours,
        [timeout] * repeats,
        baseline_name="the configured requeue.hang_timeout_s",
        goal=Goal("<=", 1.5),
        note="watchers poll every timeout/10 (>= 0.2 s) and wait <= 3 s for a live rank's stacks",
    )


def _count_file_ops(folder: Path, ranks: int, warmup: float, window: float) -> tuple[int, int]:
    """(system calls on the run directory, of which writes) of ``ranks`` simulated ranks in
    ``window`` seconds after ``warmup`` seconds of start-up."""
    run = folder / f"run-{ranks}-{time.monotonic_ns()}"
    run.mkdir(parents=True)
    script = folder / "sim_rank.py"
    script.write_text(SIM_RANK)
    trace = folder / f"trace-{ranks}.txt"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    launcher = (
        "import subprocess, sys, time\n"
        f"ps = [subprocess.Popen([sys.executable, {str(script)!r}, {str(run)!r}, str(r), "
        f"'{ranks}', {str(folder / 'shm')!r}]) for r in range({ranks})]\n"
        f"time.sleep({warmup + window + 1})\n"
        "[p.kill() for p in ps]; [p.wait() for p in ps]\n"
    )
    started = time.time()
    subprocess.run(
        ["strace", "-f", "-qq", "-ttt", "-y", "-e", "trace=%file,%desc", "-o", str(trace),
         sys.executable, "-c", launcher],
        env=env, check=True, timeout=warmup + window + 120,
    )  # fmt: skip
    lo, hi = started + warmup, started + warmup + window
    total = writes = 0
    needle = str(run)
    with trace.open(errors="replace") as f:
        for line in f:
            parts = line.split(None, 2)  # pid, time, call
            if len(parts) < 3 or needle not in parts[2] or parts[2].startswith(("+++", "---")):
                continue
            try:
                t = float(parts[1])
            except ValueError:
                continue
            if lo <= t < hi:
                total += 1
                call = parts[2].split("(", 1)[0]
                if call in _WRITES and (call not in ("openat", "open") or "O_CREAT" in parts[2]):
                    writes += 1
    return total, writes


def _file_ops(opts: Options) -> list[Figure]:
    name = "file operations on the run directory per rank per minute, 16 ranks vs 4"
    if shutil.which("strace") is None:
        return [skipped(SECTION, name, "strace is not installed")]
    folder = Path(tempfile.mkdtemp(prefix="watchdog-ops-", dir=opts.workdir))
    window = (3 if opts.quick else 6) * SUMMARY_S
    per_rank_min: dict[int, float] = {}
    writes_per_10s: dict[int, float] = {}
    for ranks in (4, 16):
        opts.log(f"watchdog: file operations of {ranks} ranks over {window:g} s (strace)")
        total, writes = _count_file_ops(folder, ranks, 15.0, window)
        per_rank_min[ranks] = total / ranks / (window / 60)
        writes_per_10s[ranks] = writes / ranks / (window / 10)
    return [
        Figure.measured(
            SECTION, name, "ops", [per_rank_min[16]], [per_rank_min[4]],
            baseline_name="the same with 4 ranks",
            goal=Goal("<=", 1.25),
            note=f"strace -f of the ranks and the node watchers, {window:g} s after 15 s of "
            "start-up; 2 ranks per node, heartbeats node-local, one summary per node per "
            f"{SUMMARY_S:g} s",
        ),
        Figure.measured(
            SECTION, "writes to the run directory per rank per 10 s (16 ranks)", "writes",
            [writes_per_10s[16]], goal=Goal("<=", 1.0, on="ours"),
            note=f"4 ranks: {writes_per_10s[4]:.2f}; files created, written or renamed",
        ),
    ]  # fmt: skip


_TREE = (
    "import subprocess, time; subprocess.Popen(['sh', '-c', 'sleep 60 & sleep 60 & wait']); "
    "print('ready', flush=True); time.sleep(60)"
)


def _tree_cost(repeats: int) -> Figure:
    """The command's process tree, as the supervisor and the watcher read it at every look
    (train.procfs.process_tree), walked down from the command (``/proc/PID/task/TID/children``)
    against every process's parent read (the earlier way, and the fallback): a command with
    three descendants, on this machine's /proc as it is. Goal: at most half."""
    from train.procfs import scan_tree, walk_tree

    cmd = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert cmd.stdout is not None
        cmd.stdout.readline()
        time.sleep(0.2)  # sh has started its sleeps
        if walk_tree(cmd.pid) is None:
            return skipped(SECTION, "process tree, walked", "no /proc children files here")

        def timed(fn: Callable[[int], object]) -> float:
            t0 = time.perf_counter()
            for _ in range(20):
                fn(cmd.pid)
            return (time.perf_counter() - t0) / 20 * 1e3

        runs = interleave({"walk": lambda: timed(walk_tree), "scan": lambda: timed(scan_tree)},
                          repeats)  # fmt: skip
        procs = sum(1 for e in os.listdir("/proc") if e.isdigit())
        return Figure.measured(
            SECTION, "process tree of the command, walked down", "ms", runs["walk"],
            runs["scan"], baseline_name="every process's parent read",
            goal=Goal("<=", 0.5),
            note=f"{len(walk_tree(cmd.pid) or {})} processes in the tree, {procs} on the "
            "machine; 20 reads per sample",
        )  # fmt: skip
    finally:
        for pid in sorted(scan_tree(cmd.pid), reverse=True):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        cmd.wait()


_RECORD = textwrap.dedent(
    """
    import json, os, sys, time
    from train.procfs import session_is_ours, step_back, step_forward
    step_back(session=session_is_ours(os.getpid()))
    time.sleep(0.25)  # the kernel takes one autogroup change per 100 ms on the machine
    out = {}
    def record():
        t0 = time.perf_counter()
        import train.stop.act  # the stop decision
        from train.spec import RequeueConfig  # the run's budgets, at a hang only
        out["ms"] = (time.perf_counter() - t0) * 1e3
        print(json.dumps(out), flush=True)
    if sys.argv[1] == "forward":
        step_forward(record)
    else:
        record()
    """
)


def _hang_record(repeats: int) -> Figure:
    """The CPU work of a hang's record in a stepped-back watcher, in place against at a full
    share again (:func:`train.procfs.step_forward`), beside four spinning sessions per core."""
    if not Path("/proc/self/autogroup").exists():
        return skipped(SECTION, "a hang's record under load", "no autogroups on this kernel")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    spinners = [
        subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
        for _ in range(4 * (os.cpu_count() or 1))
    ]

    def timed(mode: str) -> float:
        # a session of its own, as the watcher (its autogroup steps back with it)
        proc = subprocess.run([sys.executable, "-P", "-c", _RECORD, mode], env=env,
                              capture_output=True, text=True, timeout=300, check=True,
                              start_new_session=True)  # fmt: skip
        return float(json.loads(proc.stdout.strip().splitlines()[-1])["ms"])

    try:
        time.sleep(0.5)
        runs = interleave({"forward": lambda: timed("forward"), "back": lambda: timed("back")},
                          repeats)  # fmt: skip
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return Figure.measured(
        SECTION, "a hang's record under other sessions' load, at a full share", "ms",
        runs["forward"], runs["back"], baseline_name="stepped back, in place",
        goal=Goal("<=", 0.5),
        note=f"{len(spinners)} spinning sessions beside it; the stop decision's and the spec "
        "models' imports, in a new interpreter per sample",
    )  # fmt: skip


def run(opts: Options) -> list[Figure]:
    """All rows (cost per step, detection latency, file operations on the run directory, the
    command's process tree, a hang's record under load)."""
    opts.workdir.mkdir(parents=True, exist_ok=True)
    repeats = 3 if opts.quick else max(5, opts.repeats)
    opts.log("watchdog: training steps with and without the heartbeat")
    figures = [_cost(opts, repeats)]
    for timeout in (3.0,) if opts.quick else (3.0, 10.0):
        opts.log(f"watchdog: detection latency, timeout {timeout:g} s")
        figures.append(_latency(opts, timeout, 2 if opts.quick else 3))
    figures += _file_ops(opts)
    figures.append(_tree_cost(repeats))
    opts.log("watchdog: a hang's record under other sessions' load")
    figures.append(_hang_record(repeats))
    return figures


if __name__ == "__main__":
    for fig in run(Options(quick="--quick" in sys.argv)):
        print(json.dumps(fig.to_json()))
