"""Helpers for the bring-your-own-code integration tests (tests/integration/test_byo_*.py).

Everything goes through the real clients: ``python -m jobs`` as a subprocess, the local Slurm
cluster through :class:`cluster.client.SlurmClient`. Every job a test submits is cancelled at the
end (made non-requeueable first, so no supervisor brings it back).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from cluster.hostlist import expand_hostlist
from cluster.models import TERMINAL_STATES
from train.history import RunHistory, read_jsonl

REPO = Path(__file__).resolve().parents[2]


def environ(pid: int) -> dict[str, str]:
    """A process's environment (empty when it is gone or not ours to read): the nodes of the
    local cluster share this host, so a job's processes are found by their SLURM_* variables."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


class ByoRun:
    """One submitted spec: its job id, run directory and what it wrote."""

    def __init__(self, env: dict[str, str], client: Any, tmp: Path) -> None:
        self.env = env
        self.client = client
        self.tmp = tmp
        self.job_id = ""
        self.run_dir = Path()
        self.others: list[str] = []

    # -- jobs ------------------------------------------------------------------------------------
    def jobs(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jobs", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def submit(self, spec: dict[str, Any], *extra: str) -> None:
        path = self.tmp / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        proc = self.jobs("submit", str(path), "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        self.job_id, self.run_dir = str(data["job_id"]), Path(data["run_dir"])

    def status(self) -> dict[str, Any]:
        proc = self.jobs("status", self.job_id, "--json")
        assert proc.returncode == 0, proc.stderr
        task: dict[str, Any] = json.loads(proc.stdout)["tasks"][0]
        return task

    # -- what the run wrote ----------------------------------------------------------------------
    def progress(self) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir / "progress.jsonl")

    def events(self) -> list[dict[str, Any]]:
        return RunHistory(self.run_dir).events()

    def attempt_dir(self, ranks: Sequence[int] = (), timeout: float = 120.0) -> Path:
        """The progress folder of the job's newest attempt (``JOB-R``, ``JOB-R.N`` for the N-th
        restart in place): the one whose ``rank-R.json`` names the processes running now. Waits
        (up to ``timeout``) for it and for the ``rank-R.json`` of each of ``ranks``: a command's
        supervisor writes its rank's once its set-up is done, and that set-up waits behind the
        command's own start (issue 46: train.command.prestart.wait_behind)."""

        def key(path: Path) -> tuple[int, int]:
            restart, _, in_place = path.name.rsplit("-", 1)[1].partition(".")
            return int(restart), int(in_place or 0)

        deadline = time.monotonic() + timeout
        while True:
            attempts = sorted((self.run_dir / ".progress").glob(f"{self.job_id}-*"), key=key)
            if attempts and all((attempts[-1] / f"rank-{r}.json").exists() for r in ranks):
                return attempts[-1]
            if time.monotonic() > deadline:
                assert attempts, f"no attempt of job {self.job_id} under {self.run_dir}/.progress"
                raise AssertionError(f"no rank-R.json of ranks {list(ranks)} in {attempts[-1]}")
            time.sleep(0.2)

    def steps_done(self) -> int:
        return max((int(p["step"]) for p in self.progress() if "step" in p), default=0)

    def log(self, tail: int = 4000) -> str:
        """The per-rank logs (the last ``tail`` characters of each; 0: all of them)."""
        out = []
        for path in sorted((self.run_dir / "slurm").glob("*_log.out")):
            text = path.read_text(errors="replace")
            out.append(f"== {path.name}\n{text[-tail:] if tail else text}")
        return "\n".join(out)

    def wait(self, what: str, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}; events {self.events()}\n{self.log()}"
                )
            time.sleep(1.0)

    def state(self) -> str:
        info = self.client.job_states([self.job_id]).get(self.job_id)
        return info.state if info is not None else "UNKNOWN"

    # -- interruptions ---------------------------------------------------------------------------
    def preempt(self) -> str:
        """A real preemption: a job in partition `urgent` that needs all of one of our nodes."""
        info = self.client.show_job(self.job_id)
        node = expand_hostlist(info["NodeList"])[0]
        script = self.tmp / "urgent.sbatch"
        script.write_text("#!/bin/bash\nsleep 1\n")
        urgent = str(
            self.client.submit(
                script,
                [
                    "--partition=urgent",
                    f"--nodelist={node}",
                    "--exclusive",
                    "--time=1",
                    "--job-name=byo-urgent",
                    "--output=/dev/null",
                ],
            )
        )
        self.others.append(urgent)
        return urgent

    def release_when_requeued(self, timeout: float = 180) -> None:
        """A requeued job waits ~2 minutes (BeginTime): let it start now. An expedited requeue
        (26.05 here: ``--requeue=expedite``) is back at once, with nothing to release."""
        self.wait("the job to be requeued", lambda: requeued(self.client, self.job_id), timeout)
        if self.client.show_job(self.job_id).get("JobState") == "PENDING":
            self.client.release(self.job_id)  # waits for the requeue to settle (Slurm's race)

    def wait_final(self, timeout: float = 400) -> str:
        final = TERMINAL_STATES
        self.wait("a final state", lambda: self.state() in final, timeout)
        time.sleep(2)  # sacct may lag a requeue for a moment: confirm
        self.wait("a final state", lambda: self.state() in final, 30)
        return self.state()

    def cleanup(self) -> None:
        ids = [j for j in (self.job_id, *self.others) if j]
        if ids:
            self.client.cancel(ids, no_requeue=True)


#: States of a requeued job (Restarts > 0): held (PENDING: BeginTime), or back already (an
#: expedited requeue, 25.11+: EXPEDITING, then RUNNING within seconds, never held).
_REQUEUED_STATES = frozenset({"PENDING", "EXPEDITING", "RUNNING", *TERMINAL_STATES})


def requeued(client: Any, job_id: str) -> bool:
    """``job_id`` was requeued and is held, or back already where the requeue was expedited."""
    info = client.show_job(job_id)
    restarts = info.get("Restarts", "0")
    return restarts.isdigit() and int(restarts) > 0 and info.get("JobState") in _REQUEUED_STATES


def open_run(slurm_env: dict[str, str], slurm_client: Any, tmp: Path) -> Iterator[ByoRun]:
    """The body of each byo test module's ``run`` fixture: a private state and runs folder, and
    every job the test submitted cancelled at the end."""
    env = dict(slurm_env)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp / "state")
    env["SLURM_TRAIN_RUNS_DIR"] = str(tmp / "runs")
    r = ByoRun(env, slurm_client, tmp)
    try:
        yield r
    finally:
        r.cleanup()
