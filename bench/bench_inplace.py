"""Restart in place on the real local cluster (issue 26): ``kill -9`` of a rank -> training again.

A 2-node DDP run of the built-in trainer (tiny CNN, synthetic data, one step per metrics line)
is submitted the way users submit (``python -m jobs submit``: the script restarts a failed step
in the same allocation). Once it has checkpointed, rank 1's process is killed with SIGKILL from
outside. Measured from the kill to the first training step of the restarted step (its
``metrics.jsonl`` line), against what any restart pays at least, timed in the same run:
``python -c "import torch"`` plus loading that checkpoint's files (``torch.load``). Goal: at most
2x, the same job id, never PENDING (no requeue, no BeginTime hold). Repeated ``rounds`` times in
one job (each kill is one more restart in place).

Issue 46 sets the same against the physical floor: what no tool avoids, measured on the same
idle nodes once the run is gone, in a trivial 2-node job that restarts a step in place as Slurm
alone does (rank 1 ``kill -9``-ed, srun ends the step, the batch script starts the next one)
whose new step only starts Python, imports torch and loads the run's last checkpoint on both
ranks: the kill -> both ranks done. Goal 1.05x. Both floors are measured with nothing else
running (a floor timed beside the training ranks on these two cores would read slower than any
restart, whose ranks have the cores to themselves).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    Figure,
    Goal,
    Options,
    Skip,
    bench_env,
    skipped,
    wait_idle,
    wait_until,
)
from train.history import read_jsonl

__all__ = ["run"]

SECTION = "Restart in place (local Slurm cluster)"
NAME = "kill -9 of a rank -> first training step again"
#: Steps between a restart and the next kill (~4 s): a run that has settled (its node's watcher
#: started, the first records written), as a run a failure reaches after hours of training has.
SETTLE_STEPS = 120
FLOOR_NAME = "kill -9 of a rank -> first training step again, vs the physical floor"

#: Slurm's own restart of a step in place, of a step that only loads the checkpoint: rank 1
#: killed, the next step's ranks start Python, import torch, load the checkpoint, say when.
TRIVIAL = """\
#!/bin/bash
#SBATCH --partition=debug
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
#SBATCH --output=trivial-%j.txt
export BENCH_OUT={out} BENCH_PY={python} BENCH_CKPT={checkpoint} BENCH_LOAD={load}
export OMP_NUM_THREADS=1
for k in $(seq 1 {rounds}); do
  export BENCH_ROUND=$k
  srun --kill-on-bad-exit=1 sh -c 'if [ "$SLURM_PROCID" = 1 ]; then sleep 1; \\
echo "$BENCH_ROUND $(date +%s.%N)" >> "$BENCH_OUT/killed.txt"; kill -9 $$; else sleep 600; fi'
  srun sh -c '"$BENCH_PY" -P -c "$BENCH_LOAD" >> "$BENCH_OUT/up-$SLURM_PROCID.txt"'
done
"""
#: What the trivial job's new step runs on each rank.
LOAD = """\
import glob, os, time, torch
for f in sorted(glob.glob(os.path.join(os.environ["BENCH_CKPT"], "*.pt"))):
    torch.load(f, map_location="cpu", weights_only=True)
print(os.environ["BENCH_ROUND"], time.time())
"""

SPEC = """\
name: bench-inplace
resources: {partition: debug, nodes: 2, cpus_per_task: 1, time: "00:15:00"}
environment: {variables: {OMP_NUM_THREADS: "1"}}
train:
  model: tinycnn
  width: 8
  data: {kind: synthetic, train_size: 2048, test_size: 128}
  batch_size: 64
  max_steps: 100000
  optimizer: {name: sgd, lr: 0.05, schedule: constant}
  checkpoint: {interval_steps: 20, keep_last: 2, keep_best: false}
  log_interval: 1
  eval_every_epochs: 100000
