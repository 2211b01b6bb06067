"""Hang watchdog (issue 15): what it costs per step, and how fast it notices a frozen rank.

- Cost: training steps of the example's ``tinycnn`` (batch 128, 1 thread, CPU) with one
  heartbeat per step (:meth:`train.hang.heartbeat.Heartbeat.beat`, a 16-byte ``pwrite``) against the
  same steps without, interleaved rounds. Goal: within 1%.
- Latency: two heartbeat-writing 'rank' processes (no torch) under the real watchers
  (``python -m train.hang.watcher``); one is frozen with SIGSTOP and the time until the ``hang``
  event
  is recorded is compared with the configured timeout. The watcher polls every timeout/10 (at
  least 0.2 s) and gives a live rank up to 3 s to write its stacks, so about timeout + 1 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.common import REPO, Figure, Goal, Options, interleave
from train.hang.heartbeat import read_beats

SECTION = "Hang watchdog (issue 15)"

RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from train.hang.heartbeat import Watchdog

    wd = Watchdog(Path(sys.argv[1]), rank=int(sys.argv[2]), world_size=2, job_id=None,
                  restart_count=0, timeout_s=float(sys.argv[3]), budgets={"max_hangs": 9})
    step = 0
    while True:
        time.sleep(0.02)
        step += 1
        wd.beat(step)
    """
)


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
        progress = run / ".progress" / "local-0"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(read_beats(progress, 2)) < 2:
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


def run(opts: Options) -> list[Figure]:
    """Both rows (cost per step, detection latency)."""
    opts.workdir.mkdir(parents=True, exist_ok=True)
    repeats = 3 if opts.quick else max(5, opts.repeats)
    opts.log("watchdog: training steps with and without the heartbeat")
    figures = [_cost(opts, repeats)]
    for timeout in (3.0,) if opts.quick else (3.0, 10.0):
        opts.log(f"watchdog: detection latency, timeout {timeout:g} s")
        figures.append(_latency(opts, timeout, 2 if opts.quick else 3))
    return figures


if __name__ == "__main__":
    for fig in run(Options(quick="--quick" in sys.argv)):
        print(json.dumps(fig.to_json()))
