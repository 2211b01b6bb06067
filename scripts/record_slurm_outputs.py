#!/usr/bin/env python3
"""Record what a live local cluster of one Slurm release prints for the commands this project
parses, with the exact flags ``cluster/client.py`` uses, as unit-test data.

    .venv/bin/python scripts/record_slurm_outputs.py --slurm 24.11

brings that release's own local cluster up (``python -m cluster up --slurm 24.11``: its state
dir and ports; 22.05's in /var/tmp/slurm-train-record, not the default one), submits a few small
jobs whose ends are known (completed, failed, cancelled, requeued once then completed, running,
held, a held array, GPU requests each way, a job that requeues itself in its preemption's
grace time, a node failure's requeue with and without ``--requeue=expedite`` where the release
has it) and writes
``tests/unit/cluster/data/<release>/``: one file per command, and ``jobs.json`` (which job is
which, and the state each must parse to). ``tests/unit/cluster/test_releases.py`` parses every
release's recordings. Run it again after a parser changes the flags it asks for.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cluster import client, parse  # noqa: E402
from cluster.local.manager import LocalCluster  # noqa: E402
from cluster.local.paths import state_dir  # noqa: E402
from cluster.local.release import RELEASES, release  # noqa: E402

DATA = REPO / "tests" / "unit" / "cluster" / "data"
#: The host release's recording cluster (the other releases record on their own cluster).
HOST_RECORD_DIR = Path("/var/tmp/slurm-train-record")
HOST_RECORD_OFFSET = 190


class Recorder:
    def __init__(self, env: dict[str, str], out: Path, work: Path) -> None:
        self.env, self.out, self.work = env, out, work

    def run(self, cmd: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            cmd, env=self.env, cwd=self.work, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def save(self, name: str, cmd: list[str]) -> str:
        proc = self.run(cmd)
        (self.out / name).write_text(proc.stdout)
        return proc.stdout

    def sbatch(self, *args: str) -> str:
        out = self.run(["sbatch", "--parsable", "-o", f"{self.work}/%j.out", *args]).stdout
        return parse.parse_sbatch_job_id(out)

    def resume(self, node: str, timeout: float = 30.0) -> None:
        """Bring a node set down back: Slurm refuses the resume until the down is done, and
        a node whose slurmd answers may come back by itself (ReturnToService=2)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.5)
            self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
            state = self.run(["sinfo", "-h", "-n", node, "-o", "%T"], check=False).stdout
            if state.strip() and not state.strip().startswith(("down", "drain")):
                return
        raise SystemExit(f"node {node} could not be resumed within {timeout:g}s")

    def state(self, job_id: str) -> str:
        out = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
        return out or "GONE"

    def wait(self, job_id: str, states: set[str], timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in states:
                return state
            time.sleep(0.3)
        raise SystemExit(f"job {job_id} not {states} after {timeout:g}s (last: {state})")


def gpu_probe(rec: Recorder) -> dict[str, object]:
    """How each way of asking for GPUs fares: accepted or refused (sbatch's exit code), and
    the GPU variables each task of an inner ``srun`` sees."""
    grep = r'env | grep -E "^(SLURM_[A-Z_]*(GPU|GRES|TRES)[A-Z_]*|CUDA_VISIBLE_DEVICES)=" | sort'
    show = f'srun sh -c \'echo $SLURM_PROCID $({grep} | tr "\\n" " ")\''
    asks = {
        "gres_per_node": ["-N2", "--ntasks-per-node=2", "--gres=gpu:2"],
        "gpus_per_node": ["-N2", "--ntasks-per-node=2", "--gpus-per-node=2"],
        "gpus_per_task": ["-N2", "--ntasks-per-node=2", "--gpus-per-task=1"],
    }
    out: dict[str, object] = {}
    for name, args in asks.items():
        proc = rec.run(["sbatch", "--parsable", "-o", f"{rec.work}/%j.out", *args, "--wrap",
                        show], check=False)  # fmt: skip
        if proc.returncode != 0:
            out[name] = {"accepted": False, "sbatch_exit": proc.returncode}
            continue
        job_id = parse.parse_sbatch_job_id(proc.stdout)
        rec.wait(job_id, {"GONE", "COMPLETED", "FAILED"})
        time.sleep(0.5)
        lines = sorted((rec.work / f"{job_id}.out").read_text().splitlines())
        out[name] = {"accepted": True, "tasks": lines}
    return out


GRACE_JOB = """\
#!/bin/bash
# on the preemption's signal: {what}
trap '{trap}' USR2
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then sleep 3; exit 0; fi
sleep 100 & wait
"""
#: asks for its own requeue when the preemption's signal comes (what train's stop path does)
REQUEUE_IN_GRACE = GRACE_JOB.format(
    what="scontrol requeue, then exit", trap='scontrol requeue "$SLURM_JOB_ID"; exit 0'
)
#: only exits when the preemption's signal comes (leaves the requeue to Slurm)
EXIT_IN_GRACE = GRACE_JOB.format(what="exit 0", trap="exit 0")


def requeue_in_grace(rec: Recorder, text: str = REQUEUE_IN_GRACE) -> str:
    """A job in ``debug`` preempted by an ``urgent`` one does ``text``'s trap within its grace
    time, is released whenever it waits, and runs to its end: how many runs does accounting
    show? (A self-requeue: 24.11.5's preemption requeues the next run too, which ends
    PREEMPTED; 22.05 and 26.05 requeue once. Only exiting: 22.05 ends COMPLETED, never
    requeued; 24.11 and 26.05 requeue it themselves.)"""
    script = rec.work / "grace.sh"
    script.write_text(text)
    job_id = rec.sbatch("--requeue", "--signal=B:USR2@60", "-w", "n1", str(script))
    rec.wait(job_id, {"RUNNING"})
    time.sleep(1)
    rec.sbatch("-p", "urgent", "-w", "n1", "-c", "2", "--wrap", "sleep 2")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = rec.state(job_id)
        if state == "GONE":
            break
        if state == "PENDING":
            time.sleep(client.RELEASE_SETTLE_S + 1)
            rec.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
        time.sleep(0.5)
    return job_id


def expedited_requeue(rec: Recorder) -> dict[str, object]:
    """25.11+: a ``--requeue=expedite`` job whose node fails comes back at once (state
    EXPEDITING, then RUNNING) where a plain ``--requeue`` one waits as PENDING (BeginTime).
    Saves squeue's line of the job while it is EXPEDITING and sacct's runs afterwards."""
    cmd = ["squeue", "-h", "--states=all", "-O", parse.SQUEUE_FORMAT, "-j"]
    seen: dict[str, object] = {}
    for mode in ("expedite", "plain"):
        flag = "--requeue=expedite" if mode == "expedite" else "--requeue"
        job_id = rec.sbatch(flag, "-w", "n2", "--wrap", "sleep 120")
        rec.wait(job_id, {"RUNNING"})
        start = time.monotonic()
        rec.run(["scontrol", "update", "nodename=n2", "state=down", "reason=recorded"])
        rec.resume("n2")
        states: list[str] = []
        while time.monotonic() - start < 20:
            line = rec.run([*cmd, job_id]).stdout
            state = line.split("|")[2] if line.count("|") > 2 else "GONE"
            if state == "EXPEDITING" and not (rec.out / "squeue_expediting.txt").exists():
                (rec.out / "squeue_expediting.txt").write_text(line)
            if not states or states[-1] != state:
                states.append(state)
            if state == "RUNNING" and len(states) > 1:
                break
            time.sleep(0.3)
        seen[mode] = {"states": states, "running_again_s": round(time.monotonic() - start)
                      if states[-1] == "RUNNING" else None}  # fmt: skip
        rec.run(["scancel", job_id])
        rec.wait(job_id, {"GONE", "CANCELLED"})
    return seen


def record(rel: str) -> Path:
    r = release(rel)
    if r.on_host:  # a cluster of its own, not the default one `make demo` uses
        lc = LocalCluster(HOST_RECORD_DIR, slurm=rel, port_offset=HOST_RECORD_OFFSET)
    else:
        lc = LocalCluster(r.default_state_dir(state_dir()), slurm=rel, port_offset=r.port_offset)
    lc.up()
    out = DATA / rel
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="slurm-record-") as tmp:
        rec = Recorder(lc.client_environ(), out, Path(tmp))
        version = rec.run(["scontrol", "version"]).stdout.strip()
        jobs: dict[str, dict[str, str]] = {}

        def job(role: str, state: str, job_id: str) -> str:
            jobs[role] = {"id": job_id, "state": state}
            return job_id

        job("completed", "COMPLETED", rec.sbatch("--wrap", "true"))
        job("failed", "FAILED", rec.sbatch("--wrap", "exit 3"))
        cancelled = job("cancelled", "CANCELLED", rec.sbatch("--hold", "--wrap", "true"))
        rec.run(["scancel", cancelled])
        # requeued once while running, released, then completed: two runs in sacct -D
        requeued = job("requeued", "COMPLETED", rec.sbatch("--requeue", "--wrap", "sleep 4"))
        rec.wait(requeued, {"RUNNING"})
        rec.run(["scontrol", "requeue", requeued])
        rec.wait(requeued, {"PENDING"})
        time.sleep(client.RELEASE_SETTLE_S)
        rec.run(["scontrol", "update", f"JobId={requeued}", "StartTime=now"])
        running = job("running", "RUNNING", rec.sbatch("-w", "n3", "--wrap", "sleep 300"))
        held = job("held", "PENDING", rec.sbatch("--hold", "--wrap", "true"))
        array = job("array", "PENDING", rec.sbatch("--hold", "--array=0-2", "--wrap", "true"))
        rec.wait(running, {"RUNNING"})
        rec.wait(requeued, {"GONE", "COMPLETED"}, timeout=120)
        for role in ("completed", "failed"):
            rec.wait(jobs[role]["id"], {"GONE", "COMPLETED", "FAILED"})
        gpus = gpu_probe(rec)
        help_text = rec.run(["sbatch", "--help"]).stdout
        expedite = expedited_requeue(rec) if "--requeue[=expedite]" in help_text else None
        grace = job("requeue_in_grace", "COMPLETED", requeue_in_grace(rec))
        exit_grace = job("exit_in_grace", "COMPLETED", requeue_in_grace(rec, EXIT_IN_GRACE))
        time.sleep(3)  # accounting lags the controller a moment
        ids = [j["id"] for j in jobs.values()]
        rec.save("sinfo.txt", list(client._SINFO))
        rec.save("scontrol_nodes.txt", ["scontrol", "show", "node", "--oneliner"])
        rec.save("scontrol_partitions.txt", ["scontrol", "show", "partition", "--oneliner"])
        rec.save("scontrol_config.txt", ["scontrol", "show", "config"])
        rec.save("scontrol_job.txt", ["scontrol", "show", "job", "--oneliner", requeued])
        rec.save(
            "squeue.txt",
            ["squeue", "-h", "--states=all", "-O", parse.SQUEUE_FORMAT, "-j", ",".join(ids)],
        )
        sacct = ",".join(parse.SACCT_FIELDS)
        rec.save("sacct.txt", ["sacct", "-X", "-n", "-P", "-o", sacct, "-j", ",".join(ids)])
        rec.save("sacct_runs.txt", ["sacct", "-D", "-X", "-n", "-P", "-o", sacct, "-j", requeued])
        rec.save("sacct_requeue_in_grace.txt", ["sacct", "-D", "-X", "-n", "-P", "-o", sacct,
                                                "-j", grace])  # fmt: skip
        rec.save("sacct_exit_in_grace.txt", ["sacct", "-D", "-X", "-n", "-P", "-o", sacct,
                                             "-j", exit_grace])  # fmt: skip
        times = ",".join(parse.SACCT_TIME_FIELDS)
        rec.save("sacct_attempts.txt", ["sacct", "-D", "-X", "-n", "-P", "-o", times, "-j",
                                        requeued])  # fmt: skip
        rec.save("sbatch_help.txt", ["sbatch", "--help"])
        if "SLUID" in rec.run(["sacct", "--helpformat"]).stdout.split():
            # 25.11+: one SLUID per run of a requeued job (what a ledger may key attempts by)
            rec.save("sacct_sluid.txt", ["sacct", "-D", "-X", "-n", "-P", "-o",
                                         "JobID,SLUID,State", "-j", requeued])  # fmt: skip
        rec.run(["scancel", running, held, array])
        manifest = {"version": version, "jobs": jobs, "gpus": gpus, "expedite": expedite}
        (out / "jobs.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slurm", choices=list(RELEASES), required=True)
    args = p.parse_args(argv)
    print(f"recorded: {record(args.slurm)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
