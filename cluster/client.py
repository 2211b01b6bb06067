"""Typed client over sinfo/scontrol/squeue/sacct/sbatch/scancel.

Every call: an argument list (never a shell), a timeout, machine-readable output, parsing in
:mod:`cluster.parse`. Failures raise :class:`cluster.errors.SlurmCommandError` with the command,
exit code and stderr.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster import parse
from cluster.conf import cluster_name, conf_stamp, find_slurm_conf, with_slurm_bin
from cluster.errors import (
    ClusterError,
    JobWaitTimeoutError,
    SlurmCommandError,
    SlurmNotFoundError,
    SlurmTimeoutError,
)
from cluster.models import ClusterLimits, ClusterState, JobAttempt, JobInfo, Node, Partition

DEFAULT_TIMEOUT_S = 30.0
# sacct/squeue take job ids on the command line; keep each call well under ARG_MAX.
_MAX_IDS_PER_CALL = 5000


# seconds :meth:`SlurmClient.release` waits before it lets a requeued job start (see there)
RELEASE_SETTLE_S = 2.0
_SINFO = ("sinfo", "-h", "-a", "-N", "-o", parse.SINFO_FORMAT)


@dataclass(frozen=True)
class Started:
    """A Slurm command started by :meth:`SlurmClient.start`, to be read by ``finish``."""

    cmd: tuple[str, ...]
    proc: subprocess.Popen[str]
    timeout: float
    deadline: float  # time.monotonic() after which it is killed


#: What Slurm sends a job's processes when it ends or signals the job (every descendant of
#: slurmstepd under proctrack/linuxproc, whatever its session).
JOB_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT")


def _ignore_job_signals() -> None:
    """In a shielded command's child, before exec: ignored dispositions survive the exec."""
    import signal

    for name in JOB_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)


