"""``python -m jobs.localrun RUN_DIR``: run a recorded job on this machine without Slurm.

A detached supervisor (started by ``jobs submit --executor local``) runs each task's ranks as
``python -m train --config RESOLVED --run-dir DIR`` with torchrun-style variables (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), at most
``max_parallel`` tasks at once, logs named like Slurm's (``slurm/JOB_RANK_log.out``), and keeps
``RUN_DIR/local_state.json`` with Slurm-style states so ``status``/``follow`` read it like sacct.
SIGTERM cancels (forwarded to every rank).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

from jobs.records import RunRecord, load_record
from train.env import DistEnv

STATE_FILE = "local_state.json"


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def read_state(run_dir: str | Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(run_dir) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Supervisor:
    """Starts, watches and (on SIGTERM) stops the ranks of every task."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.job_id = f"local-{os.getpid()}"
        self.cancelled = False
        self.running: dict[int, list[subprocess.Popen[bytes]]] = {}
        self.logs: list[IO[bytes]] = []
        self.state: dict[str, Any] = {"pid": os.getpid(), "job_id": self.job_id, "tasks": {}}
        for t in record.tasks:
            self.state["tasks"][self.task_id(t.index)] = {"state": "PENDING", "exit_codes": []}

    def task_id(self, index: int) -> str:
        return self.job_id if self.record.array_size is None else f"{self.job_id}_{index}"

    def save(self) -> None:
        path = Path(self.record.run_dir) / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.tmp")
        tmp.write_text(json.dumps(self.state, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)

    def cancel(self, signum: int, frame: FrameType | None) -> None:
        self.cancelled = True
        for procs in self.running.values():
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)

    def start(self, index: int) -> None:
        task = next(t for t in self.record.tasks if t.index == index)
        world = self.record.world_size
        port = free_port()
        procs = []
        for rank in range(world):
            env = dict(os.environ)
            # The torchrun variables, written the one way train writes them (torch-free).
            DistEnv(
                rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                master_port=port,
            ).export(env)  # fmt: skip
            env["SLURM_TRAIN_RUN_DIR"] = task.run_dir
            log = self.record.log_file(self.task_id(index), rank).open("ab")
            self.logs.append(log)
            cmd = [
                sys.executable,
                "-u",
                "-m",
                "train",
                "--config",
                str(Path(task.run_dir) / "resolved.yaml"),
                "--run-dir",
                task.run_dir,
            ]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        self.running[index] = procs
        self.state["tasks"][self.task_id(index)]["state"] = "RUNNING"
        self.save()

    def reap(self) -> None:
        for index, procs in list(self.running.items()):
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                # Like srun --kill-on-bad-exit: one failed rank ends the task.
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                codes = [p.wait() for p in procs]
            if all(c is not None for c in codes):
                ok = all(c == 0 for c in codes)
                state = "CANCELLED" if self.cancelled else ("COMPLETED" if ok else "FAILED")
                entry = self.state["tasks"][self.task_id(index)]
                entry.update(state=state, exit_codes=codes, end=time.time())
                del self.running[index]
                self.save()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.cancel)
        signal.signal(signal.SIGINT, self.cancel)
        pending = [t.index for t in self.record.tasks]
        self.save()
        while pending or self.running:
            while pending and len(self.running) < max(1, self.record.max_parallel):
                if self.cancelled:
                    break
                self.start(pending.pop(0))
            if self.cancelled and pending:
                for index in pending:
                    self.state["tasks"][self.task_id(index)]["state"] = "CANCELLED"
                pending.clear()
                self.save()
            self.reap()
            time.sleep(0.2)
        for log in self.logs:
            log.close()
        states = [t["state"] for t in self.state["tasks"].values()]
        return 0 if all(s == "COMPLETED" for s in states) else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m jobs.localrun RUN_DIR", file=sys.stderr)
        return 2
    return Supervisor(load_record(args[0])).run()


if __name__ == "__main__":
    raise SystemExit(main())