requeue: {max_restarts_in_place: 10, max_infra_failures: 10}
"""


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _rank_pid(job: str, rank: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = _environ(int(entry.name))
        if env.get("SLURM_JOB_ID") == job and env.get("SLURM_PROCID") == str(rank):
            try:
                if b"submitit.core._submit" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    return None


def _split(
    events: list[dict[str, Any]], killed: float, first_step: float
) -> tuple[float, float, str] | None:
    """Issue 46's split of one restart in place, from the run's own events: the stop (the kill
    -> the batch script's ``restart_in_place``: the old step gone, the decision made) and the
    start (-> the first step: the new step, the interpreter, imports, process group, load),
    with the ``resume`` event's phases (rank 0's own marks, the first from its process start:
    ``train.startup.process_start``, to the kernel's 10 ms tick)."""
    after = [e for e in events if float(e.get("time", 0)) > killed]
    decided = next((e for e in after if e.get("event") == "restart_in_place"), None)
    if decided is None:
        return None
    resumed = next((e for e in after if e.get("event") == "resume"), None)
    startup = resumed.get("startup") if resumed is not None else None
    phases = ""
    if isinstance(startup, dict):
        phases = ", ".join(f"{k} {v:.2f}" for k, v in startup.items() if isinstance(v, int | float))
    at = float(decided["time"])
    return (at - killed, first_step - at, phases)


def _floor(env: dict[str, str], checkpoint: Path) -> float:
    """``import torch`` + loading the checkpoint's files: what any restart pays at least."""
    files = [str(p) for p in sorted(checkpoint.glob("*.pt"))]
    code = (
        "import sys, torch\n"
        "for f in sys.argv[1:]:\n"
        "    torch.load(f, map_location='cpu', weights_only=True)\n"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *files], env=env, timeout=120, check=True)
    return time.perf_counter() - t0


def _physical_floor(client: Any, work: Path, checkpoint: Path, rounds: int) -> list[float]:
    """The physical floor of a restart in place, ``rounds`` times in one 2-node job
    (:data:`TRIVIAL`): the kill of rank 1 -> both ranks of the next step done loading
    ``checkpoint`` in a fresh interpreter with torch imported."""
    import shlex

    out = work / "trivial"
    out.mkdir(parents=True, exist_ok=True)
    script = out / "trivial.sbatch"
    words = {k: shlex.quote(str(v)) for k, v in
             (("out", out), ("python", sys.executable), ("checkpoint", checkpoint),
              ("load", LOAD))}  # fmt: skip
    script.write_text(TRIVIAL.format(rounds=rounds, **words), encoding="utf-8")
    job = str(client.submit(script, cwd=out))

    def ended() -> bool:
        return client.show_job(job).get("JobState", "") in ("COMPLETED", "FAILED", "CANCELLED",
                                                            "TIMEOUT", "NODE_FAIL")  # fmt: skip

    try:
        wait_until("the trivial job's restarts in place", ended, 180)
    finally:
        client.cancel([job], no_requeue=True)
        wait_idle(client)

    def times(name: str) -> dict[str, float]:
        path = out / name
        lines = path.read_text().split("\n") if path.exists() else []
        return {ln.split()[0]: float(ln.split()[1]) for ln in lines if len(ln.split()) == 2}

    killed, ups = times("killed.txt"), [times("up-0.txt"), times("up-1.txt")]
    return [max(up[k] for up in ups) - t for k, t in killed.items() if all(k in up for up in ups)]


def _copy_latest(run_dir: Path, dest: Path) -> Path:
    """A copy of the newest checkpoint (the run goes on pruning its own while we measure)."""
    import shutil

    for _ in range(5):
        steps = [p for p in (run_dir / "checkpoints").glob("step-*") if p.name[5:].isdigit()]
        if not steps:
            break
        latest = max(steps, key=lambda p: int(p.name[5:]))
        shutil.rmtree(dest, ignore_errors=True)
        try:
            shutil.copytree(latest, dest)
            return dest
        except (OSError, shutil.Error):
            time.sleep(0.2)  # pruned while copied: take the next newest
    raise Skip("no checkpoint to time the floor with")


