"""``python -m jobs drill RUN --remote HOST``: the drill of :mod:`jobs.drill`, run HERE.

Nothing long-running on the login node: the loop, its waiting and the report stay on this
machine; the login node only answers short commands, each one ssh round trip with a timeout:

- every Slurm action and query (``sbatch`` of the preempting job, ``scontrol show job``,
  ``scontrol update``, ``scancel``, ``scontrol requeue``, ``release``) through the SSH
  transport of :mod:`cluster.ssh` (``cluster.slurm_client(remote=HOST)``), the spec's
  ``environment.setup`` opening each command line there (it exports ``SLURM_CONF``, say);
- a poll is ONE ssh command (:class:`RemoteRunFiles`): Slurm's ``scontrol show job`` of the
  drilled job (the spec's ``environment.setup`` first, in a subshell) and the new bytes of the
  run's files (``events.jsonl``, ``metrics.jsonl``, ``resolved.yaml``; from the offsets already
  copied, at most :data:`PIECE` each) into a local copy the drill reads as it reads a local run;
  the drill reads that answer instead of asking Slurm again (``Drill.job``);
- a dropped connection is tried again with back-off until the drill's --timeout, and an action
  whose reply was lost is checked before it is sent again (``Drill._reach``, ``Drill._act``);
- the preempting job's script: one ssh command writes it into the run's ``drill/`` there.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import IO

from jobs.drill import DrillError, DrillReport, RunFiles, run_drill
from jobs.errors import RunNotFoundError
from jobs.records import RECORD, RunRecord
from jobs.remote import RemoteRun, learn, setup_prelude
from train.runfiles import DRILL_DIR, EVENTS_FILE, METRICS_FILE, RESOLVED

#: the files a drill reads, copied here a poll at a time
FILES = (EVENTS_FILE, METRICS_FILE, RESOLVED)
#: the most new bytes of one file one poll brings (a long history comes in pieces)
PIECE = 4 << 20
#: seconds one remote read or write may take (a poll is one such command)
READ_TIMEOUT_S = 60.0
_NO_RUN_DIR, _LINK = 95, 96


class RemoteRunFiles(RunFiles):
    """The run's files on the remote host, copied into ``cache``, and Slurm's answer for job
    ``job_id`` (where given): ONE ssh command per poll."""

    def __init__(self, run: RemoteRun, remote_dir: str, cache: Path, job_id: str = "") -> None:
        super().__init__(cache)
        self.run, self.remote_dir, self.job_id = run, remote_dir, job_id
        self.offsets = dict.fromkeys(FILES, 0)
        self._uid: int | None = None
        self._job: dict[str, str] | None = None

    def _slurm_line(self) -> str:
        """``scontrol show job`` as the SSH transport runs it (the folder and the spec's
        ``environment.setup`` first, in a subshell): its status, then its first line."""
        if not self.job_id:
            return "printf '1\\n\\n'; "
        show = f"scontrol show job --oneliner {shlex.quote(self.job_id)}"
        return (
            f"j=$( ({setup_prelude(self.run.remote)}{show}) 2>/dev/null ); r=$?; "
            "printf '%s\\n' \"$r\"; printf '%s\\n' \"$j\" | head -n 1; "
        )

    def _line(self) -> str:
        parts = [
            self._slurm_line(),
            f"cd {shlex.quote(self.remote_dir)} 2>/dev/null || exit {_NO_RUN_DIR}; id -u; ",
        ]
        for name in FILES:
            f = shlex.quote(name)
            parts.append(
                f"if [ -f {f} ] && [ ! -L {f} ]; then s=$(($(wc -c < {f}))); else s=-1; fi; "
                f"o={self.offsets[name]}; if [ $s -lt $o ]; then o=0; fi; n=$((s - o)); "
                f"if [ $n -gt {PIECE} ]; then n={PIECE}; fi; if [ $n -lt 0 ]; then n=0; fi; "
                "printf '%s %s %s\\n' $s $o $n; "
                f"if [ $n -gt 0 ]; then tail -c +$((o + 1)) {f} | head -c $n; fi; "
            )
        return "".join(parts) + "true"

    def refresh(self) -> None:
        self._job = None
        done = self.run.remote.run_line(self._line(), timeout=READ_TIMEOUT_S)
        if done.returncode == _NO_RUN_DIR:
            raise DrillError(f"{self.run.remote.host}: no run directory {self.remote_dir} there")
        data = done.stdout.encode("utf-8", "surrogateescape")
        status, _, data = data.partition(b"\n")
        shown, _, data = data.partition(b"\n")
        if status.strip() == b"0" and shown.strip():  # else: the drill asks Slurm itself
            from cluster import parse_key_values

            self._job = parse_key_values(shown.decode("utf-8", "replace").strip())
        try:
            self._take(data)
        except ValueError:  # a file cut short while it was read: copy it afresh next poll
            self.offsets = dict.fromkeys(FILES, 0)

    def polled_job(self) -> dict[str, str] | None:
        return self._job

    def _take(self, data: bytes) -> None:
        head, _, rest = data.partition(b"\n")
        self._uid = int(head)
        for name in FILES:
            line, _, rest = rest.partition(b"\n")
            size, start, count = (int(w) for w in line.split())
            piece, rest = rest[:count], rest[count:]
            if len(piece) != count:
                raise ValueError(name)
            local = self.dir / name
            if size < 0:
                local.unlink(missing_ok=True)
                self.offsets[name] = 0
                continue
            with local.open("ab" if start else "wb") as out:  # start 0: a fresh copy
                out.write(piece)
            self.offsets[name] = start + count

    def uid(self) -> int:
        if self._uid is None:
            self.refresh()
        return self._uid if self._uid is not None else -1

    def write_script(self, text: str) -> str:
        folder = f"{self.remote_dir}/{DRILL_DIR}"
        script = f"{folder}/preempt.sbatch"
        d, s = shlex.quote(folder), shlex.quote(script)
        line = (
            f"cd {shlex.quote(self.remote_dir)} 2>/dev/null || exit {_NO_RUN_DIR}; "
            f"if [ -L {d} ] || [ -L {s} ]; then exit {_LINK}; fi; "
            f"mkdir -p {d} && printf '%s' {shlex.quote(text)} > {s}"
        )
        done = self.run.remote.run_line(line, timeout=READ_TIMEOUT_S)
        if done.returncode == _LINK:
            raise DrillError(f"cannot write {script}: a link there (refused)")
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise DrillError(f"cannot write {script} on {self.run.remote.host} ({why})")
        return script


def remote_record(run: RemoteRun) -> RunRecord:
    """The run's ``run.json`` on the remote host (one ssh command)."""
    path = f"{run.run_dir}/{RECORD}"
    done = run.remote.run_line(f"cat {shlex.quote(path)}", timeout=READ_TIMEOUT_S)
    try:
        if done.returncode != 0:
            raise ValueError(done.stderr.strip() or f"exit {done.returncode}")
        return RunRecord.from_dict(json.loads(done.stdout))
    except (ValueError, TypeError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RunNotFoundError(
            f"{run.remote.host}: {path}: not a readable run record ({first})"
        ) from None


def drill_remote(
    run: RemoteRun,
    kind: str,
    *,
    timeout_s: float,
    partition: str | None,
    progress: IO[str] | None,
    accept_short_limit: bool,
) -> DrillReport:
    """The drill of ``run`` on its host, its loop here (see the module docstring)."""
    from cluster import slurm_client

    if not run.job_id:
        run = learn(run)  # a run named only by --remote: its directory from the remote status
    record = remote_record(run)
    client = slurm_client(
        remote=run.remote.host, remote_setup=setup_prelude(run.remote), environ=os.environ
    )
    remote_dir = record.tasks[0].run_dir if record.tasks else record.run_dir
    with tempfile.TemporaryDirectory(prefix="slurm-train-drill-") as cache:
        files = RemoteRunFiles(run, remote_dir, Path(cache), record.job_id)
        return run_drill(
            record,
            client,
            kind,
            timeout_s=timeout_s,
            partition=partition,
            progress=progress,
            accept_short_limit=accept_short_limit,
            files=files,
        )