class SlurmClient:
    """Talks to one Slurm cluster.

    ``conf``: the slurm.conf to use (exported as ``SLURM_CONF`` to every command); by default
    :func:`cluster.conf.find_slurm_conf` picks the user's, the system's or a registered one.
    Every command runs with :meth:`env` passed explicitly; ``os.environ`` is never changed.
    """

    def __init__(
        self,
        conf: str | os.PathLike[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
        *,
        shielded: bool = False,
    ) -> None:
        """``shielded``: the commands ignore the signals Slurm sends a job's processes (TERM,
        the requeue signal): a stop's own Slurm commands (the ``scontrol requeue``, then the
        ``ExcNodeList`` of the requeued job) run while Slurm ends the step they run in."""
        base = dict(os.environ if environ is None else environ)
        self.conf = str(conf) if conf is not None else find_slurm_conf(base)
        if self.conf:
            base["SLURM_CONF"] = self.conf
        self._env = with_slurm_bin(base, self.conf)
        self.timeout = timeout
        self.shielded = shielded
        self._prefetched: Started | None = None

    # -- plumbing ----------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment Slurm commands (and submitit) should run with."""
        return dict(self._env)

    def run(
        self,
        cmd: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        cwd: str | os.PathLike[str] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; raise SlurmCommandError on failure when ``check``."""
        started = self.start(cmd, timeout=timeout, cwd=cwd, extra_env=extra_env)
        return self.finish(started, check=check)

    def start(
        self,
        cmd: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | os.PathLike[str] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> Started:
        """Start one Slurm command and return at once; :meth:`finish` reads it. The timeout
        counts from now."""
        exe = shutil.which(cmd[0], path=self._env.get("PATH"))
        if exe is None:
            raise SlurmNotFoundError(cmd[0])
        env = self._env if not extra_env else {**self._env, **extra_env}
        limit = self.timeout if timeout is None else timeout
        proc = subprocess.Popen(
            [exe, *cmd[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
            preexec_fn=_ignore_job_signals if self.shielded else None,
        )
        return Started(tuple(cmd), proc, limit, time.monotonic() + limit)

    def finish(self, started: Started, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Wait for a started command (what is left of its timeout; killed after it)."""
        proc = started.proc
        try:
            out, err = proc.communicate(timeout=max(0.0, started.deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            proc.kill()  # our own child, not reaped yet: its pid cannot be anyone else's
            proc.communicate()
            raise SlurmTimeoutError(started.cmd, started.timeout) from exc
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        done = subprocess.CompletedProcess(list(started.cmd), proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise SlurmCommandError(started.cmd, proc.returncode, err or out)
        return done

    def prefetch_cluster_state(self) -> None:
        """Start :meth:`cluster_state`'s ``sinfo`` now; the next :meth:`cluster_state` reads it.

        ``jobs submit`` calls this before it validates the spec, so the preflight query runs
        beside the validation instead of after it. Nothing starts without Slurm on PATH;
        :meth:`discard_prefetch` ends one that was never read.
        """
        if self._prefetched is None and shutil.which("sinfo", path=self._env.get("PATH")):
            self._prefetched = self.start(_SINFO)

    def discard_prefetch(self) -> None:
        """End a prefetched query nobody read (the spec was refused, say)."""
        started, self._prefetched = self._prefetched, None
        if started is None:
            return
        if started.proc.poll() is None:
            started.proc.kill()  # ours and not reaped: the pid is still this child's
        started.proc.communicate()

    def installed(self) -> bool:
        """Whether the Slurm client commands are on PATH."""
        return all(shutil.which(c, path=self._env.get("PATH")) for c in ("sbatch", "squeue"))

    def ping(self) -> bool:
        """Whether the controller answers (``scontrol ping``)."""
        if not self.installed():
            return False
        try:
            proc = self.run(["scontrol", "ping"], timeout=10, check=False)
        except SlurmCommandError:
            return False
        return proc.returncode == 0 and "UP" in proc.stdout

    # -- cluster shape -----------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        out = self.run(["scontrol", "show", "node", "--oneliner"]).stdout
        return parse.parse_nodes(out)

    def partitions(self) -> list[Partition]:
        nodes = self.nodes()
        out = self.run(["scontrol", "show", "partition", "--oneliner"]).stdout
        return parse.parse_partitions(out, nodes)

    def cluster_state(self) -> ClusterState:
        """Partitions and nodes in ONE command (``sinfo``): what a preflight needs live."""
        started, self._prefetched = self._prefetched, None
        done = self.finish(started) if started is not None else self.run(_SINFO)
        return parse.parse_sinfo(done.stdout)

    def limits(self) -> ClusterLimits:
        """MaxArraySize, MaxJobCount (``scontrol show config``, readable without admin rights).

        They change only when slurm.conf does: callers may cache them on :meth:`conf_stamp`.
        """
        return parse.parse_config_limits(self.run(["scontrol", "show", "config"]).stdout)

    def requeue_settings(self, partition: str) -> tuple[str, str]:
        """(``JobRequeue`` of ``scontrol show config``, ``PreemptMode`` of the partition, the
        cluster's where the partition names none): whether a stopped job can be requeued here.
        Settings of slurm.conf: callers may cache them on :meth:`conf_stamp`."""
        config = parse.parse_config_values(self.run(["scontrol", "show", "config"]).stdout)
        out = self.run(["scontrol", "show", "partition", "--oneliner", partition]).stdout
        first = out.strip().splitlines()[0] if out.strip() else ""
        mode = parse.parse_key_values(first).get("PreemptMode") or config.get("PreemptMode", "")
        return config.get("JobRequeue", ""), mode

    def installed_release(self) -> str | None:
        """The release of the ``scontrol`` this client runs (``scontrol --version``: ``slurm
        24.11.5``, Debian's ``slurm-wlm 24.11.5`` -> ``24.11.5``; the program answers itself
        from slurm.conf, no daemon is asked), or None when it cannot be run or read."""
        try:
            done = self.run(["scontrol", "--version"], timeout=10, check=False)
        except (SlurmCommandError, SlurmNotFoundError):
            return None
        words = done.stdout.split() if done.returncode == 0 else []
        if len(words) != 2 or not words[0].lower().startswith("slurm"):
            return None
        parts = words[1].split(".")
        return words[1] if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else None

    def sbatch_options(self) -> frozenset[str]:
        """The long options the ``sbatch`` this client runs lists in ``sbatch --help`` (its
        release's; see :func:`cluster.parse.parse_sbatch_help`). Callers may cache it per
        cluster (:meth:`conf_stamp`)."""
        return parse.parse_sbatch_help(self.run(["sbatch", "--help"]).stdout)

    def conf_stamp(self) -> str:
        """Identifies the slurm.conf in use as it is now (path, size, mtime)."""
        return conf_stamp(self.conf)

    def cluster_name(self) -> str:
        """The cluster this client talks to (slurm.conf's ClusterName; "" when unknown)."""
        return cluster_name(self.conf)

    def partition(self, name: str) -> Partition | None:
        return next((p for p in self.partitions() if p.name == name), None)

    # -- jobs --------------------------------------------------------------------------------
    def submit(
        self,
        script: str | os.PathLike[str],
        args: Sequence[str] = (),
        *,
        script_args: Sequence[str] = (),
        cwd: str | os.PathLike[str] | None = None,
    ) -> str:
        """``sbatch --parsable [args] script [script_args]``; returns the job id."""
        cmd = ["sbatch", "--parsable", *args, str(Path(script)), *script_args]
        return parse.parse_sbatch_job_id(self.run(cmd, cwd=cwd).stdout)

    def job_states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """States of many jobs in one sacct call (per 5000 ids), squeue when sacct is unusable.

        Keys are job ids as Slurm prints them: ``"12"``, or ``"12_3"`` for array tasks (asking
        for ``"12"`` of an array returns all its tasks).
        """
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        if not ids:
            return {}
        result: dict[str, JobInfo] = {}
        for start in range(0, len(ids), _MAX_IDS_PER_CALL):
            chunk = ids[start : start + _MAX_IDS_PER_CALL]
            try:
                result.update(self._sacct(chunk))
            except SlurmCommandError:
                result.update(self._squeue(chunk))
                continue
            # Accounting lags the controller: a just-submitted job is not in sacct yet, and a
            # requeued job cancelled while pending stays REQUEUED there. For every id that
            # sacct does not show finished, the controller (squeue) has the last word.
            unsettled = [j for j in chunk if not _settled(result, j)]
            if unsettled:
                result.update(self._squeue(unsettled))
        return result

    def poll_states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """States of many jobs for a poller: ONE ``squeue`` for all of them (the controller's
        word, right at once after submit and requeue), and ``sacct`` only for the ids the
        controller has already forgotten (finished more than MinJobAge ago). A job followed
        while it runs costs one command per poll; :meth:`job_states` costs two.
        """
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        result: dict[str, JobInfo] = {}
        for start in range(0, len(ids), _MAX_IDS_PER_CALL):
            chunk = ids[start : start + _MAX_IDS_PER_CALL]
            result.update(self._squeue(chunk))
            gone = [j for j in chunk if not _found(result, j)]
            if gone:
                result.update(self._sacct(gone))
        return result

    def _sacct(self, ids: Sequence[str]) -> dict[str, JobInfo]:
        cmd = [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-o",
            ",".join(parse.SACCT_FIELDS),
            "-j",
            ",".join(ids),
        ]
        return parse.parse_sacct(self.run(cmd).stdout)

    def _squeue(self, ids: Sequence[str]) -> dict[str, JobInfo]:
        cmd = ["squeue", "-h", "--states=all", "-O", parse.SQUEUE_FORMAT, "-j", ",".join(ids)]
        proc = self.run(cmd, check=False)
        if proc.returncode != 0:
            # squeue fails when every id is unknown to the controller (long finished).
            if "Invalid job id" in proc.stderr:
                return {}
            raise SlurmCommandError(cmd, proc.returncode, proc.stderr)
        return parse.parse_squeue(proc.stdout)

    def attempts(self, job_id: str) -> list[JobInfo]:
        """Every run of one job, oldest first (``sacct -D``: a requeued job's earlier attempts,
        each with the state it ended in and its nodes)."""
        fields = ",".join(parse.SACCT_FIELDS)
        out = self.run(["sacct", "-D", "-X", "-n", "-P", "-o", fields, "-j", job_id]).stdout
        runs: list[JobInfo] = []
        for line in out.splitlines():
            runs.extend(parse.parse_sacct(line).values())
        return runs

    def attempt_times(self, job_id: str, sluid: bool = False) -> list[JobAttempt]:
        """Slurm's own Submit/Eligible/Start/End of every run of one job, oldest first (one
        ``sacct -D`` query; the goodput ledger's queued and held time); with ``sluid`` each
        run's SLUID too (a release that has one: 24.11+; older ones refuse the field)."""
        extra = (parse.SACCT_SLUID_FIELD,) if sluid else ()
        fields = ",".join((*parse.SACCT_TIME_FIELDS, *extra))
        out = self.run(["sacct", "-D", "-X", "-n", "-P", "-o", fields, "-j", job_id]).stdout
        return parse.parse_sacct_attempts(out)

    def queue(self, user: str | None = None) -> dict[str, JobInfo]:
        """Jobs the controller knows now (``squeue``), optionally for one user."""
        cmd = ["squeue", "-h", "-O", parse.SQUEUE_FORMAT]
        if user:
            cmd += ["-u", user]
        return parse.parse_squeue(self.run(cmd).stdout)

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (Restarts, EndTime, PreemptTime, Reason, ...)."""
        out = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)]).stdout
        first = out.strip().splitlines()[0] if out.strip() else ""
        return parse.parse_key_values(first)

    def cancel(
        self, job_ids: Iterable[str], signal: str | None = None, *, no_requeue: bool = False
    ) -> None:
        """``scancel`` the jobs (or send them ``signal``).

        ``no_requeue``: first make them non-requeueable. scancel's SIGTERM reaches a trainer
        that may checkpoint and ``scontrol requeue`` (Slurm accepts a requeue of a cancelled
        batch job); a job that is not requeueable stays cancelled. A finished job refuses the
        update, which is fine.
        """
        ids = [str(j) for j in job_ids]
        if not ids:
            return
        if no_requeue:
            for job_id in ids:
                self.run(["scontrol", "update", f"JobId={job_id}", "Requeue=0"], check=False)
        cmd = ["scancel", *(["--signal", signal] if signal else []), *ids]
        self.run(cmd)

    def set_dependency(self, job_id: str, dependency: str) -> None:
        """``scontrol update JobId=ID Dependency=...`` of a pending job."""
        self.run(["scontrol", "update", f"JobId={job_id}", f"Dependency={dependency}"])

    def forbid_requeue(self, job_id: str) -> None:
        """``scontrol update JobId=ID Requeue=0``: the job ends as it exits, never requeued by
        Slurm (26.05 requeues a job of ``--requeue=expedite`` that exits non-zero, held)."""
        self.run(["scontrol", "update", f"JobId={job_id}", "Requeue=0"])

    def requeue(self, job_id: str) -> None:
        """Put a running (or finished) batch job back in the queue with the same id.

        Asked from inside the job itself (a rank, a node's watcher), ``scontrol`` is one of the
        processes the requeue ends: killed by the requeue's SIGTERM before it exits, it has had
        its answer from Slurm (the request is what sent the signal), so that is success.
        """
        try:
            self.run(["scontrol", "requeue", str(job_id)])
        except SlurmCommandError as exc:
            if exc.returncode != -signal.SIGTERM or isinstance(exc, SlurmTimeoutError):
                raise

    def exclude_nodes(self, job_id: str, nodes: Iterable[str]) -> list[str]:
        """Keep a pending (e.g. just requeued) job off ``nodes`` as well as the nodes it already
        excludes (``scontrol update JobId=ID ExcNodeList=...``); returns the whole list.

        Slurm accepts this only while the job is pending ("Job is no longer pending execution"
        otherwise): requeue first.
        """
        from cluster.hostlist import expand_hostlist

        current = self.show_job(job_id).get("ExcNodeList", "")
        have = expand_hostlist(current) if current and current != "(null)" else []
        merged = sorted({*have, *nodes})
        self.run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(merged)}"])
        return merged

    def set_time_limit(self, job_id: str, limit: str) -> None:
        """``scontrol update JobId=ID TimeLimit=LIMIT`` (Slurm time syntax, e.g. ``3`` minutes).

        Any user may lower their own job's limit; raising it needs an operator (Slurm refuses).
        """
        self.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={limit}"])

    def may_raise_time_limits(self) -> bool:
        """Whether this user may raise a job's time limit: Slurm lets only root, SlurmUser and
        accounting operators and administrators (``scontrol show config``, then
        ``sacctmgr show user``). False when it cannot be told."""
        import pwd

        uid = os.geteuid()
        if uid == 0:
            return True
        try:
            if parse.parse_slurm_user_uid(self.run(["scontrol", "show", "config"]).stdout) == uid:
                return True
            name = pwd.getpwuid(uid).pw_name
            cmd = ["sacctmgr", "-n", "-P", "show", "user", name, "format=AdminLevel"]
            level = parse.parse_admin_level(self.run(cmd).stdout)
        except (ClusterError, KeyError):
            return False
        return level in ("Operator", "Administrator")

    def release(self, job_id: str, settle_s: float = RELEASE_SETTLE_S) -> None:
        """Let a requeued job start now instead of after its BeginTime delay.

        Waits ``settle_s`` first: a job started again within the second of its requeue, on a
        node it just left, is killed by slurmctld ("Killing non-startable batch JobId=N: Job
        credential revoked") and ends FAILED: seen on the local cluster with a release right
        after a requeue (`jobs drill` and the tests do exactly that). Slurm's own BeginTime hold
        is what normally keeps this from happening.
        """
        if settle_s > 0:
            time.sleep(settle_s)
        cmd = ["scontrol", "update", f"JobId={job_id}", "StartTime=now"]
        done = self.run(cmd, check=False)
        if done.returncode == 0:
            return
        # Refused: a job that started meanwhile (an expedited requeue, 25.11+, starts at once)
        # had nothing to release; one that still waits is an error.
        state = self.show_job(job_id).get("JobState", "")
        if state in ("", "PENDING") or state.startswith("REQUEUE"):
            raise SlurmCommandError(cmd, done.returncode, done.stderr or done.stdout)

    def wait_for(
        self,
        job_id: str,
        until: Callable[[JobInfo], bool] = lambda j: j.terminal,
        *,
        timeout: float = 300.0,
        poll: float = 1.0,
    ) -> JobInfo:
        """Poll one job until ``until(info)`` holds; raise JobWaitTimeoutError after ``timeout``.

        Returns the last :class:`JobInfo` seen. Meant for tests, scripts and ``--follow``.
        """
        deadline = time.monotonic() + timeout
        last: JobInfo | None = None
        while True:
            last = self.job_states([job_id]).get(str(job_id), last)
            if last is not None and until(last):
                return last
            if time.monotonic() >= deadline:
                state = last.state if last else "unknown to Slurm"
                raise JobWaitTimeoutError(str(job_id), state, timeout)
            time.sleep(poll)


_MAYBE_REQUEUED = frozenset({"NODE_FAIL", "PREEMPTED"})


def _settled(result: Mapping[str, JobInfo], job_id: str) -> bool:
    """Whether sacct reported ``job_id`` (or all its array tasks) in a terminal state."""
    prefix = f"{job_id}_"
    found = [info for key, info in result.items() if key == job_id or key.startswith(prefix)]
    # A record without a partition is slurmdbd's placeholder, made when step records arrive
    # before the job's own (name "allocation", wrong node list): not settled either. Nor are
    # NODE_FAIL and PREEMPTED: Slurm requeues a job that allows it, and sacct shows the old
    # attempt's record for a while (seen: PREEMPTED for 3 s, NODE_FAIL until the next start):
    # the controller says whether it is pending again.
    return bool(found) and all(
        info.terminal and info.partition and info.state not in _MAYBE_REQUEUED for info in found
    )


def _found(result: Mapping[str, JobInfo], job_id: str) -> bool:
    """Whether ``job_id`` (or any task of the array ``job_id``) is in ``result``."""
    prefix = f"{job_id}_"
    return any(key == job_id or key.startswith(prefix) for key in result)