def run(opts: Options) -> list[Figure]:
    if not opts.slurm_conf:
        return [skipped(SECTION, NAME, "no local cluster config (python -m cluster up)")]
    from cluster import slurm_client

    env = bench_env(threads=None)
    env["SLURM_CONF"] = opts.slurm_conf
    work = opts.workdir / "inplace"
    env["SLURM_TRAIN_STATE_DIR"] = str(work / "state")
    env["SLURM_TRAIN_RUNS_DIR"] = str(work / "runs")
    client = slurm_client(environ=env, timeout=30)
    if not client.ping():
        return [skipped(SECTION, NAME, "no Slurm controller answers (python -m cluster up)")]
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "spec.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    rounds = 1 if opts.quick else 3
    proc = subprocess.run(
        [sys.executable, "-m", "jobs", "submit", str(spec), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return [skipped(SECTION, NAME, f"jobs submit failed: {proc.stderr.strip()[-200:]}")]
    data = json.loads(proc.stdout)
    job, run_dir = str(data["job_id"]), Path(data["run_dir"])
    states: set[str] = set()
    ours: list[float] = []
    floor: list[float] = []
    physical: list[float] = []
    kept_ckpt: Path | None = None
    splits: list[tuple[float, float, str]] = []
    try:

        def state() -> str:
            s = client.show_job(job).get("JobState", "")
            if s == "RUNNING" or states:  # from its first start on: PENDING would be a requeue
                states.add(s)
            if s in ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                raise Skip(f"the job ended {s}")
            return s

        def train_steps() -> list[dict[str, Any]]:
            return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"]

        def trained(done: int) -> bool:
            enough = bool(state()) and len(train_steps()) >= done + SETTLE_STEPS
            return enough and any((run_dir / "checkpoints").glob("step-*"))

        for k in range(1, rounds + 1):
            done = len(train_steps())
            wait_until(
                f"{SETTLE_STEPS} more steps and a checkpoint", functools.partial(trained, done), 300
            )
            pid = wait_until("rank 1's process", lambda: _rank_pid(job, 1), 60)
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            opts.log(f"inplace: killed rank 1 (pid {pid}) of job {job}, round {k}")

            def first_after(killed: float = killed) -> dict[str, Any] | None:
                state()
                resumes = [
                    e
                    for e in read_jsonl(run_dir / "events.jsonl")
                    if e.get("event") == "resume" and float(e.get("time", 0)) > killed
                ]
                if not resumes:
                    return None
                later = [r for r in train_steps() if float(r["time"]) >= resumes[0]["time"]]
                return later[0] if later else None

            first = wait_until("the first step after the restart in place", first_after, 300)
            ours.append(float(first["time"]) - killed)
            since = [
                e["event"]
                for e in read_jsonl(run_dir / "events.jsonl")
                if float(e.get("time", 0)) > killed
            ]
            opts.log(f"inplace: round {k}: {ours[-1]:.2f} s; events since the kill: {since}")
            parts = _split(read_jsonl(run_dir / "events.jsonl"), killed, float(first["time"]))
            if parts is not None:
                splits.append(parts)
            kept_ckpt = _copy_latest(run_dir, work / "floor")  # the floors load it, later
    except Skip as exc:
        return [skipped(SECTION, NAME, str(exc))]
    finally:
        client.cancel([job], no_requeue=True)
        wait_idle(client)  # its ranks stop writing before the bench removes the run directory
    if kept_ckpt is not None:  # the floors on the same nodes, idle now
        floor = [min(_floor(env, kept_ckpt) for _ in range(2)) for _ in ours]
        try:
            physical = _physical_floor(client, work, kept_ckpt, 3)
        except Skip as exc:
            opts.log(f"inplace: no physical floor: {exc}")
    restarts = client.show_job(job).get("Restarts", "?")
    kept = "PENDING" not in states and restarts == "0"
    split = "; ".join(f"{a:.2f} / {b:.2f} ({ph or '-'})" for a, b, ph in splits) or "-"
    note = (
        f"job {job}: states seen {sorted(states)}, Slurm restarts {restarts} "
        f"(same job id, never PENDING: {'yes' if kept else 'NO'}); per restart, stop (the kill "
        f"-> the decision) / start (-> the first step; its phases): {split} s"
    )
    fig = Figure.measured(
        SECTION, NAME, "s", ours, floor,
        baseline_name='python -c "import torch" + torch.load of the checkpoint',
        goal=Goal("<=", 2.0), note=note,
    )  # fmt: skip
    if not kept:
        fig.status = "fail"
    figs = [fig]
    if physical:
        at_floor = Figure.measured(
            SECTION, FLOOR_NAME, "s", ours, physical,
            baseline_name=(
                "Slurm's restart of a step in place whose ranks only start Python, import torch "
                "and load the checkpoint (kill -> both ranks done)"
            ),
            goal=Goal("<=", 1.05),
        )  # fmt: skip
        if not kept:
            at_floor.status = "fail"
        figs.append(at_floor)
    else:
        figs.append(skipped(SECTION, FLOOR_NAME, "the physical floor was not measured"))
    return figs
