"""Slurm commands that following a job costs the controller (issue 18), on the local cluster.

A plain batch job (``sleep`` for 2 minutes, 1 minute with ``--quick``) is followed the way
``jobs submit --follow`` follows a run (:func:`jobs.follow.follow`: the run's files every
second, Slurm on a back-off schedule, one command per poll). At the same time, on the same
job, the baseline polls the way following did before: ``SlurmClient.job_states`` once a second
(``sacct`` plus ``squeue`` for a job accounting does not show finished). Every Slurm command
either side runs goes through a shim directory first on PATH that logs it with a timestamp,
then execs the real command: the counts are of real processes, not of calls in Python.

Rows: commands in all for the followed job (goal <= 30) against the baseline's, and the most
commands in any 10 s window after the first minute (goal <= 1).
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, Goal, Options, bench_env, skipped
from train.history import read_jsonl

__all__ = ["run"]

SECTION = "Polling (local Slurm cluster)"
COMMANDS = ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo")
SHIM = """#!/bin/sh
echo "$(date +%s.%N) {name} $*" >> "$SHIM_LOG"
exec {real} "$@"
"""


def make_shim(directory: Path) -> Path:
    """A directory of Slurm commands that log each call to ``$SHIM_LOG`` and exec the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        real = shutil.which(name)
        if real is None:
            continue
        path = directory / name
        path.write_text(SHIM.format(name=name, real=real))
        path.chmod(0o755)
    return directory


def read_calls(log: Path) -> list[tuple[float, str]]:
    """(time, command) per logged call."""
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2:
            try:
                out.append((float(parts[0]), parts[1]))
            except ValueError:
                continue
    return out


def max_in_window(times: list[float], start: float, window: float = 10.0) -> int:
    """The most calls in any ``window`` seconds at or after ``start``."""
    later = sorted(t for t in times if t >= start)
    best = 0
    for i, t in enumerate(later):
        best = max(best, sum(1 for u in later[i:] if u < t + window))
    return best


def _baseline(client: Any, job_id: str, stop: threading.Event) -> None:
    """Following as it was: sacct (+ squeue) every second until the job is over."""
    while not stop.is_set():
        info = client.job_states([job_id]).get(job_id)
        if info is not None and info.terminal:
            return
        time.sleep(1.0)


def run(opts: Options) -> list[Figure]:
    """Follow a ``sleep`` job with both policies at once; count each side's Slurm commands."""
    name = "Slurm commands, followed job"
    if not opts.slurm_conf:
        return [skipped(SECTION, name, "no local cluster config (python -m cluster up)")]
    from cluster import slurm_client
    from jobs.follow import follow
    from jobs.records import RunRecord, TaskRecord

    work = opts.workdir / "follow"
    shim = make_shim(work / "bin")
    env = bench_env()
    env["SLURM_CONF"] = opts.slurm_conf
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    ours_log, base_log = work / "ours.log", work / "baseline.log"
    ours = slurm_client(environ={**env, "SHIM_LOG": str(ours_log)}, timeout=30)
    base = slurm_client(environ={**env, "SHIM_LOG": str(base_log)}, timeout=30)
    if not ours.ping():
        return [skipped(SECTION, name, "no Slurm controller answers (python -m cluster up)")]
    duration = 60 if opts.quick else 120
    script = work / "job.sh"
    events = shlex.quote(str(work / "events.jsonl"))
    # The dev cluster's spare node n3, where tests that preempt (urgent on n1) do not reach.
    spare = {n.name for n in ours.nodes()} >= {"n3"}
    nodes = "#SBATCH --nodelist=n3\n" if spare else ""
    # What a training job's run directory shows: a start event, then (at the end) complete.
    event = 'printf \'{"time": %s, "event": "%s", "step": %s}\\n\' "$(date +%s)"'
    script.write_text(
        "#!/bin/sh\n#SBATCH --job-name=bench-follow\n#SBATCH --nodes=1\n#SBATCH --ntasks=1\n"
        "#SBATCH --cpus-per-task=1\n#SBATCH --time=10\n#SBATCH --output=/dev/null\n"
        "#SBATCH --no-requeue\n"
        f"{nodes}"
        f"{event} start 0 >> {events}\nsleep {duration}\n{event} complete 1 >> {events}\n"
    )
    job_id = ours.submit(script)
    ours_log.unlink(missing_ok=True)  # the submission is not following
    record = RunRecord(
        "bench-follow", "bench-follow", str(work), "slurm", job_id=job_id,
        tasks=[TaskRecord(0, str(work), {})],
    )  # fmt: skip
    saved = os.environ.get("SLURM_TRAIN_STATE_DIR")
    os.environ["SLURM_TRAIN_STATE_DIR"] = str(work / "state")  # its own status cache
    stop = threading.Event()
    thread = threading.Thread(target=_baseline, args=(base, job_id, stop), daemon=True)
    t0 = time.time()
    opts.log(f"follow: job {job_id} ({duration} s), ours and the baseline side by side")
    followed = False
    try:
        thread.start()
        follow(record, lambda: ours, out=io.StringIO())
        followed = True
        wall = time.time() - t0
        thread.join(timeout=30)
    finally:
        stop.set()
        if saved is None:
            os.environ.pop("SLURM_TRAIN_STATE_DIR", None)
        else:
            os.environ["SLURM_TRAIN_STATE_DIR"] = saved
        if not followed:
            ours.cancel([job_id])
    ended = max(
        (e["time"] for e in read_jsonl(work / "events.jsonl") if e.get("event") == "complete"),
        default=time.time(),
    )
    ours_calls, base_calls = read_calls(ours_log), read_calls(base_log)
    final = ours.poll_states([job_id]).get(job_id)
    if final is None or final.state != "COMPLETED":
        # The cluster is shared: another job may preempt this one (it is not requeued).
        state = final.state if final else "unknown"
        return [skipped(SECTION, name, f"job {job_id} ended {state}, not after {duration} s")]
    kinds = sorted({c for _, c in ours_calls})
    note = (
        f"{duration} s sleep job followed for {wall:.0f} s; ours ran "
        + ", ".join(f"{sum(1 for _, c in ours_calls if c == k)} {k}" for k in kinds)
        + "; baseline: job_states every 1 s (sacct + squeue), same job, same time"
    )
    total = Figure.measured(
        SECTION,
        f"{name} ({duration} s job)",
        "commands",
        [float(len(ours_calls))],
        [float(len(base_calls))],
        baseline_name="poll every 1 s (before)",
        goal=Goal("<=", 30, on="ours"),
        note=note,
    )
    # While the job runs: from the first minute on until its end shows in the run's files
    # (then following asks at once, and once more to confirm: the "at once" of the issue).
    per_window = max_in_window([t for t, _ in ours_calls if t < ended], t0 + 60)
    base_window = max_in_window([t for t, _ in base_calls if t < ended], t0 + 60)
    after_end = sum(1 for t, _ in ours_calls if t >= ended)
    window = Figure.measured(
        SECTION,
        "Slurm commands per 10 s, first minute to the job's end (max)",
        "commands",
        [float(per_window)],
        [float(base_window)],
        baseline_name="poll every 1 s (before)",
        goal=Goal("<=", 1, on="ours"),
        note=f"after the end showed in events.jsonl: {after_end} command(s) to see it final",
    )
    return [total, window]
